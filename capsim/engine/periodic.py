"""A closed loop of equal requests repeats itself: whole periods of its steady state are
laid down as copies instead of simulated again.

In a closed loop (no think time) of requests that all have the same prompt and output
lengths, on one replica, what happens after a moment depends only on the state at that
moment, read relative to its time: the running rows (tokens in KV, generated, blocks,
prefill progress), the waiting queue, the free KV blocks, the requests on their way to the
engine, the events already scheduled (a client's next send after the front end's latency,
the API server's queue), and how long ago each request in flight was sent, first
scheduled and gave its first token. Every request the clients send is the same until the
workload's requests run out. So when the state after a step that finished requests
(a *checkpoint*) equals the state at an earlier checkpoint, ``dt`` seconds and ``dn``
finished requests before, the simulation from then on repeats the one between them,
``dt`` later and with request ids ``dn`` higher, for as long as the clients have requests
to send. The skipper then lays down ``m`` whole periods at once (``m`` as many as the
requests left to send allow): the ``dn`` requests that finished in the period are logged
``m`` more times, each copy ``dt`` later than the one before; the decode steps' inter-token
latencies of the period count ``m`` times more; the clock, the events scheduled and the
requests in flight move ``m * dt`` later; and the counts (steps, events, preemptions, KV
lookups) grow by ``m`` periods. The simulation then goes on from there (the last partial
period and the drain as the workload's requests run out). Figures are those of simulating
every request, to the rounding of float times (``TIME_TOLERANCE_S``).

The steady state is not reached at once: a first burst of C equal requests spreads by
about one decode step a round, so below the KV limit the state repeats after about
C x (C - 1) finished requests (RTX 3090, Qwen3-Coder-30B-A3B, 1,024 in / 512 out: 90 at
C=10, 870 at C=30), and a level that preempts takes longer (1,333 at C=31, 9,351 at C=40,
none in 20,000 at C=45); what comes before is simulated as always. The skipper
applies only where every piece of state above is accounted for (``applies``): a closed
loop of fixed lengths on one replica of vLLM's scheduler (no SGLang admission reserve or
socket polling interval), no gateway, nothing reusable in the prefix cache, and a plain
SimPy environment (never ``capsim serve``'s wall-clock one).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np
import simpy

from capsim.engine.request import SimRequest

TIME_TOLERANCE_S = 1e-9
"""Two checkpoints' relative times (s) match when they differ by at most this: the same
durations summed from different start times round differently in the last bits (about
1e-14 s at the times a simulation reaches), and no decision turns on a nanosecond."""

CANDIDATES_PER_STATE = 8
"""Earlier checkpoints kept per discrete state (the times decide among them)."""

MAX_CHECKPOINTS = 1_024
"""Checkpoints kept in all (each holds its state, a few KB at C=64) before the history
starts again: periods of up to about this many finishing steps are found, and memory stays
bounded on a loop that never repeats."""

MAX_ROW_HASHES = 65_536
"""Hashes of the scheduler's rows remembered (a whole state is read only where its rows'
hash was seen before) before that memory starts again."""


STATE_VALUES_PER_REQUEST = 30
"""How much reading of whole states (times read, summed over the checkpoints) a level may
spend looking for its period, per request it sends: reading a running request's key and
times costs about 3-5 us and simulating a request about 300 us, so the search costs at
most about a sixth of what it could save. A level far shorter than its transient
(capacity's 8,192 requests at C=1,024, where the scheduler's rows recurred thousands of
times without the state repeating) stops looking instead of spending most of its time
reading states of a thousand requests."""

MAX_STATE_VALUES = 1_000_000
"""At most this much reading of whole states in one level, whatever its size: the states
read are kept as checkpoints, each holding every request in flight, so the per-request
budget alone grows with clients x requests (tens of thousands of clients, each state tens
of thousands of requests); a million times and their keys stay near 100 MB, and a level of
that many clients is saturated, where the period search seldom pays."""


@dataclass
class Checkpoint:
    """What a period is measured from: the clock, the relative times, and the counts."""

    now: float
    times: np.ndarray
    sent: int
    output_tokens_sent: int
    steps: int
    events: int
    busy_time: float
    preemptions: int
    query_tokens: int
    hit_tokens: int
    log_mark: tuple
    itl_mark: tuple


def applies(workload, replicas: list, router) -> bool:
    """Whether period skipping is exact for this simulation (see the module text)."""
    if workload.kind != "closed" or len(replicas) != 1:
        return False
    if workload.input.kind != "fixed" or workload.output.kind != "fixed":
        return False
    rep = replicas[0]
    env = rep.env
    if type(env) is not simpy.Environment or not hasattr(env, "_queue"):
        return False
    return (
        rep.recv_interval == 1
        and rep.scheduler.reserve is None
        and not rep.settle_every_step
        and rep.step_listener is None
        and router.gateway is None
        and router.latency_s == 0
    )


class PeriodSkipper:
    """Watches one replica's checkpoints and skips whole periods once the state repeats
    (``checkpoint`` is called by the replica after each step that finished requests)."""

    def __init__(self, env: simpy.Environment, replica, driver, router, log, itl):
        self.env = env
        self.replica = replica
        self.scheduler = replica.scheduler
        self.driver = driver
        self.router = router
        self.log = log
        self.itl = itl
        self.history: dict[tuple, list[Checkpoint]] = {}
        self.rows_seen: set[int] = set()
        self.kept = 0  # checkpoints in history
        self.skipped_requests = 0
        self.done = False  # after a skip, once nothing is left to send, or out of budget
        self.state_values_left: int | None = None  # STATE_VALUES_PER_REQUEST x requests

    def checkpoint(self) -> None:
        if self.done:
            return
        driver = self.driver
        left = driver.requests_left_to_send()
        if left <= 0:
            self.done = True
            return
        sched = self.scheduler
        if sched.kv.streams:
            return  # a reusable prefix in the cache: its contents would be state too
        # the scheduler's rows first (a few microseconds): the whole state is read only
        # where they were seen before, which in a transient they seldom are
        # (a hash collision only costs reading a whole state that then does not match)
        rows = sched.period_key()
        seen = hash((rows, len(sched.waiting), len(self.driver.in_flight)))
        if seen not in self.rows_seen:
            if len(self.rows_seen) >= MAX_ROW_HASHES:
                self.rows_seen.clear()
            self.rows_seen.add(seen)
            return
        if self.state_values_left is None:
            budget = STATE_VALUES_PER_REQUEST * (left + driver.sent)
            self.state_values_left = min(budget, MAX_STATE_VALUES)
        key, times = self._state(rows)
        self.state_values_left -= len(times)
        if self.state_values_left <= 0:
            self.done = True  # this one is still compared; no whole state is read after it
        now = self.env.now
        candidates = self.history.get(key)
        if candidates is not None:
            for earlier in reversed(candidates):
                same = np.allclose(times, earlier.times, rtol=0.0, atol=TIME_TOLERANCE_S)
                if same and self._skip(earlier, left):
                    return
        if self.kept >= MAX_CHECKPOINTS:
            self.history.clear()
            self.kept = 0
        entries = self.history.setdefault(key, [])
        entries.append(self._point(now, times))
        self.kept += 1
        if len(entries) > CANDIDATES_PER_STATE:
            del entries[0]
            self.kept -= 1

    def _state(self, rows: tuple) -> tuple[tuple, np.ndarray]:
        """The discrete state (exact) and the relative times (s) of this moment, given the
        scheduler's ``period_key``."""
        env, sched, driver = self.env, self.scheduler, self.driver
        now = env.now
        sent = driver.sent + driver.first_rid
        requests: list[tuple] = []
        times: list[float] = []
        for req in sched.running:
            requests.append(_request_key(req, sent))
            _times(req, now, times)
        requests.append(("waiting",))
        for req in sched.waiting:
            requests.append(_request_key(req, sent, waiting=True))
            _times(req, now, times)
        requests.append(("in transit",))
        for req in driver.in_flight.values():
            if req.replica < 0:
                requests.append((sent - req.rid,))
                _times(req, now, times)
        rep = self.replica
        requests.append(("held back",))  # by async scheduling (Replica.admits_a_step_late)
        for at, req in rep._lagged:
            requests.append(_request_key(req, sent, waiting=True))
            _times(req, now, times)
            times.append(now - at)
        times.append(now - rep._step_start if math.isfinite(rep._step_start) else -1.0)
        events: list[tuple] = []
        for when, priority, _, event in sorted(env._queue, key=_event_order):
            callbacks = event.callbacks or ()
            events.append((priority, *(getattr(cb, "__name__", "?") for cb in callbacks)))
            times.append(when - now)
        times.append(max(max(self.router._api_free_at.values(), default=0.0) - now, 0.0))
        key = (
            rows,
            self.replica._cut_on_arrival,
            tuple(requests),
            tuple(events),
        )
        return key, np.array(times)

    def _point(self, now: float, times: np.ndarray) -> Checkpoint:
        rep, sched, driver = self.replica, self.scheduler, self.driver
        return Checkpoint(
            now=now,
            times=times,
            sent=driver.sent,
            output_tokens_sent=driver.output_tokens_sent,
            steps=rep.steps,
            events=rep.events,
            busy_time=rep.busy_time,
            preemptions=sched.preemptions,
            query_tokens=sched.kv.query_tokens,
            hit_tokens=sched.kv.hit_tokens,
            log_mark=self.log.mark(),
            itl_mark=self.itl.mark(),
        )

    def _skip(self, earlier: Checkpoint, left: int) -> bool:
        """Lay down as many whole periods since ``earlier`` as the requests left to send
        (``left``) allow; False where the period cannot be repeated."""
        rep, sched, driver, env = self.replica, self.scheduler, self.driver, self.env
        now = env.now
        rows = self.log.rows_since(earlier.log_mark)  # the requests finished since
        samples = self.itl.samples_since(earlier.itl_mark)
        if rows is None or samples is None:  # folded past a buffer meanwhile
            return False
        sent = driver.sent - earlier.sent
        period_s = now - earlier.now
        if not len(rows) or sent != len(rows) or period_s <= 0:
            return False
        periods = left // sent
        if periods < 1:
            return False
        self.done = True
        shift_s = periods * period_s
        shift_n = periods * sent
        self.log.repeat(rows, periods, sent, period_s)
        self.itl.repeat(samples, periods)
        # the clock and everything that holds an absolute time moves on
        env._now = now + shift_s
        queue = [(when + shift_s, priority, eid, ev) for when, priority, eid, ev in env._queue]
        env._queue[:] = queue
        heapq.heapify(env._queue)
        free_at = self.router._api_free_at
        for key in free_at:
            free_at[key] += shift_s
        rep._lagged = [(at + shift_s, req) for at, req in rep._lagged]
        rep._step_start += shift_s
        tokens = periods * (driver.output_tokens_sent - earlier.output_tokens_sent)
        driver.skip_ahead(shift_n, shift_s, tokens)
        sched.submitted += shift_n
        sched.preemptions += periods * (sched.preemptions - earlier.preemptions)
        sched.kv.query_tokens += periods * (sched.kv.query_tokens - earlier.query_tokens)
        sched.kv.hit_tokens += periods * (sched.kv.hit_tokens - earlier.hit_tokens)
        rep.steps += periods * (rep.steps - earlier.steps)
        rep.events += periods * (rep.events - earlier.events)
        rep.busy_time += periods * (rep.busy_time - earlier.busy_time)
        if driver.progress is not None:
            driver.progress.advance(shift_n)
        self.skipped_requests = shift_n
        self.history.clear()
        self.rows_seen.clear()
        self.kept = 0
        return True


def _event_order(entry: tuple) -> tuple:
    return entry[:3]


def _times(req: SimRequest, now: float, out: list[float]) -> None:
    out.append(now - req.send)
    out.append(0.0 if req.first_scheduled is None else now - req.first_scheduled)
    out.append(0.0 if req.first_token is None else now - req.first_token)


def _request_key(req: SimRequest, sent: int, waiting: bool = False) -> tuple:
    """A request's own fields and its place in send order (``sent``: the next id). For a
    running one, only what its row does not hold (the row's are in the scheduler's
    period_key); a waiting one adds its progress (a preempted request keeps it)."""
    key = (
        sent - req.rid,
        req.phase,
        req.prompt_len,
        req.output_len,
        req.computed,
        req.prefill_target,
        req.cached_len,
        req.cached_tokens,
        req.first_scheduled is None,
        req.first_token is None,
    )
    return (*key, req.generated, req.kv_tokens, req.blocks) if waiting else key
