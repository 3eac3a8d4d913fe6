"""Saturated closed loops: every level above a saturated one has the same service.

In a closed loop (no think time) on one replica with no router delay, the server sees
one FIFO queue of requests in the order they were sent, and request i has the same
lengths and content at every concurrency (the driver draws them up front). Suppose that
at level C the scheduler never had room for another request and found the queue empty
(``Scheduler.dry_at``) before the workload's last request was sent. Then no decision at C
ever looked past the queue's head. At a level C' > C the queue holds the same requests in
the same order plus C' - C more at the back, so every decision is the same: the same
steps, admissions, preemptions and finish times. Only the send times differ: the first
C' requests go at t = 0, and request m >= C' goes when the (m - C' + 1)-th finish frees
its client.

So one simulation of a saturated level gives every level above it. Saturation is the
regime where the KV cache or ``max_num_seqs`` holds the batch and the rest of the clients
queue; a sweep to high concurrency spends most of its simulation there.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from capsim.engine.workloads import Workload

if TYPE_CHECKING:  # simulate imports this module
    from capsim.engine.simulate import ReplicaRun


def shares_service(
    workload: Workload,
    replicas: int,
    router_latency_s: float,
    router_capacity_rps: float | None,
    api_server_s: float = 0.0,
) -> bool:
    """Whether levels of this workload and deployment can share a saturated service trace:
    a closed loop on one replica whose requests reach it the instant they are sent (no
    router latency, gateway or API-server queue in between)."""
    return (
        workload.kind == "closed"
        and replicas == 1
        and router_latency_s == 0
        and router_capacity_rps is None
        and api_server_s == 0
    )


def is_saturated(run: ReplicaRun) -> bool:
    """Whether a closed-loop run of one replica finished every request and never found its
    queue empty with room to spare before its last request was sent."""
    if run.finish_order is None or len(run.finish_order) != len(run.rows):
        return False
    last_send = max(row[0] for row in run.rows)
    return run.dry_at is None or run.dry_at >= last_send


def closed_send_times(run: ReplicaRun, concurrency: int) -> list[float]:
    """Send time (s) of each request of a closed run's service at ``concurrency`` (its own,
    or a higher one when the run is saturated): 0 for the first ``concurrency`` requests,
    then the finish time of the request whose finish frees a client, in finishing order."""
    finish = [row[2] for row in run.rows]
    order = run.finish_order
    return [
        0.0 if m < concurrency else finish[order[m - concurrency]] for m in range(len(run.rows))
    ]


def derive_run(run: ReplicaRun, concurrency: int) -> ReplicaRun:
    """The run of the same service at a higher ``concurrency`` (see the module text)."""
    sends = closed_send_times(run, concurrency)
    rows = [(send, *row[1:]) for send, row in zip(sends, run.rows, strict=True)]
    records = None
    if run.records is not None:
        records = [
            r.model_copy(update={"send": send}) for send, r in zip(sends, run.records, strict=True)
        ]
    return replace(run, rows=rows, records=records)
