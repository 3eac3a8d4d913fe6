"""What a simulation keeps of its requests and decode steps, in memory that stops growing.

A request that finishes is written here and its ``SimRequest`` is let go. Up to
``REQUEST_BUFFER`` requests a simulation keeps every request's figures in numpy columns,
so its metrics are exactly those of keeping every request; past it the requests are
folded, a batch at a time, into a ``request_columns.RequestSummary`` (exact counts, sums and
means; percentiles within ``streaming.RELATIVE_ERROR``). The inter-token latencies of
decode steps are kept one by one up to ``ITL_BUFFER`` samples and then folded into a
weighted ``streaming.LogSketch`` the same way. Either way memory is bounded by the
buffers, whatever the number of requests.
"""

from __future__ import annotations

import array
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from capsim.engine.request import SimRequest
from capsim.errors import CapsimUserError
from capsim.metrics import RequestRecord
from capsim.request_columns import RequestSummary, RequestTable
from capsim.streaming import LogSketch

REQUEST_BUFFER = 2**20
"""Requests (1,048,576) one simulation keeps one by one: 8 float64 columns, 64 MiB at
most. A level of at most this many requests gives exactly the figures of keeping them all
(and its per-request records, and a saturated run other levels can be derived from);
beyond it requests are folded into streaming accumulators."""

ITL_BUFFER = 2**22
"""Decode-step inter-token latency samples (4,194,304) one simulation keeps one by one
(value and weight, 64 MiB at most); beyond it they are folded into a weighted log-binned
histogram."""

REQUEST_BATCH = 16_384
"""Finished requests gathered (as tuples) before they are written to the columns or
folded: numpy's cost per call is paid once a batch."""

_COLUMNS = 8  # send, first_token, finish, input, output, first_scheduled, ok, cached


@dataclass
class LoggedRequests:
    """A finished simulation's requests: every one (``table``, the engine's times, in
    request order, and ``finish_order``, the table's rows in the order they finished),
    or, past the buffer, ``summary`` (the client's times: the front end's latency added).
    ``records`` when asked for."""

    table: RequestTable | None
    finish_order: np.ndarray | None
    summary: RequestSummary | None
    records: list[RequestRecord] | None


