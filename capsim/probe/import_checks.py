"""Cross-checks of an imported benchmark result: its aggregates against its per-request
lists and against each other (issue 47, the third round: an output throughput of 1e9 tok/s
beside per-request lists and a duration that give 80, a mean TTFT of 1e6 ms where every
request's TTFT was under 0.15 s, a duration of 1e-9 s were imported as measured).

vllm bench serve computes its aggregates from the same requests it lists
(benchmarks/serve.py, ``calculate_metrics``): ``output_throughput = total_output_tokens /
duration``, ``request_throughput = completed / duration``, ``total_token_throughput =
(total_input_tokens + total_output_tokens) / duration``, ``mean_ttft_ms`` the mean of the
successful requests' ``ttfts`` (seconds) x 1000, ``mean_itl_ms`` the mean of their
``itls`` x 1000, ``mean_e2el_ms`` the mean of their latencies (the TTFT plus the gaps after
it) x 1000; ``duration`` spans every request. An aggregate is refused, naming it and what it
contradicts, when it lies off the figure recomputed by more than TOLERANCE of the larger
plus a small absolute slack (one token or request over the run, one millisecond).
"""

from __future__ import annotations

import math
from typing import Any

TOLERANCE = 0.05
"""Relative disagreement allowed between a stated aggregate and the one recomputed from
the same result (vllm bench writes them unrounded: they agree to a part in 10^12)."""

SLACK_MS = 1.0
"""Absolute slack of a latency comparison, milliseconds."""


def _agree(stated: float, computed: float, slack: float) -> bool:
    return abs(stated - computed) <= TOLERANCE * max(abs(stated), abs(computed)) + slack


def _refuse(field: str, stated: float, unit: str, against: str, computed: float) -> None:
    raise ValueError(
        f"{field} is {stated:.6g}{unit}, but {against} gives {computed:.6g}{unit}: they must "
        f"agree within {TOLERANCE:.0%}"
    )


def _number(value: Any) -> float | None:
    """``value`` as a float where it is a finite number (a bool is none), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def check_vllm_bench_aggregates(d: dict, completed: int, failed: int) -> None:
    """A ValueError naming the fields when a vllm bench result's aggregates contradict its
    totals, its duration or its per-request lists (``ttfts``, ``itls`` in seconds,
    ``output_lens``, ``errors``); ``completed`` and ``failed`` are its request counts."""
    duration = float(d["duration"])
    total_out = float(d["total_output_tokens"])
    total_in = _number(d.get("total_input_tokens"))
    if duration > 0:
        rates = [
            ("output_throughput", total_out, "total_output_tokens / duration", " tok/s"),
            ("request_throughput", completed, "completed / duration", " req/s"),
        ]
        if total_in is not None:
            rates.append(
                (
                    "total_token_throughput",
                    total_in + total_out,
                    "(total_input_tokens + total_output_tokens) / duration",
                    " tok/s",
                )
            )
        for field, amount, against, unit in rates:
            stated = _number(d.get(field))
            # one token or request over the run: a rounding of the total
            if stated is not None and not _agree(stated, amount / duration, 1 / duration):
                _refuse(
                    field,
                    stated,
                    unit,
                    f"{against} ({amount:.6g} / {duration:.6g} s)",
                    amount / duration,
                )
    outs = d.get("output_lens") or []
    if outs and _times(outs):
        _check_sum("total_output_tokens", total_out, "the sum of output_lens", outs)
    ok = _succeeded(d, failed)
    ttfts = d.get("ttfts") or []
    if ok is None or not ttfts or not any(ok) or not _times(ttfts):
        return  # a time that is no time: its record says what is wrong with it
    ttft_ok = [float(t) for t, good in zip(ttfts, ok, strict=False) if good]
    _check_mean("mean_ttft_ms", d, ttft_ok, "the successful requests' ttfts")
    itls = d.get("itls") or []
    if not itls or not all(isinstance(gaps, list) and _times(gaps) for gaps in itls):
        return
    gaps_ok = [gaps for gaps, good in zip(itls, ok, strict=False) if good]
    flat = [float(g) for gaps in gaps_ok for g in gaps]
    if flat:
        _check_mean("mean_itl_ms", d, flat, "the successful requests' itls")
    latencies = [
        t + math.fsum(float(g) for g in gaps) for t, gaps in zip(ttft_ok, gaps_ok, strict=False)
    ]
    _check_mean("mean_e2el_ms", d, latencies, "the successful requests' ttfts plus itls")
    longest = max(latencies)
    if duration < longest * (1 - TOLERANCE) - SLACK_MS / 1e3:
        raise ValueError(
            f"duration is {duration:.6g} s, yet a request took {longest:.6g} s (its ttfts "
            "plus itls): the run lasts at least as long as each of its requests"
        )


def _times(values: list) -> bool:
    """Every one of ``values`` is a finite number of 0 or more (seconds)."""
    return all((v := _number(x)) is not None and v >= 0 for x in values)


def _check_sum(field: str, stated: float, against: str, values: list) -> None:
    computed = math.fsum(float(v) for v in values)
    if not _agree(stated, computed, 1.0):
        _refuse(field, stated, " tokens", against, computed)


def _check_mean(field: str, d: dict, seconds: list[float], against: str) -> None:
    """``d[field]`` (ms), where given, against the mean of ``seconds`` x 1000."""
    stated = _number(d.get(field))
    if stated is None or not seconds:
        return
    computed = math.fsum(seconds) / len(seconds) * 1e3
    if not _agree(stated, computed, SLACK_MS):
        _refuse(field, stated, " ms", f"the mean of {against}", computed)


def _succeeded(d: dict, failed: int) -> list[bool] | None:
    """Which listed requests succeeded: those whose ``errors`` entry is empty; every one
    where the result lists no errors and counts no failure; None where it cannot be told
    (failures counted, no errors list: vllm bench writes a TTFT of 0 for a failure)."""
    errors = d.get("errors") or []
    n = len(d.get("ttfts") or [])
    if errors:
        return [not e for e in errors]
    return [True] * n if failed == 0 else None


def check_level_means(ttft_ms: float | None, e2e_s: float | None, wall_s: float) -> None:
    """A ValueError when an imported level's mean TTFT (ms) is above its mean E2E (s), or
    its mean E2E above the run's duration (s): each request's first token comes before its
    end, and each request ends within the run."""
    if (
        ttft_ms is not None
        and e2e_s is not None
        and ttft_ms > e2e_s * 1e3 * (1 + TOLERANCE) + SLACK_MS
    ):
        raise ValueError(
            f"the mean TTFT ({ttft_ms:.6g} ms) is above the mean E2E latency "
            f"({e2e_s * 1e3:.6g} ms): a request's first token comes before its end"
        )
    if e2e_s is not None and wall_s > 0 and e2e_s > wall_s * (1 + TOLERANCE) + SLACK_MS / 1e3:
        raise ValueError(
            f"the mean E2E latency ({e2e_s:.6g} s) is above the run's duration "
            f"({wall_s:.6g} s): each request ends within the run"
        )
