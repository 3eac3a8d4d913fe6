"""A level's requests in the two forms ``metrics.level_metrics`` aggregates besides records:
``RequestTable``, every request as numpy columns (the simulator's, and the probe's records
converted), and ``RequestSummary``, the same figures folded into streaming accumulators for
runs too big to keep every request. Times in seconds from a common clock; the per-request
metrics are the ones capsim.metrics defines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from capsim.streaming import LogSketch

if TYPE_CHECKING:
    from capsim.metrics import RequestRecord


class RequestTable:
    """A level's requests as columns (numpy arrays; NaN where a time is unknown), so the
    per-request metrics above are computed for all requests at once.

    The simulator builds it straight from its requests; ``from_records`` builds it from
    ``RequestRecord``s (the probe). The columns hold the same quantities as a record's
    fields, and the methods compute the same metrics as its properties (tested).
    """

    __slots__ = (
        "finish",
        "first_scheduled",
        "first_token",
        "input_tokens",
        "ok",
        "output_tokens",
        "send",
    )
    _COLUMNS = (
        "send",
        "first_token",
        "finish",
        "input_tokens",
        "output_tokens",
        "first_scheduled",
        "ok",
    )
    """The columns, in the constructor's order."""

    def __init__(
        self,
        send: np.ndarray,
        first_token: np.ndarray,
        finish: np.ndarray,
        input_tokens: np.ndarray,
        output_tokens: np.ndarray,
        first_scheduled: np.ndarray,
        ok: np.ndarray,
    ):
        self.send = np.asarray(send, dtype=float)
        self.first_token = np.asarray(first_token, dtype=float)
        self.finish = np.asarray(finish, dtype=float)
        self.input_tokens = np.asarray(input_tokens, dtype=np.int64)
        self.output_tokens = np.asarray(output_tokens, dtype=np.int64)
        self.first_scheduled = np.asarray(first_scheduled, dtype=float)
        self.ok = np.asarray(ok, dtype=bool)

    @classmethod
    def from_rows(cls, rows: Sequence[tuple]) -> RequestTable:
        """From (send, first_token, finish, input, output, first_scheduled, ok) tuples,
        None for an unknown time."""
        if not rows:
            empty = np.zeros(0)
            return cls(empty, empty, empty, empty, empty, empty, np.zeros(0, dtype=bool))
        nan = float("nan")
        cols = list(zip(*rows, strict=True))
        times = [
            np.array([nan if v is None else v for v in cols[i]], dtype=float) for i in (0, 1, 2, 5)
        ]
        return cls(times[0], times[1], times[2], cols[3], cols[4], times[3], cols[6])

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord]) -> RequestTable:
        return cls.from_rows(
            [
                (
                    r.send,
                    r.first_token,
                    r.finish,
                    r.input_tokens,
                    r.output_tokens,
                    r.first_scheduled,
                    r.ok,
                )
                for r in records
            ]
        )

    @classmethod
    def concat(cls, tables: Sequence[RequestTable]) -> RequestTable:
        """The requests of several tables, in order, as one."""
        if len(tables) == 1:
            return tables[0]
        return cls(*(np.concatenate([getattr(t, name) for t in tables]) for name in cls._COLUMNS))

    def delayed(self, delay: np.ndarray | float) -> RequestTable:
        """The same requests with ``delay`` seconds (each request's, or one for all) added
        to every first token and finish."""
        return RequestTable(
            self.send,
            self.first_token + delay,
            self.finish + delay,
            self.input_tokens,
            self.output_tokens,
            self.first_scheduled,
            self.ok,
        )

    def __len__(self) -> int:
        return int(self.send.size)

    def ttft(self) -> np.ndarray:
        """TTFT of the completed requests, seconds."""
        return (self.first_token - self.send)[self.ok]

    def e2e(self) -> np.ndarray:
        """E2E of the completed requests, seconds."""
        return (self.finish - self.send)[self.ok]

    def tpot(self) -> np.ndarray:
        """TPOT of the completed requests with at least two output tokens, seconds."""
        keep = self.ok & (self.output_tokens >= 2)
        e2e, ttft = self.finish - self.send, self.first_token - self.send
        return (e2e - ttft)[keep] / (self.output_tokens[keep] - 1)

    def queueing(self) -> np.ndarray:
        """Queueing time of the completed requests the engine saw scheduled, seconds."""
        q = (self.first_scheduled - self.send)[self.ok]
        return q[~np.isnan(q)]

    def output_tok_s(self) -> np.ndarray:
        """Per-request output tok/s of the completed requests with a positive E2E."""
        e2e = self.finish - self.send
        keep = self.ok & (e2e != 0)
        return self.output_tokens[keep] / e2e[keep]


class RequestSummary:
    """A level's requests folded into streaming accumulators, batch by batch (each a
    ``RequestTable``): what ``level_metrics`` needs, in memory that does not grow with
    the number of requests. Counts, token sums, the first send and the last finish are
    exact; each distribution's count, mean, minimum and maximum are exact (the mean up to
    float rounding) and its percentiles within streaming.RELATIVE_ERROR."""

    def __init__(self) -> None:
        self.requests = 0
        self.completed = 0
        self.first_send = math.inf  # s, over every request
        self.last_finish = -math.inf  # s, over the completed ones
        self.input_tokens = 0  # of the completed requests
        self.output_tokens = 0
        self.ttft = LogSketch()  # s
        self.tpot = LogSketch()  # s per token
        self.e2e = LogSketch()  # s
        self.queueing = LogSketch()  # s
        self.output_tok_s = LogSketch()  # per request, tokens/s

    def add(self, table: RequestTable) -> None:
        """Fold a batch of requests in (times as the client sees them)."""
        if not len(table):
            return
        ok = table.ok
        self.requests += len(table)
        self.first_send = min(self.first_send, float(table.send.min()))
        if ok.any():
            self.completed += int(ok.sum())
            self.last_finish = max(self.last_finish, float(table.finish[ok].max()))
            self.input_tokens += int(table.input_tokens[ok].sum())
            self.output_tokens += int(table.output_tokens[ok].sum())
        self.ttft.add(table.ttft())
        self.tpot.add(table.tpot())
        self.e2e.add(table.e2e())
        self.queueing.add(table.queueing())
        self.output_tok_s.add(table.output_tok_s())

    def merge(self, other: RequestSummary) -> None:
        """Fold another summary's requests in."""
        self.requests += other.requests
        self.completed += other.completed
        self.first_send = min(self.first_send, other.first_send)
        self.last_finish = max(self.last_finish, other.last_finish)
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        for name in ("ttft", "tpot", "e2e", "queueing", "output_tok_s"):
            getattr(self, name).merge(getattr(other, name))
