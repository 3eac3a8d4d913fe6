"""One serving replica (a tensor-parallel group) as a SimPy process.

The replica loops: schedule a step, ask the physics how long it takes, wait that long,
apply it. When the next steps are identical decode steps (every running request decodes
and no waiting request could be admitted), it asks the physics for the whole run of
steps up to the next finish or block shortage at once and waits once; an arrival that
could change the schedule interrupts the wait and cuts the run at the step boundary after
it, exactly where a step-by-step simulation would have admitted it. A step that finishes
nobody is applied when it is scheduled (nothing outside the scheduler can tell) and waits
in the same event as the decode run after it. So simulation events grow with requests,
not with tokens.

Same-instant order: a client whose request finishes may send its next one at that very
time. The replica lets such clients act before it schedules again (EndOfInstant), so a
request sent at time t is always in the step scheduled at t, whichever way the
simulation runs (tested against step-by-step simulation, across replicas too), unless
the engine schedules asynchronously: then a request that reaches it while a step runs is
held back until the step after that one (``admits_a_step_late``), as vLLM's batch queue
and SGLang's overlap loop take it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import simpy

from capsim.engine.kv_cache import KVCache
from capsim.engine.request import SimRequest
from capsim.engine.request_log import ItlLog
from capsim.engine.scheduler import Scheduler, SchedulerConfig
from capsim.physics.step import StepModel

LATE = 2
"""SimPy priority below NORMAL (1): an event at this priority runs after every normal event
of the same instant, including those the normal ones schedule for that instant."""


class EndOfInstant(simpy.events.Event):
    """An event that fires at the current time after everything else at that time (what
    SimPy's own Timeout does with delay 0, at LATE priority instead of NORMAL)."""

    def __init__(self, env: simpy.Environment):
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, LATE)


