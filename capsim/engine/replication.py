"""A long closed-loop level simulated as independent replications, joined end to end.

A closed loop of C clients settles into its steady state within a few rounds of C
requests; what a level of N requests measures beyond that is the same steady state for
longer. So a level of at least two ``PART_REQUESTS`` (and ``MIN_ROUNDS`` rounds a part)
runs as parts of about ``PART_REQUESTS`` requests, each its own simulation from an empty
engine with its own random stream, which worker processes can run side by side; the parts
are then laid end to end in time (part k starts when part k-1's last request finished) and
measured as one run. Each part adds one start-up burst and one final drain of C requests,
at most 1 / MIN_ROUNDS of its requests. How a level is split depends only on its request
count and concurrency (and each part's seed on the level's), never on how many processes
run it, so the figures do not depend on the machine. A replicated level keeps its
requests exactly up to ``request_log.REQUEST_BUFFER`` (folded beyond, as one simulation
would), its ITL samples folded, and it is never the saturated run that levels above it are
derived from (its sends and finishes restart with every part).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from capsim.engine import request_log
from capsim.request_columns import RequestSummary, RequestTable
from capsim.streaming import LogSketch

PART_REQUESTS = 2**16
"""Requests (65,536) in one replication of a long closed-loop level, about; a level is split
only from twice this many requests. Parts this size keep two workers evenly busy on 1M
requests (15 parts; 7 parts of 2^17 left one worker idle for the last) and a bar moving."""

MIN_ROUNDS = 1000
"""Rounds of its concurrency each replication runs at least, so that its start-up burst and
final drain (C requests each) stay within 0.1% of its requests."""


def replication_parts(kind: str, requests: int, concurrency: int | None) -> list[int]:
    """Request counts of the replications a level runs as, in order: one part (the level
    itself) unless it is a closed loop of at least two PART_REQUESTS and MIN_ROUNDS rounds
    a part."""
    if kind != "closed" or not concurrency:
        return [requests]
    parts = min(requests // PART_REQUESTS, requests // (MIN_ROUNDS * concurrency))
    if parts < 2:
        return [requests]
    base, extra = divmod(requests, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def part_seed(seed: int, index: int) -> int:
    """The seed of replication ``index`` of a level simulated with ``seed`` (the first part
    keeps the level's seed; the others draw independent streams from it)."""
    if index == 0:
        return seed
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


def shifted(table: RequestTable, seconds: float) -> RequestTable:
    """The same requests ``seconds`` later (every time; an unknown one stays unknown)."""
    return RequestTable(
        table.send + seconds,
        table.first_token + seconds,
        table.finish + seconds,
        table.input_tokens,
        table.output_tokens,
        table.first_scheduled + seconds,
        table.ok,
    )


def folded_itl(run):
    """``run`` (a ReplicaRun) with its ITL samples folded into a weighted LogSketch: what a
    replication sends back from a worker process (a part's samples run to millions)."""
    sketch = run.itl_sketch or LogSketch(weighted=True)
    if run.itl_values is not None and run.itl_values.size:
        sketch.add(run.itl_values, run.itl_weights)
    return dataclasses.replace(run, itl_values=None, itl_weights=None, itl_sketch=sketch)


class ReplicationJoin:
    """Lays a level's replications (ReplicaRuns, added in order) end to end in time and
    returns them as one run. ``frontend(prompt tokens)``: the front end's latency (s) that
    a client sees on top of the engine's times, applied where requests are folded."""

    def __init__(self, total_requests: int, frontend: Callable):
        self.frontend = frontend
        self.offset = 0.0  # s: where the next part starts
        self.tables: list[RequestTable] = []
        self.summary = RequestSummary() if total_requests > request_log.REQUEST_BUFFER else None
        self.itl = LogSketch(weighted=True)
        self.run_type = None  # ReplicaRun (engine/levels.py imports this module)
        self.totals = dict.fromkeys(
            (
                "query_tokens",
                "hit_tokens",
                "preemptions",
                "steps",
                "events",
                "skipped_requests",
                "unsent_requests",
            ),
            0,
        )
        self.peak_kv_usage = 0.0

    def add(self, run) -> None:
        """The next replication's run (its ITL samples are folded here where a worker has
        not folded them already, ``folded_itl``)."""
        if run.requests is None:
            raise ValueError("a replication folded its requests: parts are under the buffer")
        table = shifted(run.requests, self.offset)
        ends = np.concatenate((table.send, table.finish[table.ok]))
        self.offset = float(np.nanmax(ends)) if ends.size else self.offset
        if self.summary is not None:
            self.summary.add(table.delayed(self.frontend(table.input_tokens)))
        else:
            self.tables.append(table)
        run = folded_itl(run)
        self.itl.merge(run.itl_sketch)
        for name in self.totals:
            self.totals[name] += getattr(run, name)
        self.peak_kv_usage = max(self.peak_kv_usage, run.peak_kv_usage)
        self.run_type = type(run)

    def run(self):
        """The replications as one ReplicaRun (no saturation data: see the module)."""
        if self.run_type is None:
            raise ValueError("no replication was added")
        return self.run_type(
            requests=None if self.summary is not None else RequestTable.concat(self.tables),
            summary=self.summary,
            records=None,
            itl_values=None,
            itl_weights=None,
            itl_sketch=self.itl,
            peak_kv_usage=self.peak_kv_usage,
            dry_at=None,
            finish_order=None,
            **self.totals,
        )
