"""A continuous-batching scheduler that behaves like vLLM's V1 engine.

Each step (vLLM ``Scheduler.schedule``):

1. Running requests, oldest first, each get their tokens within the step's token budget
   (``max_num_batched_tokens``): a decode gets 1 token (k + 1 with speculative decoding),
   a request still in prefill gets its next chunk. If the KV cache cannot hold a request's
   new tokens, the most recently admitted running request is preempted (its blocks freed,
   to be recomputed later: vLLM's recompute preemption) until it fits.
2. If nothing was preempted, waiting requests are admitted in arrival order while the
   budget, ``max_num_seqs`` and the KV cache allow; prefix-cache hits count as already
   computed, and the first chunk of the rest is scheduled (chunked prefill).

After the step, prefill chunks advance; a request whose prefill completes samples its
first token; decoding requests gain one token (the expected accepted tokens with
speculation); requests that reached their output length finish and release their blocks.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from capsim.engine.kv_cache import KVCache
from capsim.engine.request import DECODE, DONE, PREFILL, WAITING, SimRequest

FINISH_TOLERANCE = 1e-9
"""Fractional token progress (speculative decoding) within this of the output length
counts as finished, so step-by-step and fast-forwarded runs agree despite rounding."""


@dataclass
class SchedulerConfig:
    """Engine limits (vLLM flags of the same names)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    decode_width: int = 1  # tokens per decoding sequence per step (k + 1 with speculation)
    decode_advance: float = 1.0  # expected tokens gained per decode step


@dataclass
class ScheduledStep:
    """What one step runs."""

    requests: list[SimRequest] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)
    context: list[float] = field(default_factory=list)
    decoding: int = 0  # how many of the requests are decoding

    @property
    def empty(self) -> bool:
        return not self.requests


