"""Saturated closed loops: every level above a saturated one has the same service.

In a closed loop (no think time) on one replica with no router delay, the server sees
one FIFO queue of requests in the order they were sent, and request i has the same
lengths and content at every concurrency (the driver draws them up front). Suppose that
at level C the scheduler never had room for another request and found the queue empty
(``Scheduler.dry_at``) before the workload's last request was sent, once the first C had
arrived (they are sent together and reach the engine one API-server turn apart, at every
level alike). Then no decision at C ever looked past the queue's head. At a level C' > C
the queue holds the same requests in the same order plus C' - C more at the back, so
every decision is the same: the same steps, admissions, preemptions and finish times.
Only the send times differ: the first C' requests go at t = 0, and request m >= C' goes
when the (m - C' + 1)-th finish reaches its client.

So one simulation of a saturated level gives every level above it. Saturation is the
regime where the KV cache or ``max_num_seqs`` holds the batch and the rest of the clients
queue; a sweep to high concurrency spends most of its simulation there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from capsim.engine.workloads import Workload
from capsim.request_columns import RequestTable

if TYPE_CHECKING:  # simulate imports this module
    from capsim.engine.levels import ReplicaRun


def shares_service(
    workload: Workload,
    replicas: int,
    router_latency_s: float,
    router_capacity_rps: float | None,
) -> bool:
    """Whether levels of this workload and deployment can share a saturated service trace:
    a closed loop on one replica with no router latency or gateway in between. The API
    server's serial queue may stand in front: it serves requests in the order they were
    sent, and a first-in-first-out queue never delivers a request later when every request
    is sent earlier or at the same time, so at a higher level each request reaches the
    engine no later than at the saturated one, whose waiting queue never ran dry."""
    return (
        workload.kind == "closed"
        and replicas == 1
        and router_latency_s == 0
        and router_capacity_rps is None
    )


def is_saturated(run: ReplicaRun) -> bool:
    """Whether a closed-loop run of one replica finished every request and never found its
    queue empty with room to spare before its last request was sent. A run that folded
    its requests (past request_log.REQUEST_BUFFER) kept no per-request times to derive
    other levels from: it counts as unsaturated, and the levels above it are simulated."""
    table, order = run.requests, run.finish_order
    if table is None or order is None or not len(table) or len(order) != len(table):
        return False
    last_send = float(table.send.max())
    return run.dry_at is None or run.dry_at >= last_send


def closed_send_times(
    run: ReplicaRun, concurrency: int, turnaround: Callable | None = None
) -> np.ndarray:
    """Send time (s) of each request of a closed run's service at ``concurrency`` (its own,
    or a higher one when the run is saturated): 0 for the first ``concurrency`` requests,
    then, in order, the times clients see a request finish (the engine's finish plus
    ``turnaround(prompt tokens)``, the front end's latency): each such client sends the
    next request in the queue."""
    t = run.requests
    sends = np.zeros(t.finish.size)
    if turnaround is None:
        seen = t.finish[run.finish_order]
    else:
        seen = np.sort(t.finish + turnaround(t.input_tokens.astype(float)), kind="stable")
    sends[concurrency:] = seen[: max(t.finish.size - concurrency, 0)]
    return sends


def derive_run(run: ReplicaRun, concurrency: int, turnaround: Callable | None = None) -> ReplicaRun:
    """The run of the same service at a higher ``concurrency`` (see the module text);
    ``turnaround`` as in closed_send_times."""
    sends = closed_send_times(run, concurrency, turnaround)
    t = run.requests
    requests = RequestTable(
        sends, t.first_token, t.finish, t.input_tokens, t.output_tokens, t.first_scheduled, t.ok
    )
    records = None
    if run.records is not None:
        records = [
            r.model_copy(update={"send": send})
            for send, r in zip(sends.tolist(), run.records, strict=True)
        ]
    return replace(run, requests=requests, records=records)
