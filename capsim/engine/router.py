"""Data parallelism: several replicas behind a router.

Policies:

* ``round_robin``: requests go to replicas in turn.
* ``random``: each request to a replica drawn at random, as a Kubernetes ClusterIP
  Service spreads connections ("By default, kube-proxy in iptables mode chooses a backend
  at random.", Kubernetes docs, Services), so load is uneven. kube-proxy picks per
  connection; a client that keeps a connection alive sends its requests to one pod.
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

import numpy as np
import simpy

from capsim.engine.replica import Replica
from capsim.engine.request import SimRequest

RouterPolicy = Literal["round_robin", "random", "least_outstanding", "prefix_aware"]
ROUTER_POLICIES: tuple[str, ...] = get_args(RouterPolicy)
"""The policies' names, for validating user input."""

PROMPTS_REMEMBERED = 65536
"""Prompt lengths whose per-request latency (a pure function of the length) is kept once
computed, before the memo starts over."""


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
        seed: int = 0,
    ):
        """``api_server_s(prompt tokens)``: seconds of serial API-server work on a request
        (the physics' api_server_seconds); with it every request queues for its replica's
        API server before it reaches that replica's engine. None or always 0: no queue.

        Each replica has an API server of its own: replicas behind a router are servers of
        their own, and vLLM's --data-parallel-size N starts N API servers (vLLM's
        vllm/entrypoints/cli/serve.py: "- Internal LB: Use full DP size ...
        args.api_server_count = args.data_parallel_size"), so a burst queues per replica,
        not for one server of the whole deployment."""
        self.env = env
        self.api_server_s = api_server_s
        self.serial_api_server = api_server_s is not None and takes_time(api_server_s)
        # each API server is a first-in-first-out queue with one server: a request leaves
        # it at max(its arrival, the previous one's departure) + its own work, so its
        # departure is known when it arrives (one timeout, no process or resource)
        self._api_free_at: dict[int, float] = {}
        self._api_seconds: dict[int, float] = {}  # api_server_s by prompt tokens, as asked
        self._in_api: dict[int, int] = {}  # requests in each replica's API server
        self.replicas = replicas
        self.policy = policy
        self.latency_s = latency_s
        self.capacity_rps = capacity_rps
        self.gateway = simpy.Resource(env, capacity=1) if capacity_rps else None
        self._next = 0
        self._affinity: dict[str, int] = {}
        self._rng = np.random.default_rng([seed, 0x524F55])  # the random policy's draws

    def choose(self, req: SimRequest) -> Replica:
        if len(self.replicas) == 1:
            return self.replicas[0]
        if self.policy == "round_robin":
            replica = self.replicas[self._next % len(self.replicas)]
            self._next += 1
            return replica
        if self.policy == "random":
            return self.replicas[int(self._rng.integers(len(self.replicas)))]
        if self.policy == "prefix_aware" and req.session is not None:
            index = self._affinity.get(req.session)
            if index is None:
                index = self._least_loaded().index
                self._affinity[req.session] = index
            return self.replicas[index]
        return self._least_loaded()

    def _least_loaded(self) -> Replica:
        return min(
            self.replicas, key=lambda r: (r.outstanding + self._in_api.get(r.index, 0), r.index)
        )

    def submit(self, req: SimRequest) -> None:
        if self.gateway is None and self.latency_s == 0:
            self._to_server(req, self.choose(req))
        else:
            self.env.process(self._through_gateway(req))

    def _to_server(self, req: SimRequest, replica: Replica) -> None:
        """``req`` into ``replica``'s API server, then its engine."""
        if not self.serial_api_server:
            replica.submit(req)
            return
        now, key = self.env.now, replica.index
        seconds = self._api_seconds.get(req.prompt_len)
        if seconds is None:
            if len(self._api_seconds) >= PROMPTS_REMEMBERED:
                self._api_seconds.clear()
            seconds = float(self.api_server_s(req.prompt_len))
            self._api_seconds[req.prompt_len] = seconds
        free = max(now, self._api_free_at.get(key, 0.0)) + seconds
        self._api_free_at[key] = free
        self._in_api[key] = self._in_api.get(key, 0) + 1
        self.env.timeout(free - now).callbacks.append(
            lambda _, req=req, replica=replica: self._leave_api(req, replica)
        )

    def _leave_api(self, req: SimRequest, replica: Replica) -> None:
        self._in_api[replica.index] -= 1
        replica.submit(req)

    def _through_gateway(self, req: SimRequest):
        if self.gateway is not None:
            with self.gateway.request() as slot:
                yield slot
                yield self.env.timeout(1.0 / self.capacity_rps)
        if self.latency_s:
            yield self.env.timeout(self.latency_s)
        self._to_server(req, self.choose(req))
