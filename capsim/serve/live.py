"""A deployment simulated against the wall clock: the engine of ``capsim serve``.

Requests that arrive over HTTP enter the same router, replicas, scheduler and step-time
physics that ``capsim predict`` simulates. The SimPy environment is driven from the
asyncio event loop: the loop sleeps until the real time of the next simulated event or
until a request arrives, then runs the simulation up to the present and injects the
arrivals at that instant. So a request is seen by the step scheduled at the moment it
arrives, and each token is delivered at the real time of the step that produced it, plus
the front end's latency (API server, tokenizer, streaming), as ``predict`` adds it to what
a client sees. Simulated time runs ``speedup`` times faster than the wall clock.

Decode runs are simulated step by step (no fast-forward), so every step can stream.
What the model of the server leaves out is said in ``LIMITS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from dataclasses import dataclass

import simpy

from capsim.engine.disaggregation import prefill_pools
from capsim.engine.replica import Replica
from capsim.engine.request import DONE, SimRequest
from capsim.engine.router import Router
from capsim.engine.setup import Setup

WAKE_EARLY_S = 0.002
"""The driving loop's timed sleeps end this long before the next simulated event's real
time and the rest is waited out by yielding to the event loop: a sleep's own wake-up comes
up to a millisecond or two late (the selector's millisecond timeout), which every token
would carry, and a client at ``--speedup 10`` would see ten times over in TTFT."""

HOLD_S = 0.005
"""The simulation runs this far (wall-clock seconds) behind the wall clock, so that a
request enters it at the instant it reached the server, not when the HTTP handler and the
event loop got to it (their work, up to this long, is not counted as the server's)."""

LIMITS = (
    "generated text is filler (the word 'tok' per token), clearly not a model's output; "
    "every request generates exactly its max_tokens (there is no end-of-sequence token); "
    "a request whose client disconnects is aborted at the next step boundary, as vLLM "
    "aborts it"
)


@dataclass
class TokenEvent:
    """Progress of one request, as its stream delivers it."""

    tokens: int  # output tokens generated so far (cumulative)
    finished: bool
    sim_time: float  # engine time (s) the step that produced them ended


class LiveRequest:
    """A request in the simulation with the queue its HTTP handler reads."""

    __slots__ = ("delay_s", "emitted", "max_tokens", "prompt_tokens", "queue", "sim")

    def __init__(self, prompt_tokens: int, max_tokens: int, delay_s: float):
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self.emitted = 0  # output tokens handed to the stream so far
        self.delay_s = delay_s  # front-end latency, simulated seconds
        self.sim: SimRequest | None = None


class LiveDeployment:
    """The simulated deployment of ``setup``, advanced in real time (``speedup`` x)."""

    def __init__(self, setup: Setup, speedup: float = 1.0):
        if not speedup > 0 or not math.isfinite(speedup):
            raise ValueError(f"speedup must be a positive number, not {speedup}")
        self.setup = setup
        self.speedup = speedup
        self.env = simpy.Environment()
        cfg = setup.config
        self.replicas = [
            Replica(
                self.env,
                i,
                setup.step_model,
                setup.scheduler,
                setup.num_blocks,
                prefix_caching=cfg.prefix_caching,
                fast_forward=False,
            )
            for i in range(setup.engines)
        ]
        self._finished: list[SimRequest] = []  # finished since the last step was seen
        for replica in self.replicas:
            replica.clients_react_at_once = False
            replica.step_listener = self._after_step
            replica.scheduler.on_finish = self._finished.append
        front = self.replicas
        if setup.prefill is not None:  # disaggregated: the replicas only decode
            pools = prefill_pools(self.env, setup, self.replicas, fast_forward=False)
            for replica in pools.prefill:
                replica.clients_react_at_once = False
            front = [pools]
        self.router = Router(
            self.env,
            front,
            cfg.router if setup.engines > 1 else "round_robin",
            cfg.router_latency_s if setup.engines > 1 else 0.0,
            cfg.router_capacity_rps if setup.engines > 1 else None,
            setup.step_model.api_server_seconds,
        )
        self._frontend = setup.step_model.frontend_parallel_seconds
        self._ids = itertools.count()
        self._live: dict[int, LiveRequest] = {}
        self._pending: list[tuple[LiveRequest, float]] = []  # with its arrival, sim s
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._origin = 0.0
        self.finished_listeners: list = []  # called with (LiveRequest) when one finishes
        self.aborted_listeners: list = []  # called with (LiveRequest) when one is aborted
        self._aborting: dict[int, LiveRequest] = {}  # by rid: dropped at the next step end
        self.max_lag_s = 0.0  # the most the simulation ran behind the wall clock, real s
        self.steps = 0
        # capsim serve's own HTTP round trip, real s (capsim.serve.transport): tokens are
        # handed to the stream this much before the simulated front end would deliver them
        # (never before the step that made them), so a client sees the simulated front
        # end's latency once, not that plus the server's own
        self.transport_s = 0.0
        # the early wake-up of the timed sleeps (WAKE_EARLY_S); an event loop on a virtual
        # clock, which wakes exactly, sets 0
        self.wake_early_s = WAKE_EARLY_S

    # --- time
    def sim_time(self, real: float) -> float:
        """Simulated seconds at loop time ``real`` (HOLD_S behind the wall clock)."""
        return (real - self._origin - HOLD_S) * self.speedup

    def real_time(self, sim: float) -> float:
        """Loop time at simulated second ``sim``."""
        return self._origin + HOLD_S + sim / self.speedup

    # --- requests
    def submit(
        self, prompt_tokens: int, max_tokens: int, arrived: float | None = None
    ) -> LiveRequest:
        """A new request of ``prompt_tokens`` prompt tokens generating ``max_tokens``,
        which reached the server at loop time ``arrived`` (default: now); it enters the
        simulation at that instant (the driving loop wakes up for it)."""
        live = LiveRequest(prompt_tokens, max_tokens, float(self._frontend(float(prompt_tokens))))
        if arrived is None:
            arrived = self._loop.time() if self._loop is not None else self._origin
        # the part of the server's own HTTP round trip that the simulated front end's
        # latency cannot absorb (at a high speedup it is shorter in wall-clock terms) is
        # taken off the arrival: the request enters that much earlier, within the hold
        unabsorbed = max(0.0, self.transport_s - live.delay_s / self.speedup)
        self._pending.append((live, self.sim_time(arrived - min(unabsorbed, HOLD_S))))
        self._wake.set()
        return live

    def _inject(self) -> None:
        for live, at in self._pending:
            if at > self.env.now:  # it reached the server within the hold: enter then
                self.env.timeout(at - self.env.now).callbacks.append(
                    lambda _, live=live: self._enter(live)
                )
            else:
                self._enter(live)
        self._pending.clear()

    def _enter(self, live: LiveRequest) -> None:
        rid = next(self._ids)
        req = SimRequest(
            self.env, rid, self.env.now, live.prompt_tokens, live.max_tokens, ("r", rid)
        )
        live.sim = req
        self._live[rid] = live
        self.router.submit(req)

    def abort(self, live: LiveRequest) -> None:
        """The client of ``live`` went away: drop its request and free its KV blocks, as
        vLLM does. A request not yet in the simulation never enters; one in it leaves at
        the end of the step its replica is running (its queue gets no more events)."""
        if live.sim is None:
            self._pending = [(p, at) for p, at in self._pending if p is not live]
            self._aborted(live)
            return
        rid = live.sim.rid
        if self._live.pop(rid, None) is None:
            return  # finished already
        self._aborting[rid] = live
        for replica in self.replicas:
            if replica.waiting_for_work:  # no step runs, so drop it now
                self._drop_aborted(replica)

    def _aborted(self, live: LiveRequest) -> None:
        for listener in self.aborted_listeners:
            listener(live)

    def _drop_aborted(self, replica: Replica) -> None:
        sched = replica.scheduler
        for rid, live in list(self._aborting.items()):
            if live.sim.phase == DONE:  # it finished before the abort took effect
                del self._aborting[rid]
            elif sched.abort(live.sim, self.env.now):
                del self._aborting[rid]
                self._aborted(live)

    def _after_step(self, replica: Replica) -> None:
        self.steps += 1
        if self._aborting:
            self._drop_aborted(replica)
        sched = replica.scheduler
        sched.sync_requests()
        for req in sched.running:
            live = self._live.get(req.rid)
            if live is not None:
                self._emit(live, math.floor(req.generated + 1e-9), False)
        for req in self._finished:
            live = self._live.pop(req.rid, None)
            if live is not None:
                self._emit(live, req.output_len, True)
                for listener in self.finished_listeners:
                    listener(live)
        self._finished.clear()

    def _emit(self, live: LiveRequest, tokens: int, finished: bool) -> None:
        if tokens <= live.emitted and not finished:
            return
        live.emitted = tokens
        event = TokenEvent(tokens, finished, self.env.now)
        due = self.real_time(self.env.now + live.delay_s) - self.transport_s
        assert self._loop is not None
        self._loop.call_at(due, live.queue.put_nowait, event)

    # --- state for /metrics
    def running(self) -> int:
        return sum(len(r.scheduler.running) for r in self.replicas)

    def waiting(self) -> int:
        return sum(len(r.scheduler.waiting) for r in self.replicas)

    def kv_usage(self) -> float:
        """Share of the KV cache's blocks in use, 0-1 (the fullest replica)."""
        return max(
            (r.scheduler.kv.num_blocks - r.scheduler.kv.allocatable) / r.scheduler.kv.num_blocks
            for r in self.replicas
        )

    def preemptions(self) -> int:
        return sum(r.scheduler.preemptions for r in self.replicas)

    def prefix_cache(self) -> tuple[int, int]:
        """Prompt tokens looked up in the prefix cache, and those found there."""
        kvs = [r.scheduler.kv for r in self.replicas]
        return sum(k.query_tokens for k in kvs), sum(k.hit_tokens for k in kvs)

    # --- the driving loop
    async def run(self) -> None:
        """Advance the simulation with the wall clock, forever (cancel to stop)."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._origin = loop.time()
        while True:
            upcoming = self.env.peek()
            if not self._pending:
                timeout = None
                if upcoming != math.inf:
                    timeout = max(0.0, self.real_time(upcoming) - loop.time() - self.wake_early_s)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                if upcoming != math.inf:
                    due = self.real_time(upcoming)
                    while not self._pending and loop.time() < due:
                        await asyncio.sleep(0)  # the last stretch, precisely
            self._wake.clear()
            now = loop.time()
            if upcoming != math.inf:
                self.max_lag_s = max(self.max_lag_s, now - self.real_time(upcoming))
            # arrivals first, at the instants they reached the server (the handler's own
            # work since then must not delay them), then the clock to the present
            self._inject()
            target = self.sim_time(now)
            if target > self.env.now:
                # a marker event brings the clock to the present; stepping (rather than
                # run(until=...)) leaves no stop event behind in the queue
                self.env.timeout(target - self.env.now)
                while self.env.peek() <= target:
                    self.env.step()
            await asyncio.sleep(0)  # let handlers run between bursts of simulation