class RequestLog:
    """Per-request figures of one simulation, written as requests finish.

    ``add(index, req)`` takes the request with index ``index`` (0 for the first the
    driver sent) when it finishes; ``close`` takes the ones still unfinished when the
    simulation ends and returns what was kept. ``frontend(prompt tokens)`` is the front
    end's latency in seconds, added to the first token and finish a client sees when
    requests are folded. With ``keep_records``, ``close`` also builds each request's
    ``RequestRecord`` (ids from ``first_rid``); more requests than the buffer are then an
    error rather than folded.
    """

    def __init__(
        self,
        frontend: Callable,
        keep_records: bool = False,
        first_rid: int = 0,
        capacity: int | None = None,
    ):
        self.frontend = frontend
        self.keep_records = keep_records
        self.first_rid = first_rid
        self.capacity = REQUEST_BUFFER if capacity is None else capacity
        self._pending: list[tuple] = []
        self._columns = np.zeros((_COLUMNS, 0))  # by request index, while exact
        self._order = np.zeros(0, dtype=np.int64)  # indices in the order written
        self._written = 0
        self._finished = 0  # requests added before close (they finished)
        self._sessions: dict[int, str | None] = {}  # with keep_records
        self.summary: RequestSummary | None = None  # once past the buffer

    def add(self, index: int, req: SimRequest) -> None:
        """Keep a finished request's figures (``index``: its position in send order)."""
        self._keep(index, req, req.output_len, True)
        self._finished += 1
        if len(self._pending) >= REQUEST_BATCH:
            self._flush()

    def _add_unfinished(self, index: int, req: SimRequest) -> None:
        ok = req.finish is not None and req.first_token is not None
        output = req.output_len if req.finish is not None else int(req.generated)
        self._keep(index, req, output, ok)

    def _keep(self, index: int, req: SimRequest, output: int, ok: bool) -> None:
        """Queue one request's row (send order ``index``, ``output`` tokens, whether it
        completed) for the columns."""
        self._pending.append(
            (
                index,
                req.send,
                req.first_token,
                req.finish,
                req.prompt_len,
                output,
                req.first_scheduled,
                float(ok),
                req.cached_tokens,
            )
        )
        if self.keep_records:
            self._sessions[index] = req.session

    def mark(self) -> tuple[bool, int]:
        """Where the log stands (for ``rows_since``): whether it still keeps every
        request, and how many rows it has taken."""
        return self.summary is None, self._written + len(self._pending)

    def rows_since(self, mark: tuple[bool, int]) -> np.ndarray | None:
        """The rows taken since ``mark`` in the order they came, as an array of the
        request's index and its _COLUMNS values; None where the log has folded its
        requests since (or had then)."""
        exact, start = mark
        if not exact or self.summary is not None:
            return None
        end = self._written + len(self._pending)
        rows = np.empty((end - start, 1 + _COLUMNS))
        written = max(self._written - start, 0)
        if written:
            index = self._order[start : self._written]
            rows[:written, 0] = index
            rows[:written, 1:] = self._columns[:, index].T
        if end - start > written:
            rows[written:] = np.array(self._pending[max(start - self._written, 0) :], dtype=float)
        return rows

    def repeat(self, rows: np.ndarray, times: int, index_step: int, seconds: float) -> None:
        """Add ``rows`` (finished requests, from ``rows_since``) ``times`` more times, the
        k-th copy's indices ``k * index_step`` and its times ``k * seconds`` later (whole
        periods of a repeating state, engine/periodic.py)."""
        self._flush()
        step = np.zeros(1 + _COLUMNS)
        step[0] = index_step
        step[[1, 2, 3, 6]] = seconds  # send, first token, finish, first scheduled
        per_batch = max(REQUEST_BATCH // max(len(rows), 1), 1)
        for first in range(1, times + 1, per_batch):
            k = np.arange(first, min(first + per_batch, times + 1), dtype=float)
            batch = (rows[None, :, :] + k[:, None, None] * step).reshape(-1, 1 + _COLUMNS)
            if self.keep_records:
                for index in batch[:, 0].astype(np.int64).tolist():
                    self._sessions[index] = None
            self._write(batch)
        self._finished += times * len(rows)

    def _flush(self) -> None:
        if not self._pending:
            return
        batch = np.array(self._pending, dtype=float)  # None becomes NaN
        self._pending.clear()
        self._write(batch)

    def _write(self, batch: np.ndarray) -> None:
        """Rows (index and _COLUMNS values) into the columns, or folded."""
        index = batch[:, 0].astype(np.int64)
        values = batch[:, 1:].T
        if self.summary is None and int(index.max()) >= self.capacity:
            self._start_folding()
        if self.summary is not None:
            self.summary.add(self._client_table(values))
            return
        self._cover(int(index.max()) + 1)
        self._columns[:, index] = values
        self._order[self._written : self._written + index.size] = index
        self._written += index.size

    def _cover(self, rows: int) -> None:
        """Grow the columns to hold ``rows`` requests (doubling, up to the buffer)."""
        have = self._columns.shape[1]
        if rows <= have:
            return
        size = min(max(rows, 2 * have, REQUEST_BATCH), self.capacity)
        columns = np.zeros((_COLUMNS, size))
        columns[:, :have] = self._columns
        self._columns = columns
        order = np.zeros(size, dtype=np.int64)
        order[: self._written] = self._order[: self._written]
        self._order = order

    def _start_folding(self) -> None:
        """Past the buffer: fold the requests kept so far and keep none from now on."""
        if self.keep_records:
            raise CapsimUserError(
                f"per-request records are kept for at most {self.capacity:,} requests a simulation",
                hint="lower --requests (or ask for the metrics alone, without records)",
            )
        self.summary = RequestSummary()
        kept = self._order[: self._written]
        self.summary.add(self._client_table(self._columns[:, kept]))
        self._columns = np.zeros((_COLUMNS, 0))
        self._order = np.zeros(0, dtype=np.int64)
        self._written = 0

    def _client_table(self, values: np.ndarray) -> RequestTable:
        """A batch of rows as a client sees them (the front end's latency added)."""
        table = _table(values)
        return table.delayed(self.frontend(table.input_tokens))

    def close(self, unfinished: list[tuple[int, SimRequest]]) -> LoggedRequests:
        """Add the requests still unfinished as (index, request) and return what was
        kept."""
        for index, req in unfinished:
            self._add_unfinished(index, req)
        self._flush()
        if self.summary is not None:
            return LoggedRequests(None, None, self.summary, None)
        n = self._written
        assert n == 0 or int(self._order[:n].max()) == n - 1, "a request was not logged"
        cols = self._columns[:, :n]
        table = _table(cols)
        records = self._records(cols) if self.keep_records else None
        return LoggedRequests(table, self._order[: self._finished].copy(), None, records)

    def _records(self, cols: np.ndarray) -> list[RequestRecord]:
        """Each request's record, with the front end's latency in its first token and
        finish (the simulator's own values are already typed: no re-validation)."""
        frontend = self.frontend
        send, first, finish, inputs, outputs, scheduled, _, cached = (c.tolist() for c in cols)
        records = []
        for i in range(cols.shape[1]):
            prompt = int(inputs[i])
            done = not math.isnan(finish[i])
            records.append(
                RequestRecord.model_construct(
                    request_id=str(self.first_rid + i),
                    send=send[i],
                    first_token=None if math.isnan(first[i]) else first[i] + frontend(prompt),
                    finish=finish[i] + frontend(prompt) if done else None,
                    input_tokens=prompt,
                    output_tokens=int(outputs[i]),
                    first_scheduled=None if math.isnan(scheduled[i]) else scheduled[i],
                    cached_tokens=int(cached[i]),
                    error=None if done else "did not finish",
                    session_id=self._sessions[i],
                )
            )
        return records


def _table(values: np.ndarray) -> RequestTable:
    """Rows as _COLUMNS float columns (NaN: unknown time) as a RequestTable."""
    return RequestTable(
        values[0],
        values[1],
        values[2],
        values[3].astype(np.int64),
        values[4].astype(np.int64),
        values[5],
        values[6] > 0,
    )


class ItlLog:
    """Inter-token latencies of the decode steps of one simulation's replicas (``slots``
    of them): each step's seconds per token, weighted by the sequences it served.

    Kept one by one, per replica, whole decode runs as arrays and single steps as
    numbers, up to ``ITL_BUFFER`` samples in all; then folded into a weighted LogSketch,
    and again each time as many more have gathered."""

    def __init__(self, slots: int, capacity: int | None = None):
        self.capacity = ITL_BUFFER if capacity is None else capacity
        self._runs: list[list[tuple[np.ndarray, float]]] = [[] for _ in range(slots)]
        self._steps = [array.array("d") for _ in range(slots)]
        self._step_weights = [array.array("d") for _ in range(slots)]
        self._kept = 0
        self._folds = 0
        self.sketch: LogSketch | None = None  # once past the buffer

    def mark(self) -> tuple:
        """Where the log stands (for ``samples_since``)."""
        return self._folds, [(len(r), len(s)) for r, s in zip(self._runs, self._steps, strict=True)]

    def samples_since(self, mark: tuple) -> list | None:
        """Each slot's runs and single steps (values, weights) logged since ``mark``;
        None where the log folded its samples since."""
        folds, ends = mark
        if folds != self._folds:
            return None
        return [
            (runs[r:], steps[s:], weights[s:])
            for (r, s), runs, steps, weights in zip(
                ends, self._runs, self._steps, self._step_weights, strict=True
            )
        ]

    def repeat(self, samples: list, times: int) -> None:
        """Count ``samples`` (from ``samples_since``) ``times`` more times: each again,
        its weight ``times`` fold (engine/periodic.py)."""
        for slot, (runs, steps, weights) in enumerate(samples):
            for per_token, weight in runs:
                self._runs[slot].append((per_token, weight * times))
                self._kept += per_token.size
            if steps:
                self._steps[slot].extend(steps)
                self._step_weights[slot].extend(array.array("d", (w * times for w in weights)))
                self._kept += len(steps)
        if self._kept > self.capacity:
            self._fold()

    def add_run(self, slot: int, per_token: np.ndarray, sequences: int) -> None:
        """A decode run's steps, seconds per token, each serving ``sequences``."""
        self._runs[slot].append((per_token, float(sequences)))
        self._kept += per_token.size
        if self._kept > self.capacity:
            self._fold()

    def add_step(self, slot: int, per_token: float, sequences: int) -> None:
        """One decode step, seconds per token, serving ``sequences``."""
        self._steps[slot].append(per_token)
        self._step_weights[slot].append(float(sequences))
        self._kept += 1
        if self._kept > self.capacity:
            self._fold()

    def _kept_samples(self) -> tuple[np.ndarray, np.ndarray]:
        """The samples kept, replica by replica (its runs, then its single steps)."""
        values, weights = np.empty(self._kept), np.empty(self._kept)
        at = 0
        for runs, steps, step_weights in zip(
            self._runs, self._steps, self._step_weights, strict=True
        ):
            for run, weight in runs:
                values[at : at + run.size] = run
                weights[at : at + run.size] = weight
                at += run.size
            values[at : at + len(steps)] = np.frombuffer(steps) if steps else 0.0
            weights[at : at + len(steps)] = np.frombuffer(step_weights) if steps else 0.0
            at += len(steps)
        return values, weights

    def _fold(self) -> None:
        self._folds += 1
        values, weights = self._kept_samples()
        if self.sketch is None:
            self.sketch = LogSketch(weighted=True)
        self.sketch.add(values, weights)
        for slot in range(len(self._runs)):
            self._runs[slot] = []
            self._steps[slot] = array.array("d")
            self._step_weights[slot] = array.array("d")
        self._kept = 0

    def close(self) -> tuple[np.ndarray | None, np.ndarray | None, LogSketch | None]:
        """Every sample's value and weight, or past the buffer (None, None, sketch)."""
        if self.sketch is None:
            values, weights = self._kept_samples()
            self._runs = [[] for _ in self._runs]
            self._steps = self._step_weights = []
            return values, weights, None
        if self._kept:
            self._fold()
        return None, None, self.sketch
