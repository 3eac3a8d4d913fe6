"""Serving metrics, defined once and used by both the simulator and the probe.

Per request (times in seconds from a common clock):

* ``send``: when the client sent the request.
* TTFT (time to first token) = first_token - send.
* E2E (end-to-end latency) = finish - send.
* TPOT (time per output token) = (E2E - TTFT) / (output_tokens - 1); undefined (None) for
  one-token outputs. It is the mean gap between tokens after the first, per request.
* ITL (inter-token latency): each gap between consecutive streamed tokens. A chunk that
  carries several tokens (speculative decoding) counts as several gaps of chunk_gap / n,
  so the ITL distribution has one entry per token after the first, and its mean over one
  request equals that request's TPOT.
* queueing time = first_scheduled - send (from the engine's side; the probe cannot see it
  and leaves it None).
* per-request output tok/s = output_tokens / E2E (seed 002's "per-task tok/s").

Per level (a set of requests run under one load):

* wall clock = last finish - first send.
* output tok/s = total output tokens / wall clock (seed 002's "effective throughput";
  vLLM bench's "Output token throughput", GuideLLM's output tokens per second).
* total tok/s = (input + output tokens) / wall clock.
* prefill tok/s = total input tokens / wall clock (prompt tokens processed per second of
  the run, prefix-cache hits included, as vLLM bench counts them).
* request throughput = completed requests / wall clock.
* Distributions report mean, p50, p90 and p99 (numpy's linear-interpolation percentiles).

A level's requests come as records, as a ``RequestTable`` (columns), or, for runs too big
to keep every request, as a ``RequestSummary`` (the same figures folded into streaming
accumulators: counts, sums, minima and maxima exact, percentiles within
``streaming.RELATIVE_ERROR``); both live in capsim.request_columns.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from capsim.engine.limits import MAX_CONCURRENCY, MAX_ENGINE_COUNT
from capsim.request_columns import RequestSummary, RequestTable
from capsim.streaming import LogSketch

PERCENTILES = (50, 90, 99)

TIME_SLACK_S = 1e-6
"""How far a record's times may run backwards (s) before it is refused: the rounding of a
log that stores its times to the microsecond."""

Outcome = Literal[
    "ok",
    "http_error",
    "timeout",
    "connection_error",
    "malformed_stream",
    "incomplete",
    "server_error_event",
    "interrupted",
    "failed",
]
OUTCOMES: tuple[str, ...] = Outcome.__args__
"""How a request ended. Only ``ok`` enters the metrics; docs/probe.md's "Request outcomes" says
what each means. ``failed`` is a failure recorded without an outcome (a run file written
before outcomes existed, or an imported tool's error) whose reason names none of the others.
"""

_LEGACY_REASONS = (
    ("http", "http_error"),
    ("timeout", "timeout"),
    ("connection", "connection_error"),
    ("server error", "server_error_event"),
    ("no tokens", "incomplete"),
    ("interrupted", "interrupted"),
)


def legacy_outcome(error: str | None, first_token: float | None) -> str:
    """The outcome of a finished record that has none (read as before outcomes existed:
    ok when it succeeded, else the failure its reason names)."""
    if error is None:
        return "ok" if first_token is not None else "incomplete"
    for prefix, outcome in _LEGACY_REASONS:
        if error.startswith(prefix):
            return outcome
    return "failed"


class RequestRecord(BaseModel):
    """One request as measured (probe) or simulated (engine)."""

    model_config = ConfigDict(extra="forbid")

    request_id: str
    send: float
    first_token: float | None = None
    first_answer_token: float | None = Field(
        None, description="First non-reasoning token (reasoning models; probe only)"
    )
    finish: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    first_scheduled: float | None = None
    cached_tokens: int = Field(0, description="Prompt tokens served from the prefix cache")
    outcome: Outcome | None = Field(
        None,
        description="How the request ended (OUTCOMES); None while it is in flight. A "
        "finished record read without one gets it from its error (legacy_outcome)",
    )
    error: str | None = Field(
        None, description="Why a request that is not ok failed, beginning with its kind"
    )
    http_status: int | None = Field(None, description="HTTP status the server answered (probe)")
    max_tokens: int | None = Field(None, description="Output tokens asked for (probe)")
    finish_reason: str | None = Field(None, description="The server's finish_reason (probe)")
    chunk_times: list[float] | None = Field(
        None, description="Arrival time of each streamed chunk (probe)"
    )
    chunk_tokens: list[int] | None = Field(None, description="Tokens in each streamed chunk")
    session_id: str | None = None

    @model_validator(mode="after")
    def _outcome_of_legacy_record(self) -> RequestRecord:
        if self.outcome is None and (self.finish is not None or self.error is not None):
            self.outcome = legacy_outcome(self.error, self.first_token)
        return self

    @model_validator(mode="after")
    def _ok_without_failure(self) -> RequestRecord:
        """A record that says ok and carries an error or an HTTP status of 400 or more
        contradicts itself (a hand-edited log): counted as ok it would enter the metrics."""
        if self.outcome == "ok" and (
            self.error or (self.http_status is not None and self.http_status >= 400)
        ):
            carried = (
                f"the error {self.error!r}" if self.error else f"HTTP status {self.http_status}"
            )
            raise ValueError(f"the outcome is ok, yet it carries {carried}")
        return self

    @model_validator(mode="after")
    def _times_in_order(self) -> RequestRecord:
        """A request is sent, then gets its first token, then finishes: times out of that
        order (a hand-edited log, an import of a broken file) would give negative TTFTs or
        TPOTs, so they are refused, as are token counts below zero."""
        times = [("send", self.send), ("first_token", self.first_token)]
        times += [("first_answer_token", self.first_answer_token), ("finish", self.finish)]
        known = [(name, t) for name, t in times if t is not None]
        for name, t in known:
            if not math.isfinite(t):
                raise ValueError(f"{name} must be a finite time, not {t}")
        for (a, ta), (b, tb) in itertools.pairwise(known):
            if tb < ta - TIME_SLACK_S:
                raise ValueError(f"{b} ({tb:.6g}) comes before {a} ({ta:.6g})")
        if self.send < -TIME_SLACK_S:  # seconds from the start of the run (or level)
            raise ValueError(f"send must be 0 or later (seconds from the start), not {self.send}")
        for name in ("input_tokens", "output_tokens", "cached_tokens"):
            if not 0 <= getattr(self, name) <= MAX_ENGINE_COUNT:
                raise ValueError(
                    f"{name} must be 0 to {MAX_ENGINE_COUNT:,}, not {getattr(self, name)}"
                )
        if self.cached_tokens > self.input_tokens:  # a part of the prompt
            raise ValueError(
                f"cached_tokens ({self.cached_tokens}) is above input_tokens "
                f"({self.input_tokens}): 0 to input_tokens of the prompt can be cached"
            )
        if self.first_scheduled is not None:
            self._scheduled_in_order()
        if self.chunk_times:
            self._chunks_in_order()
        return self

    def _scheduled_in_order(self) -> None:
        """A request is first scheduled after its send, by its first token and its end
        (one scheduled after its finish queued for longer than it took)."""
        t = self.first_scheduled
        if not math.isfinite(t):
            raise ValueError(f"first_scheduled must be a finite time, not {t}")
        if t < self.send - TIME_SLACK_S:
            raise ValueError(f"first_scheduled ({t:.6g}) comes before send ({self.send:.6g})")
        for name in ("first_token", "finish"):
            later = getattr(self, name)
            if later is not None and t > later + TIME_SLACK_S:
                raise ValueError(f"first_scheduled ({t:.6g}) comes after {name} ({later:.6g})")

    def _chunks_in_order(self) -> None:
        """Chunks arrive after the request is sent, in order, each finite; one token count
        a chunk (a log whose chunks came before their send, or backwards, was summarised
        into negative inter-token gaps)."""
        times = self.chunk_times
        if not all(math.isfinite(t) for t in times):
            raise ValueError("chunk_times must be finite times")
        if times[0] < self.send - TIME_SLACK_S:
            raise ValueError(
                f"the first chunk ({times[0]:.6g}) comes before send ({self.send:.6g})"
            )
        for a, b in itertools.pairwise(times):
            if b < a - TIME_SLACK_S:
                raise ValueError(f"chunk_times run backwards ({b:.6g} after {a:.6g})")
        if self.finish is not None and times[-1] > self.finish + TIME_SLACK_S:
            raise ValueError(
                f"the last chunk ({times[-1]:.6g}) comes after finish ({self.finish:.6g})"
            )
        if self.chunk_tokens is not None and len(self.chunk_tokens) != len(times):
            raise ValueError(
                f"{len(self.chunk_tokens)} chunk_tokens for {len(times)} chunk_times: one a chunk"
            )

    @property
    def ok(self) -> bool:
        """Whether the request completed as asked: the only requests the metrics count."""
        return self.outcome == "ok" and self.finish is not None and self.first_token is not None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.send

    @property
    def e2e(self) -> float | None:
        return None if self.finish is None else self.finish - self.send

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def queueing(self) -> float | None:
        return None if self.first_scheduled is None else self.first_scheduled - self.send

    @property
    def output_tok_s(self) -> float | None:
        if not self.ok or not self.e2e:
            return None
        return self.output_tokens / self.e2e

    def itl(self) -> list[float]:
        """Inter-token gaps from the streamed chunks (one per token after the first)."""
        if not self.chunk_times or not self.chunk_tokens:
            return []
        gaps: list[float] = []
        for i in range(1, len(self.chunk_times)):
            n = max(self.chunk_tokens[i], 1)
            gap = (self.chunk_times[i] - self.chunk_times[i - 1]) / n
            gaps.extend([gap] * n)
        return gaps


class Distribution(BaseModel):
    """Mean and percentiles of a set of values."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    count: int = 0

    def check(self, name: str) -> None:
        """ValueError unless every figure is a finite number of 0 or more and the
        percentiles are in order (p50 <= p90 <= p99, to a part in a million)."""
        figures = {"mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99}
        for key, value in figures.items():
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} {key} is {value!r}, not a finite number of 0 or more")
        ordered = [v for v in (self.p50, self.p90, self.p99) if v is not None]
        if any(b < a * (1 - 1e-6) for a, b in itertools.pairwise(ordered)):
            raise ValueError(f"{name}'s percentiles are out of order (p50, p90, p99: {ordered})")

    @classmethod
    def of(cls, values: Iterable[float | None], weights: Sequence[float] | None = None):
        """Summarise values (None dropped). With weights, percentiles are weighted."""
        if weights is not None:
            if isinstance(values, np.ndarray) and isinstance(weights, np.ndarray):
                arr, w = values.astype(float, copy=False), weights.astype(float, copy=False)
            else:
                pairs = [(v, w) for v, w in zip(values, weights, strict=True) if v is not None]
                arr = np.array([p[0] for p in pairs], dtype=float)
                w = np.array([p[1] for p in pairs], dtype=float)
            if arr.size == 0:
                return cls(mean=None, p50=None, p90=None, p99=None, count=0)
            pcts = weighted_percentiles(arr, w, PERCENTILES)
            return cls(
                mean=float(np.average(arr, weights=w)),
                **{f"p{q}": v for q, v in zip(PERCENTILES, pcts, strict=True)},
                count=round(float(w.sum())),
            )
        if isinstance(values, np.ndarray):
            arr = values.astype(float, copy=False)
        else:
            arr = np.array([v for v in values if v is not None], dtype=float)
        if arr.size == 0:
            return cls(mean=None, p50=None, p90=None, p99=None, count=0)
        pcts = np.percentile(arr, PERCENTILES)
        return cls(
            mean=float(arr.mean()),
            p50=float(pcts[0]),
            p90=float(pcts[1]),
            p99=float(pcts[2]),
            count=int(arr.size),
        )

    @classmethod
    def of_sketch(cls, sketch: LogSketch) -> Distribution:
        """Summarise the values a streaming sketch folded (percentiles within
        streaming.RELATIVE_ERROR of ``of``'s; mean and count the same)."""
        if not sketch.count:
            return cls(mean=None, p50=None, p90=None, p99=None, count=0)
        pcts = sketch.percentiles(PERCENTILES)
        count = round(sketch.total_weight) if sketch.weighted else sketch.count
        return cls(
            mean=sketch.mean,
            **{f"p{q}": v for q, v in zip(PERCENTILES, pcts, strict=True)},
            count=count,
        )

    def scaled(self, factor: float) -> Distribution:
        """The same distribution in other units (e.g. seconds to milliseconds)."""

        def s(v):
            return None if v is None else v * factor

        return Distribution(
            mean=s(self.mean),
            p50=s(self.p50),
            p90=s(self.p90),
            p99=s(self.p99),
            count=self.count,
        )


def weighted_percentiles(
    values: np.ndarray, weights: np.ndarray, qs: Sequence[float]
) -> list[float]:
    """Percentiles ``qs`` (0-100) of values with non-negative weights (inverted CDF: the
    smallest value whose cumulative weight reaches q% of the total)."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    if cum[-1] <= 0:
        return [float("nan")] * len(qs)
    targets = np.asarray(qs, dtype=float) / 100.0 * cum[-1]
    idx = np.minimum(np.searchsorted(cum, targets, side="left"), len(cum) - 1)
    return [float(v) for v in values[order[idx]]]


class LevelMetrics(BaseModel):
    """Aggregates of one load level, the same fields for simulated and probed runs."""

    concurrency: int | None = None
    workload: str | None = None
    requests: int
    completed: int
    failed: int
    wall_s: float
    input_tokens: int
    output_tokens: int
    output_tok_s: float
    total_tok_s: float
    prefill_tok_s: float
    request_throughput: float
    per_request_output_tok_s: Distribution
    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution
    e2e_s: Distribution
    queueing_ms: Distribution

    @model_validator(mode="after")
    def _measured(self) -> LevelMetrics:
        """What a level can have measured: counts of 0 or more (completed and failed
        within the requests), a concurrency of 1 or more, finite times and rates of 0 or
        more, each distribution's percentiles in order. Issue 47: an imported result with
        -40 requests, a negative duration or a p99 below its p50 was written as a run."""
        counts = ("requests", "completed", "failed", "input_tokens", "output_tokens")
        for name in counts:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} is {getattr(self, name)}, below 0")
        if self.completed > self.requests or self.failed > self.requests:
            raise ValueError(
                f"{self.completed} completed and {self.failed} failed of {self.requests} requests"
            )
        if self.concurrency is not None and not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency {self.concurrency} is not 1 to {MAX_CONCURRENCY:,}")
        rates = ("wall_s", "output_tok_s", "total_tok_s", "prefill_tok_s", "request_throughput")
        for name in rates:
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} is {value!r}, not a finite number of 0 or more")
        for name in ("per_request_output_tok_s", "ttft_ms", "tpot_ms", "itl_ms", "e2e_s"):
            getattr(self, name).check(name)
        return self


def level_metrics(
    records: Sequence[RequestRecord] | RequestTable | RequestSummary,
    concurrency: int | None = None,
    workload: str | None = None,
    itl_values: Sequence[float] | np.ndarray | LogSketch | None = None,
    itl_weights: Sequence[float] | np.ndarray | None = None,
) -> LevelMetrics:
    """Aggregate one level's requests (records, or the same as a ``RequestTable``, or
    folded into a ``RequestSummary``). ITL comes from the records' chunks unless given
    (the simulator passes step durations weighted by the sequences they served, or those
    folded into a weighted ``LogSketch``)."""
    if isinstance(itl_values, LogSketch):
        itl = Distribution.of_sketch(itl_values)
    elif itl_values is None:
        if isinstance(records, (RequestTable, RequestSummary)):
            raise ValueError("a RequestTable has no streamed chunks: pass itl_values")
        itl = Distribution.of([g for r in records if r.ok for g in r.itl()])
    else:
        itl = Distribution.of(itl_values, itl_weights)
    if isinstance(records, RequestSummary):
        summary = records
        return _level(
            concurrency,
            workload,
            requests=summary.requests,
            completed=summary.completed,
            first_send=summary.first_send,
            last_finish=summary.last_finish,
            input_tokens=summary.input_tokens,
            output_tokens=summary.output_tokens,
            per_request_output_tok_s=Distribution.of_sketch(summary.output_tok_s),
            ttft_s=Distribution.of_sketch(summary.ttft),
            tpot_s=Distribution.of_sketch(summary.tpot),
            itl_s=itl,
            e2e_s=Distribution.of_sketch(summary.e2e),
            queueing_s=Distribution.of_sketch(summary.queueing),
        )
    table = records if isinstance(records, RequestTable) else RequestTable.from_records(records)
    ok = table.ok
    completed = int(ok.sum())
    return _level(
        concurrency,
        workload,
        requests=len(table),
        completed=completed,
        first_send=float(table.send.min()) if completed else math.nan,
        last_finish=float(table.finish[ok].max()) if completed else math.nan,
        input_tokens=int(table.input_tokens[ok].sum()),
        output_tokens=int(table.output_tokens[ok].sum()),
        per_request_output_tok_s=Distribution.of(table.output_tok_s()),
        ttft_s=Distribution.of(table.ttft()),
        tpot_s=Distribution.of(table.tpot()),
        itl_s=itl,
        e2e_s=Distribution.of(table.e2e()),
        queueing_s=Distribution.of(table.queueing()),
    )


def _level(
    concurrency: int | None,
    workload: str | None,
    *,
    requests: int,
    completed: int,
    first_send: float,
    last_finish: float,
    input_tokens: int,
    output_tokens: int,
    per_request_output_tok_s: Distribution,
    ttft_s: Distribution,
    tpot_s: Distribution,
    itl_s: Distribution,
    e2e_s: Distribution,
    queueing_s: Distribution,
) -> LevelMetrics:
    """LevelMetrics from a level's totals (times in seconds; ``first_send`` over every
    request, ``last_finish`` and the token sums over the completed ones)."""
    wall = max(last_finish - first_send, 1e-12) if completed else 0.0
    inp, out = input_tokens, output_tokens

    def rate(x: float) -> float:
        return x / wall if wall > 0 else 0.0

    return LevelMetrics(
        concurrency=concurrency,
        workload=workload,
        requests=requests,
        completed=completed,
        failed=requests - completed,
        wall_s=wall,
        input_tokens=inp,
        output_tokens=out,
        output_tok_s=rate(out),
        total_tok_s=rate(inp + out),
        prefill_tok_s=rate(inp),
        request_throughput=rate(completed),
        per_request_output_tok_s=per_request_output_tok_s,
        ttft_ms=ttft_s.scaled(1e3),
        tpot_ms=tpot_s.scaled(1e3),
        itl_ms=itl_s.scaled(1e3),
        e2e_s=e2e_s,
        queueing_ms=queueing_s.scaled(1e3),
    )
