"""Orders a measured scenario's latency points must keep (issue 47, the third round: a
dataset whose p50 was above its p90 and p99, or whose TTFT was above its end-to-end latency
at one level, was compared with predictions as measured).

At one concurrency level, of one latency (seconds):

* the percentiles run median <= p90 <= p99 (any distribution's quantiles do);
* TTFT is at most E2E at each statistic: every request's first token comes before its end,
  so each quantile and the mean of the TTFTs are at most those of the E2E latencies.

A level may carry several points of one metric and statistic (a probe's runs): a pair is
refused only when every value of the one that should be larger lies below every value of
the other, by more than SLACK (the rounding of a published figure).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

SLACK = 0.01
"""Relative slack of each comparison: published figures are rounded to two or three digits."""

ORDERED_STATISTICS = ("median", "p90", "p99")
"""The percentiles a point can quote, smallest first."""

LATENCIES_IN_SECONDS = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
"""The latency metrics whose percentiles are checked (a rate's are left alone: a source
may quote its slowest percentile as 'p99')."""


class Point(Protocol):
    concurrency: int
    metric: str
    statistic: str
    value: float


def check_point_order(scenario: str, points: Iterable[Point]) -> None:
    """A ValueError naming ``scenario``, the level, the metrics and the values when two of
    its latency points at one level contradict an order above."""
    values: dict[tuple[int, str, str], list[float]] = {}
    for p in points:
        values.setdefault((p.concurrency, p.metric, p.statistic), []).append(p.value)

    def below(small: tuple[int, str, str], large: tuple[int, str, str]) -> bool:
        """Every value of ``large`` lies below every value of ``small``."""
        if small not in values or large not in values:
            return False
        return max(values[large]) * (1 + SLACK) < min(values[small])

    for c in sorted({key[0] for key in values}):
        for metric in LATENCIES_IN_SECONDS:
            present = [s for s in ORDERED_STATISTICS if (c, metric, s) in values]
            for i, low in enumerate(present):
                for high in present[i + 1 :]:
                    if below((c, metric, low), (c, metric, high)):
                        raise ValueError(
                            f"scenario '{scenario}', concurrency {c}: {metric} {high} "
                            f"({_shown(values[(c, metric, high)])}) is below its {low} "
                            f"({_shown(values[(c, metric, low)])}): percentiles run "
                            "median <= p90 <= p99"
                        )
        for statistic in ("mean", *ORDERED_STATISTICS):
            if below((c, "ttft_s", statistic), (c, "e2e_s", statistic)):
                raise ValueError(
                    f"scenario '{scenario}', concurrency {c}: ttft_s {statistic} "
                    f"({_shown(values[(c, 'ttft_s', statistic)])} s) is above e2e_s "
                    f"{statistic} ({_shown(values[(c, 'e2e_s', statistic)])} s): a request's "
                    "first token comes before its end"
                )


def _shown(values: list[float]) -> str:
    return ", ".join(f"{v:.6g}" for v in values)