class Replica:
    """A TP group running one engine: scheduler, KV cache and step loop."""

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        step_model: StepModel,
        config: SchedulerConfig,
        num_blocks: int,
        prefix_caching: bool = True,
        fast_forward: bool = True,
        itl: ItlLog | None = None,
        itl_slot: int = 0,
    ):
        """Decode steps' inter-token latencies go to ``itl`` (slot ``itl_slot``; a log of
        its own by default)."""
        self.env = env
        self.index = index
        self.step_model = step_model
        self.scheduler = Scheduler(
            config,
            KVCache(
                num_blocks,
                config.block_size,
                prefix_caching,
                config.state_blocks,
                config.host_kv_blocks,
            ),
        )
        self.fast_forward = fast_forward
        # whether clients may send at the instant a request finishes (the driver says)
        self.clients_react_at_once = True
        # with several replicas, another replica's finish can make a client send here at
        # the instant a step of this one ends: then every step waits for the end of its
        # instant, so a request sent at time t is always seen by a step scheduled at t
        self.settle_every_step = False
        self._wake: simpy.Event | None = None
        self._cut_on_arrival = False
        self.steps = 0
        self.events = 0
        self.busy_time = 0.0
        # decode-step durations per token and how many sequences each served, for ITL
        self.itl = ItlLog(1) if itl is None else itl
        self.itl_slot = 0 if itl is None else itl_slot
        # steps that ran without the decoding sequences (SGLang's prefill batches), as
        # (seconds, sequences that waited through it): they go into those sequences' next
        # token gap
        self._stalls: list[tuple[float, int]] = []
        # called with this replica after every step is applied (capsim serve streams
        # tokens from it); None in batch simulations
        self.step_listener: Callable[[Replica], None] | None = None
        # called after every step that finished requests, once the clients that send at
        # that instant have (engine/periodic.py watches for a repeating state); None: not
        self.after_finishes: Callable[[], None] | None = None
        # requests sent but not yet taken by the scheduler (recv_interval_steps > 1), and
        # the decode steps run since it last took them (SGLang's recv skipper counter)
        self.recv_interval = max(1, config.recv_interval_steps)
        self._inbox: list[SimRequest] = []
        self._recv_count = self.recv_interval
        # async scheduling (vLLM's batch queue of two steps, SGLang's overlap loop):
        # step n+1 is scheduled as soon as step n is launched, so a request that reaches
        # the engine while step n runs is taken into step n+2 at the earliest; until the
        # start of the step after the one it arrived in it waits here, with its arrival
        # time. The step that runs now, or ran last, started at ``_step_start`` (s).
        self.admits_a_step_late = step_model.admits_a_step_late
        self._lagged: list[tuple[float, SimRequest]] = []
        self._step_start = -math.inf
        # what the step loop asks of the step model every step, fixed for a deployment
        self._speculates = step_model.deployment.spec is not None
        self._takes_moments = step_model.takes_moments
        self.process = env.process(self.run())

    @property
    def outstanding(self) -> int:
        s = self.scheduler
        return len(s.waiting) + len(s.running) + len(self._inbox) + len(self._lagged)

    def submit(self, req: SimRequest) -> None:
        self._enter(req)

    def _enter(self, req: SimRequest) -> None:
        """``req`` reaches the engine's queue (or the socket it polls)."""
        req.replica = self.index
        if self.admits_a_step_late and self._wake is None:
            # busy: the next step is already scheduled (admits_a_step_late)
            self._lagged.append((self.env.now, req))
            if self._held_back_admissible():
                self.scheduler.note_held_back_room()
        elif self.recv_interval > 1 and self._wake is None:
            # busy: the request waits on the socket until the scheduler next polls it
            self._inbox.append(req)
        else:
            self.scheduler.submit(req)
        if not self._cut_on_arrival:
            return
        self._cut_on_arrival = False
        if self._wake is not None:  # idle
            self._wake.succeed()
        else:  # in a decode run: cut it at the next step boundary
            self.process.interrupt()

    @property
    def waiting_for_work(self) -> bool:
        """Whether the replica is between steps, asleep until a request arrives."""
        return self._wake is not None

    def _record_itl(self, durations: np.ndarray, sequences: int) -> None:
        if sequences <= 0 or durations.size == 0:
            return
        advance = self.scheduler.config.decode_advance
        per_token = durations if advance == 1.0 else durations / advance
        if self._stalls:  # the first step's gap includes the stalls
            self._record_itl_step(float(durations[0]), sequences)
            per_token = per_token[1:]
            if not per_token.size:
                return
        self.itl.add_run(self.itl_slot, per_token, sequences)

    def _record_itl_step(self, duration: float, sequences: int) -> None:
        advance = self.scheduler.config.decode_advance
        if self._stalls:
            # the k-th sequence to have waited sat out every stall that k or more sat out
            # (those that waited longest are taken to be the ones that waited at each)
            waited = min(max(w for _, w in self._stalls), sequences)
            for k in range(1, waited + 1):
                extra = sum(d for d, w in self._stalls if w >= k)
                self.itl.add_step(self.itl_slot, (duration + extra) / advance, 1)
            sequences -= waited
            self._stalls.clear()
            if sequences <= 0:
                return
        self.itl.add_step(self.itl_slot, duration / advance, sequences)

    def _note_stall(self, duration: float, waiting: int) -> None:
        """A step of ``duration`` seconds ran while ``waiting`` decoding sequences sat it
        out: their next token comes that much later."""
        if waiting > 0:
            self._stalls.append((duration, waiting))

    def _receive(self) -> None:
        """Hand the requests waiting on the socket to the scheduler once the interval's
        decode steps have run (or the engine has nothing to run)."""
        if self._inbox and (self._recv_count >= self.recv_interval or self.scheduler.idle):
            for req in self._inbox:
                self.scheduler.submit(req)
            self._inbox.clear()
            self._recv_count = 0
        elif self._recv_count >= self.recv_interval:
            self._recv_count = 0

    def _steps_to_receive(self, head_weight: int = 0) -> int:
        """Steps from now (a head step of ``head_weight`` first, if any) until the
        scheduler next polls for requests; a large number when it polls every step or
        nothing waits on the socket."""
        if self.recv_interval <= 1:
            return 1 << 30
        if head_weight:
            after_head = self._recv_count + head_weight
            return 1 if after_head >= self.recv_interval else 1 + self.recv_interval - after_head
        return max(self.recv_interval - self._recv_count, 1)

    def _next_poll(self, boundary: int, first: int) -> int:
        """The first step boundary at or after ``boundary`` at which the scheduler polls,
        given that it first polls at ``first`` and then every interval."""
        n = self.recv_interval
        if n <= 1:
            return boundary
        if boundary <= first:
            return first
        return first + -(-(boundary - first) // n) * n

    def _step_weight(self, step) -> int:
        """What a step adds to the poll counter: 1 for a decode-only step, the whole
        interval for one with prefill work (SGLang weighs a prefill 1,000)."""
        return 1 if step.count == step.decoding else self.recv_interval

    def _take_lagged(self) -> None:
        """Hand the scheduler the requests held back by async scheduling that reached the
        engine before the last step started (the step now being scheduled was, in the
        engine, scheduled when that one was launched); every one of them when nothing
        runs or waits (no step is in flight to wait behind)."""
        sched = self.scheduler
        if sched.running or sched.waiting:
            cutoff = self._step_start
            taken = len(self._lagged)
            for i, (at, _) in enumerate(self._lagged):
                if at > cutoff:
                    taken = i
                    break
        else:
            taken = len(self._lagged)
        if not taken:
            return
        for _, req in self._lagged[:taken]:
            if self.recv_interval > 1:
                self._inbox.append(req)
            else:
                sched.submit(req)
        del self._lagged[:taken]

    def _lag_may_admit(self) -> bool:
        """Whether a request held back by async scheduling could change the schedule once
        taken (nobody waits ahead of it and there is room): then the steps run one by one
        until it is, rather than as one decode run it would have to cut."""
        sched = self.scheduler
        return bool(self._lagged) and not sched.waiting and sched.can_admit_more()

    def _held_back_admissible(self) -> bool:
        """Whether the first request held back by async scheduling would be admitted now
        were it in the queue (nobody waits ahead of it, and the sequence limit, the step's
        budget and the KV cache take it): only then does its being held back change what
        the engine does (Scheduler.note_held_back_room)."""
        sched = self.scheduler
        if not self._lag_may_admit():
            return False
        sched.waiting.appendleft(self._lagged[0][1])
        try:
            return not sched.head_blocked()
        finally:
            sched.waiting.popleft()

    def run(self):
        env, sched, sm = self.env, self.scheduler, self.step_model
        while True:
            if self.settle_every_step:
                self.events += 1
                yield EndOfInstant(env)
            if self._lagged:
                self._take_lagged()
                if self._held_back_admissible():
                    sched.note_held_back_room()
            if self.recv_interval > 1:
                self._receive()
            now = env.now  # until the next yield
            if sched.idle:
                sched.note_dry(now)
                yield from self._wait_for_work()
                continue
            if (
                self.fast_forward
                and not (self._lagged and self._lag_may_admit())
                and sched.steady_decode(now)
            ):
                m = sched.run_length()
                if self._inbox:
                    m = min(m, self._steps_to_receive())
                if m >= 2:
                    yield from self._decode_run(m)
                    continue
            step = sched.schedule(now)
            if self._lagged and self._held_back_admissible():
                # the step admitted everyone waiting and still had room: a request held
                # back by async scheduling would have joined it had it been sent earlier,
                # as it is at a higher level (a hypothesis example of 2026-12-01: C=9 with
                # 11 requests admitted request 9 alone where C=10 admitted 9 and 10), so
                # this run's service is not the levels' above (Scheduler.note_held_back_room)
                sched.note_held_back_room()
            count, decoding = step.count, step.decoding
            if not count:
                # nothing fits (e.g. a prompt larger than the whole KV cache): wait for work
                yield from self._wait_for_work()
                continue
            self._step_start = now
            spec = self._speculates
            if step.moments is not None and self._takes_moments:
                duration = sm.moment_step_time(*step.moments)
            else:
                logits = None
                if spec:
                    # verification samples every drafted position; a prefill chunk samples one
                    logits = decoding * sm.decode_width + count - decoding
                duration = sm.scheduled_step_time(
                    step.new_tokens,
                    step.context,
                    logits_tokens=logits,
                    draft_context=step.decode_context() if spec and decoding else None,
                )
            # decoding sequences this step leaves out (a prefill batch of its own)
            sat_out = sched.decoding_count - decoding
            if sched.load_tokens:
                duration += sched.take_load_seconds()  # KV loaded from system RAM first
            applied = self.fast_forward and not sched.may_finish(step)
            # what the step adds to the poll counter (_step_weight)
            weight = 1 if count == decoding else self.recv_interval
            if applied:
                # nobody finishes, so nothing outside the scheduler sees the step end:
                # apply it now, and when identical decode steps follow, wait for the
                # step and that run in one event
                sched.complete(step, now + duration)
                if not (self._lagged and self._lag_may_admit()) and sched.steady_decode(now):
                    m = sched.run_length()
                    if self._inbox:
                        m = min(m, self._steps_to_receive(weight) - 1)
                    if m >= 1:
                        self._note_stall(duration, sat_out)
                        yield from self._decode_run(m, duration, decoding, weight)
                        continue
            self.events += 1
            yield env.timeout(duration)
            self._recv_count += weight
            self.steps += 1
            self.busy_time += duration
            if decoding:
                self._record_itl_step(duration, decoding)
            self._note_stall(duration, sat_out)
            finished = [] if applied else sched.complete(step, env.now)
            if self.step_listener is not None:
                self.step_listener(self)
            if finished:
                yield from self._let_clients_react()

    def _wait_for_work(self):
        """Sleep until a request arrives."""
        self._wake = self.env.event()
        self._cut_on_arrival = True
        self.events += 1
        yield self._wake
        self._wake = None

    def _decode_run(
        self, m: int, head: float | None = None, head_decoding: int = 0, head_weight: int = 1
    ):
        """Wait for ``m`` identical decode steps in one event, after a ``head`` step of
        that duration (seconds) already applied to the scheduler, if given (adding
        ``head_weight`` to the poll counter). An arrival that could change the schedule
        cuts the wait at the next step boundary at which the scheduler polls for it."""
        env, sched = self.env, self.scheduler
        running = sched.running
        context = sched.decode_contexts()
        times = self.step_model.decode_run_times(context, m)
        lead = 0 if head is None else 1
        total = m + lead
        if head is None:
            ends = np.add.accumulate(times)
        else:  # the head step, then the run: one buffer, summed in place
            ends = np.empty(total)
            ends[0] = head
            ends[1:] = times
            np.add.accumulate(ends, out=ends)
        start = env.now
        # an arrival joins the back of the queue: it can change the schedule only if
        # nobody waits ahead of it and there is room for another sequence; it then
        # interrupts the wait (see submit)
        self._cut_on_arrival = not sched.waiting and sched.can_admit_more()
        # the first boundary at which the scheduler polls its socket (every one by default)
        poll = self._steps_to_receive(head_weight if head is not None else 0)
        self.events += 1
        done = total
        try:
            yield env.timeout(float(ends[-1]))
            self._cut_on_arrival = False
        except simpy.Interrupt:
            elapsed = env.now - start
            j = int(ends.searchsorted(elapsed - 1e-15, side="left"))
            done = min(self._next_poll(j + 1, poll), total)
            remaining = float(ends[done - 1]) - elapsed
            if remaining > 0:
                yield env.timeout(remaining)
        if self.recv_interval > 1:
            if done < poll:
                self._recv_count += done - lead + (head_weight if lead else 0)
            else:  # polled at step `poll` and every interval after it
                since = (done - poll) % self.recv_interval
                self._recv_count = since or self.recv_interval
        self.steps += done
        self.busy_time += float(ends[done - 1])
        # the last step of the run started one step before its end
        self._step_start = start + (float(ends[done - 2]) if done >= 2 else 0.0)
        if head is not None and head_decoding:
            self._record_itl_step(head, head_decoding)
        run_steps = done - lead
        if run_steps <= 0:
            return
        self._record_itl(times[:run_steps], len(running))
        finished = sched.advance_decode(run_steps, env.now, start + float(ends[lead]))
        if self.step_listener is not None:
            self.step_listener(self)
        if finished:
            yield from self._let_clients_react()

    def _let_clients_react(self):
        """After requests finish, let clients that send their next request at the same
        instant (closed loops) do so before the next step is scheduled. Costs an event, so
        it is skipped where no client reacts at once (open loops, traces, agents that
        all think). Then ``after_finishes``, if set."""
        if self.clients_react_at_once and not self.settle_every_step:
            self.events += 1
            yield EndOfInstant(self.env)
        if self.after_finishes is not None:
            self.after_finishes()