class Scheduler:
    """Waiting queue, running list and KV cache of one replica."""

    def __init__(self, config: SchedulerConfig, kv: KVCache):
        self.config = config
        self.kv = kv
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.preemptions = 0
        self.finished: list[SimRequest] = []

    # ------------------------------------------------------------------ queries

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def can_admit_more(self) -> bool:
        """Could a newly arrived request change the next step's schedule?"""
        return len(self.running) < self.config.max_num_seqs

    def steady_decode(self) -> bool:
        """True when the next steps are identical decode steps until an event: every
        running request decodes, the batch fits the token budget, and no waiting request
        can be admitted (none waits, the batch is at max_num_seqs, or the head of the
        queue does not fit; during a decode run free blocks only shrink, so a head that
        does not fit now cannot be admitted before a request finishes)."""
        if not self.running:
            return False
        width = self.config.decode_width
        if len(self.running) * width > self.config.max_num_batched_tokens:
            return False
        if any(r.phase != DECODE for r in self.running):
            return False
        return not self.waiting or not self.can_admit_more() or self.head_blocked()

    def head_blocked(self) -> bool:
        """Whether the first waiting request could not be admitted in the next step."""
        cfg = self.config
        budget = cfg.max_num_batched_tokens - len(self.running) * cfg.decode_width
        if budget <= 0:
            return True
        req = self.waiting[0]
        hits = 0
        if req.computed == 0 and not req.cached_len:
            hits = self.kv.cached_prefix(req)
        computed = max(req.computed, hits * cfg.block_size)
        n = min(req.prefill_target - computed, budget)
        need = math.ceil((computed + n) / cfg.block_size) - req.total_blocks - hits
        return need > self.kv.allocatable - self.kv.evictable_among(req, hits)

    # ------------------------------------------------------------------ one step

    def _blocks_needed(self, req: SimRequest, tokens_after: float) -> int:
        return math.ceil(tokens_after / self.config.block_size) - req.total_blocks

    def _preempt(self, victim: SimRequest) -> None:
        self.kv.release(victim)
        victim.phase = WAITING
        victim.prefill_target = victim.prompt_len + int(victim.generated)
        victim.computed = 0
        victim.kv_tokens = 0.0
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)

    def schedule(self, now: float) -> ScheduledStep:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        step = ScheduledStep()
        preempted = False
        running = self.running
        kv = self.kv
        bs = cfg.block_size
        width = cfg.decode_width
        requests, new_tokens, contexts = step.requests, step.new_tokens, step.context
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            if req.phase == DECODE:
                n = width
                if n > budget:
                    break
                context = req.kv_tokens
                after = context + n
            else:
                n = min(req.prefill_target - req.computed, budget)
                context = float(req.computed)
                after = req.computed + n
            need = -(-after // bs) - req.blocks - req.cached_len  # ceil division
            if need > 0 and not kv.allocate(req, int(need)):
                while True:
                    victim = running.pop()
                    self._preempt(victim)
                    preempted = True
                    if victim is req or kv.allocate(req, int(need)):
                        break
                if victim is req:
                    break  # the request itself was preempted: it was the last one running
            requests.append(req)
            new_tokens.append(n)
            contexts.append(context)
            if req.phase == DECODE:
                step.decoding += 1
            budget -= n
            i += 1
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                req = self.waiting[0]
                hits = 0
                if req.computed == 0 and not req.cached_len:
                    hits = self.kv.cached_prefix(req)
                    self.kv.query_tokens += req.prompt_len
                computed = max(req.computed, hits * cfg.block_size)
                n = min(req.prefill_target - computed, budget)
                need = math.ceil((computed + n) / cfg.block_size) - req.total_blocks - hits
                if need > self.kv.allocatable - self.kv.evictable_among(req, hits):
                    break
                self.kv.take_prefix(req, hits)
                self.kv.allocate(req, need)
                if hits:
                    req.cached_tokens = hits * cfg.block_size
                    self.kv.hit_tokens += req.cached_tokens
                req.computed = computed
                self.waiting.popleft()
                self.running.append(req)
                req.phase = PREFILL
                if req.first_scheduled is None:
                    req.first_scheduled = now
                step.requests.append(req)
                step.new_tokens.append(n)
                step.context.append(float(computed))
                budget -= n
        return step

    def complete(self, step: ScheduledStep, now: float) -> list[SimRequest]:
        """Apply a finished step; return the requests that finished."""
        adv = self.config.decode_advance
        finished: list[SimRequest] = []
        for req, n in zip(step.requests, step.new_tokens, strict=True):
            if req.phase == DECODE:
                req.kv_tokens += adv
                req.generated += adv
            else:
                req.computed += n
                if req.computed < req.prefill_target:
                    continue
                req.phase = DECODE
                req.kv_tokens = float(req.prefill_target)
                req.generated += 1.0
                if req.first_token is None:
                    req.first_token = now
                self.kv.register(req, req.prefill_target)
            if req.generated >= req.output_len - FINISH_TOLERANCE:
                finished.append(req)
        for req in finished:
            self._finish(req, now)
        return finished

    def advance_decode(self, steps: int, now: float) -> list[SimRequest]:
        """Apply ``steps`` identical decode steps to every running request at once."""
        cfg = self.config
        gain = steps * cfg.decode_advance
        finished = []
        for req in self.running:
            req.kv_tokens += gain
            req.generated += gain
            need = self._blocks_needed(req, req.kv_tokens - cfg.decode_advance + cfg.decode_width)
            if need > 0:
                ok = self.kv.allocate(req, need)
                assert ok, "decode run exceeded the KV blocks it was sized for"
            if req.generated >= req.output_len - FINISH_TOLERANCE:
                finished.append(req)
        for req in finished:
            self._finish(req, now)
        return finished

    def run_length(self) -> int:
        """Most identical decode steps before a request finishes or blocks run out."""
        cfg = self.config
        adv, width, bs = cfg.decode_advance, cfg.decode_width, cfg.block_size
        remaining = np.array([r.output_len - r.generated for r in self.running])
        m_finish = int(np.min(np.ceil((remaining - FINISH_TOLERANCE) / adv)))
        m_finish = max(m_finish, 1)
        kv_now = np.array([r.kv_tokens for r in self.running])
        held = np.array([r.total_blocks for r in self.running])
        free = self.kv.allocatable

        def blocks_for(m: int) -> int:
            need = np.ceil((kv_now + (m - 1) * adv + width) / bs) - held
            return int(np.maximum(need, 0).sum())

        if blocks_for(m_finish) <= free:
            return m_finish
        lo, hi = 0, m_finish  # blocks_for(lo) fits (0 steps), blocks_for(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if blocks_for(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def _finish(self, req: SimRequest, now: float) -> None:
        req.generated = float(req.output_len)
        req.finish = now
        req.phase = DONE
        self.kv.register(req, req.prompt_len + req.output_len - 1)
        self.kv.release(req)
        self.running.remove(req)
        self.finished.append(req)
        req.done.succeed()

    def submit(self, req: SimRequest) -> None:
        self.waiting.append(req)
