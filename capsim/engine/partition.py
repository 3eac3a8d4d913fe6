"""When data-parallel replicas can be simulated apart.

With session-affine routing (``prefix_aware``: a session stays on the replica that took
its first request) and no shared gateway, replicas interact only through where each
session's first request lands. In the agents workload without an orchestrator, every
agent sends its first turn at time 0, in agent order, before any replica runs a step,
so the router's choices are known up front: each first turn goes to the replica with
the fewest outstanding requests, the lowest index on a tie. After that, every replica
serves its own agents and nothing else, so each can be simulated on its own (and in
parallel) with the same results as the joint simulation (tested).
"""

from __future__ import annotations

from capsim.engine.workloads import Workload


def session_affine_groups(
    workload: Workload,
    replicas: int,
    router: str,
    router_latency_s: float = 0.0,
    router_capacity_rps: float | None = None,
) -> list[list[int]] | None:
    """The agents each replica serves, or None when the replicas interact (one replica,
    another workload or router, an orchestrator, a gateway with latency or capacity)."""
    if replicas < 2 or workload.kind != "agents" or workload.orchestrator:
        return None
    if router != "prefix_aware" or router_latency_s or router_capacity_rps:
        return None
    outstanding = [0] * replicas
    groups: list[list[int]] = [[] for _ in range(replicas)]
    for agent in range(workload.concurrency or 0):
        chosen = min(range(replicas), key=lambda r: (outstanding[r], r))
        outstanding[chosen] += 1
        groups[chosen].append(agent)
    return groups
