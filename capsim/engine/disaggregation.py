"""Disaggregated prefill and decode: a pool of instances that only prefill, a pool that
only decodes, and the KV transfer between them (vLLM's P/D connectors, SGLang's PD
disaggregation, NVIDIA Dynamo, llm-d).

A request goes to the prefill instance with the fewest outstanding requests, which runs
its prompt as a request of one output token (vLLM's proxy sends it with max_tokens=1) and
lets its KV go when that token is made. Its KV then crosses to the decode instance with
the fewest outstanding requests: the transfers into one decode instance take its links in
turn (first in, first out), each ``KVTransfer.link_seconds`` long, and the request reaches
that instance ``KVTransfer.latency_s`` after its transfer ends. There it holds the blocks
of its whole prompt and recomputes only the last prompt token, whose step makes the first
token the client sees (vLLM's decode instance loads the remote KV of all but the last
prompt token and schedules that one; a preempted request recomputes its prompt locally).
TTFT is therefore the front end, the prefill queue and prefill, the transfer and its
queue, the decode server's front end, and the decode instance's queue and first step
(Mooncake issue 62: "the first token of the decode (i.e., TTFT) consists of the prefill
stage overhead, KVCache transfer cost, and the first run overhead of the decode stage").

Not modelled: the decode instance reserving blocks before the transfer starts (vLLM
allocates them first and waits for the KV; here they are taken when it arrives), and
transfers contending with the decode instance's own memory traffic.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from capsim.engine.replica import Replica
from capsim.engine.request import SimRequest
from capsim.physics.kv_transfer import KVTransfer


def least_outstanding(replicas: list[Replica]) -> Replica:
    """The replica with the fewest waiting and running requests (the lowest index first)."""
    return min(replicas, key=lambda r: (r.outstanding, r.index))


class DisaggregatedPools:
    """Prefill and decode instances behind one front door (what a Router sends to)."""

    index = 0

    def __init__(
        self,
        env: simpy.Environment,
        prefill: list[Replica],
        decode: list[Replica],
        transfer: KVTransfer,
        handoff_s: Callable[[float], float] | None = None,
    ):
        """``handoff_s(prompt tokens)``: the decode server's own front end, seconds, where
        the router sends the request there only once the prefill instance has answered
        (vLLM's proxy; Engine.disaggregation_handoff 'sequential'); None where it overlaps
        the prefill (SGLang's router sends to both at once)."""
        self.env = env
        self.prefill = prefill
        self.decode = decode
        self.transfer = transfer
        self.handoff_s = handoff_s
        # each decode instance's links are free from this time (s)
        self._link_free_at = {rep.index: 0.0 for rep in decode}
        self._origin: dict[int, SimRequest] = {}  # prefill leg's id -> the client's request
        self._in_transfer = {rep.index: 0 for rep in decode}
        self.transfers = 0
        self.transfer_seconds = 0.0  # summed over requests, queueing included
        for rep in prefill:
            rep.scheduler.on_finish = self._prefilled

    @property
    def outstanding(self) -> int:
        return sum(r.outstanding for r in self.prefill) + sum(r.outstanding for r in self.decode)

    def submit(self, req: SimRequest) -> None:
        """A client's request enters the prefill pool."""
        leg = SimRequest(
            self.env, req.rid, req.send, req.prompt_len, 1, req.content, req.session, False
        )
        leg.reusable = req.reusable
        self._origin[id(leg)] = req
        least_outstanding(self.prefill).submit(leg)

    def _decode_target(self) -> Replica:
        """The decode instance with the fewest requests, counting those in transfer to it."""
        return min(self.decode, key=lambda r: (r.outstanding + self._in_transfer[r.index], r.index))

    def _prefilled(self, leg: SimRequest) -> None:
        """A prefill leg made its token: its KV leaves for a decode instance."""
        req = self._origin.pop(id(leg))
        req.first_scheduled = leg.first_scheduled
        target = self._decode_target()
        now = self.env.now
        start = max(now, self._link_free_at[target.index])
        end = start + self.transfer.link_seconds(req.prompt_len)
        self._link_free_at[target.index] = end
        arrival = end + self.transfer.latency_s
        if self.handoff_s is not None:
            arrival += float(self.handoff_s(req.prompt_len))
        self._in_transfer[target.index] += 1
        self.transfers += 1
        self.transfer_seconds += arrival - now
        self.env.timeout(arrival - now).callbacks.append(
            lambda _, req=req, target=target: self._arrive(req, target)
        )

    def _arrive(self, req: SimRequest, target: Replica) -> None:
        """The KV of all but the last prompt token is in ``target``'s cache."""
        self._in_transfer[target.index] -= 1
        req.computed = max(req.prompt_len - 1, 0)
        target.submit(req)


def prefill_pools(
    env: simpy.Environment, setup, decode: list[Replica], fast_forward: bool = True
) -> DisaggregatedPools:
    """The prefill instances of ``setup`` (a Setup with ``prefill``) in front of its
    ``decode`` replicas; the prefill instances are numbered after the replicas."""
    pre = setup.prefill
    prefill = [
        Replica(
            env,
            setup.engines + i,
            pre.step_model,
            pre.scheduler,
            pre.num_blocks,
            prefix_caching=pre.config.prefix_caching,
            fast_forward=fast_forward,
        )
        for i in range(setup.config.prefill_replicas)
    ]
    sequential = setup.kv_transfer_handoff == "sequential"
    handoff = setup.step_model.frontend_parallel_seconds if sequential else None
    return DisaggregatedPools(env, prefill, decode, setup.kv_transfer, handoff)
