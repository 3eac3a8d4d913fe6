"""Data parallelism: several replicas behind a router.

Policies:

* ``round_robin``: requests go to replicas in turn (Kubernetes ClusterIP-style).
* ``least_outstanding``: to the replica with the fewest waiting + running requests.
* ``prefix_aware``: a session's requests stick to the replica that served it before
  (so its prefix cache hits); new sessions go to the least loaded replica.

A gateway between clients and replicas can add a fixed ``latency_s`` per request and, with
``capacity_rps``, serve requests one at a time at that rate (a queue forms when it is the
bottleneck). Seed 001 measured about 35% lower throughput through a KV-aware gateway than
through round-robin ClusterIP; calibration sets these two parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

import simpy

from capsim.engine.replica import Replica
from capsim.engine.request import SimRequest

RouterPolicy = Literal["round_robin", "least_outstanding", "prefix_aware"]
ROUTER_POLICIES: tuple[str, ...] = get_args(RouterPolicy)
"""The policies' names, for validating user input."""


def takes_time(seconds_of: Callable[[float], float]) -> bool:
    """Whether a per-request latency ``seconds_of(prompt tokens)`` (a share per request
    plus one per token, neither negative) is ever above zero."""
    return bool(seconds_of(0.0) > 0 or seconds_of(1e6) > 0)


class Router:
    """Sends each request to one replica."""

    def __init__(
        self,
        env: simpy.Environment,
        replicas: list[Replica],
        policy: RouterPolicy = "round_robin",
        latency_s: float = 0.0,
        capacity_rps: float | None = None,
        api_server_s: Callable[[int], float] | None = None,
    ):
        """``api_server_s(prompt tokens)``: seconds of serial API-server work on a request
        (the physics' api_server_seconds); with it every request first queues for the one
        API server. None or always 0: no queue."""
        self.env = env
        self.api_server_s = api_server_s
        self.serial_api_server = api_server_s is not None and takes_time(api_server_s)
        # the one API server is a first-in-first-out queue with one server: a request
        # leaves it at max(its arrival, the previous one's departure) + its own work, so
        # its departure is known when it arrives (one timeout, no process or resource)
        self._api_free_at = 0.0
        self.replicas = replicas
        self.policy = policy
        self.latency_s = latency_s
        self.capacity_rps = capacity_rps
        self.gateway = simpy.Resource(env, capacity=1) if capacity_rps else None
        self._next = 0
        self._affinity: dict[str, int] = {}

    def choose(self, req: SimRequest) -> Replica:
        if len(self.replicas) == 1:
            return self.replicas[0]
        if self.policy == "round_robin":
            replica = self.replicas[self._next % len(self.replicas)]
            self._next += 1
            return replica
        if self.policy == "prefix_aware" and req.session is not None:
            index = self._affinity.get(req.session)
            if index is None:
                index = self._least_loaded().index
                self._affinity[req.session] = index
            return self.replicas[index]
        return self._least_loaded()

    def _least_loaded(self) -> Replica:
        return min(self.replicas, key=lambda r: (r.outstanding, r.index))

    def submit(self, req: SimRequest) -> None:
        if self.serial_api_server:
            now = self.env.now
            self._api_free_at = max(now, self._api_free_at) + float(
                self.api_server_s(req.prompt_len)
            )
            delay = self._api_free_at - now
            self.env.timeout(delay).callbacks.append(lambda _, req=req: self._after_api(req))
        else:
            self._after_api(req)

    def _after_api(self, req: SimRequest) -> None:
        if self.gateway is None and self.latency_s == 0:
            self.choose(req).submit(req)
        else:
            self.env.process(self._through_gateway(req))

    def _through_gateway(self, req: SimRequest):
        if self.gateway is not None:
            with self.gateway.request() as slot:
                yield slot
                yield self.env.timeout(1.0 / self.capacity_rps)
        if self.latency_s:
            yield self.env.timeout(self.latency_s)
        self.choose(req).submit(req)
