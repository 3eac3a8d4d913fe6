"""The running requests' share of a step (vLLM's loop over running requests, oldest first):
each decode gets its token(s) and each request still in prefill its next chunk within the
step's token budget, the KV cache gives the blocks they need, and where it cannot, the
newest running request is preempted (recompute preemption) until it can.

``RunningPass`` is mixed into ``Scheduler`` (engine/scheduler.py) and works on its
running list, its per-row numpy state and its KV cache: a vector pass for the common
cases, the per-request loop for small batches and preemption (both schedule
identically; tested).
"""

from __future__ import annotations

import math

import numpy as np

from capsim.engine.request import WAITING, SimRequest
from capsim.engine.scheduled_step import token_moments
from capsim.engine.ufuncs import whole_sum

SHORT_TAIL = 4
"""With at most this many running requests in prefill, the scheduler serves the decoding
rows ahead of the first of them in one vector pass and the rest one by one."""

SHORT_TAIL_ROWS = 16
"""...as long as the rows from the first prefilling one on number at most this many."""


class RunningPass:
    """How the running requests are served in a step (mixed into ``Scheduler``)."""

    def _preempt(self, victim: SimRequest) -> None:
        self.kv.release(victim)
        victim.phase = WAITING
        victim.prefill_target = victim.prompt_len + int(victim.generated)
        victim.computed = 0
        victim.kv_tokens = 0.0
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)
        self.admission_shut = False  # a retraction reopens SGLang's admission
        if self.reserve is not None:
            n = len(self.running)
            dec = self._dec[:n]
            self.reserve.retracted(self._gen[:n][dec], self._out[:n][dec])

    def _grant_running(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        """Tokens each running request gets this step (vLLM's in-order budget loop, in
        vector form), the context before them, the blocks each then needs, and whether
        every running request gets its tokens."""
        cfg = self.config
        n = len(self.running)
        dec = self._dec[:n]
        width = cfg.decode_width
        if n * width <= cfg.max_num_batched_tokens and not self._prefilling:
            # the common case: every running request decodes and the budget holds them all
            context = self._kv[:n].copy()
            need = np.ceil((context + self._width) / self._block_size) - self._blocks[:n]
            return self._decode_widths[:n], context, need, True
        remaining = self._target[:n] - self._computed[:n]
        if cfg.request_chunk_tokens is not None:
            remaining = np.minimum(remaining, cfg.request_chunk_tokens)
        want = np.where(dec, width, remaining)
        before = np.add.accumulate(want) - want
        # clipped to [0, want] (np.clip's arithmetic, without its Python wrapper)
        grant = np.minimum(np.maximum(cfg.max_num_batched_tokens - before, 0), want)
        # a decode that cannot get all its tokens stops the loop, as does an empty budget
        stop = ((dec & (grant < width)) | (grant <= 0)).nonzero()[0]
        if stop.size:
            grant[stop[0] :] = 0
        context = np.where(dec, self._kv[:n], self._computed[:n])
        need = np.where(
            grant > 0, np.ceil((context + grant) / cfg.block_size) - self._blocks[:n], 0
        )
        return grant, context, need, False

    def _grow_leading(self, more: np.ndarray, total: float) -> None:
        """Give the first ``more.size`` running rows ``more`` (>= 0) more blocks each, in
        one KV-cache reservation of ``total`` (their sum); the caller has checked that the
        cache can provide them."""
        if total:
            self.kv.reserve(int(total))
            self._blocks[: more.size] += more

    def _schedule_running_slow(self, step_parts: list) -> bool:
        """vLLM's loop over running requests one by one, preempting the newest request
        when the KV cache cannot hold a request's tokens. Used for small batches and when
        the vector path finds the KV cache short. Returns whether it preempted."""
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        running, kv, bs, width = self.running, self.kv, cfg.block_size, cfg.decode_width
        decoding, kv_tokens, blocks = self._dec, self._kv, self._blocks
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            if decoding[i]:
                n = width
                if n > budget:
                    break
                context = float(kv_tokens[i])
            else:
                n = cfg.chunk(req.prefill_target - req.computed, budget)
                context = float(req.computed)
            need = -(-(context + n) // bs) - blocks[i]
            if need > 0:
                victim = None
                if not kv.allocate(req, int(need)):
                    while True:
                        victim = self._pop_last()
                        self._preempt(victim)
                        preempted = True
                        if victim is req or kv.allocate(req, int(need)):
                            break
                    if victim is req:
                        break
                blocks[i] += need
            step_parts.append((req, n, context, i))
            budget -= n
            i += 1
        return preempted

    def _running_parts_slow(
        self,
    ) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray, tuple[float, int, float, float, float]]:
        """The per-request loop's result as arrays: (preempted, rows, tokens, contexts), and
        the token moments of those rows (see ScheduledStep.moments)."""
        parts: list[tuple[SimRequest, int, float, int]] = []
        preempted = self._schedule_running_slow(parts)
        rows = np.array([p[3] for p in parts], dtype=np.int64)
        tokens = [p[1] for p in parts]
        contexts = [p[2] for p in parts]
        moments = token_moments(tokens, contexts)
        return preempted, rows, np.array(tokens, dtype=float), np.array(contexts), moments

    def _running_parts_decode_head(self) -> tuple | None:
        """``_running_parts`` when a few requests still prefill: the decoding rows ahead of
        the first prefilling one take one vector pass, the short tail after it the loop
        one by one, and the token moments of the rows are summed on the way (see
        ScheduledStep.moments), as is their split (``_running_parts``). None when that
        does not apply (the budget runs out among the decoding head, the tail is long, or
        the KV cache cannot serve every row without a preemption); the general path then
        schedules the step."""
        cfg = self.config
        n = len(self.running)
        width, bs = cfg.decode_width, cfg.block_size
        dec = self._dec
        head = int(dec[:n].argmin())  # the first prefilling row (one exists)
        budget = cfg.max_num_batched_tokens - head * width
        if budget < 0 or n - head > SHORT_TAIL_ROWS:
            return None
        kv_tokens, blocks = self._kv, self._blocks
        # blocks each head row needs (0 where it has room)
        need = np.maximum(
            np.ceil((kv_tokens[:head] + self._width) / self._block_size) - blocks[:head], 0.0
        )
        total = whole_sum(need)
        # (row, tokens, context, blocks it needs, whether it decodes)
        tail: list[tuple[int, float, float, float, bool]] = []
        for i in range(head, n):
            if budget <= 0:
                break
            decodes = bool(dec[i])
            if decodes:
                if width > budget:
                    break
                tokens, context = float(width), float(kv_tokens[i])
            else:
                context = float(self._computed[i])
                tokens = cfg.chunk(float(self._target[i]) - context, float(budget))
            more = math.ceil((context + tokens) / bs) - float(blocks[i])
            if more > 0:
                total += more
            tail.append((i, tokens, context, more, decodes))
            budget -= tokens
        if total > self.kv.allocatable:
            return None
        self.kv.reserve(int(total))
        blocks[:head] += need
        count = head + len(tail)
        # every row's tokens and context as a decode's, then the prefill chunks' set
        grant = self._decode_widths[:count].copy()
        context = kv_tokens[:count].copy()
        head_context = whole_sum(context[:head])
        tokens_sum, context_sum = float(head * width), head_context
        dot, square = width * head_context, float(head * width * width)
        running = self.running
        prefills = []
        for i, tokens, ctx, more, decodes in tail:
            if not decodes:
                grant[i] = tokens
                context[i] = ctx
                prefills.append((running[i], int(tokens), i))
            tokens_sum += tokens
            context_sum += ctx
            dot += tokens * ctx
            square += tokens * tokens
            if more > 0:
                blocks[i] += more
        moments = (tokens_sum, count, context_sum, dot, square)
        decoding = dec[:count].copy()
        if len(prefills) == len(tail):  # the tail all prefills: the head decodes
            decode_rows = self._row_numbers[:head]
        else:
            decode_rows = self._row_numbers[:count][decoding]
        split = (decoding, decode_rows, prefills, int(tokens_sum))
        return False, self._row_numbers[:count], grant, context, moments, split

    def _running_parts(
        self,
    ) -> tuple[bool, np.ndarray | None, np.ndarray, np.ndarray, tuple | None, tuple | None]:
        """The same loop in vector form between preemptions: the rows before the first one
        the KV cache cannot serve get their blocks at once; that row preempts from the
        tail as vLLM does, and the scan goes on. Returns (preempted, rows, tokens,
        contexts, moments, split): the scheduled rows are always a prefix of ``running``,
        and rows None means every running request decodes this step; the rows' token
        moments and their split (which of them decode, the decoding rows, the prefill
        chunks as (request, tokens, row), and their tokens in all) where summed on the
        way, else None."""
        if self._prefilling and self._prefilling <= SHORT_TAIL:
            parts = self._running_parts_decode_head()
            if parts is not None:
                return parts
        grant, context, need, everyone = self._grant_running()
        running, kv = self.running, self.kv
        if everyone:
            need = np.maximum(need, 0.0)
            total = whole_sum(need)
            if total <= kv.allocatable:  # the common case: no preemption
                self._grow_leading(need, total)
                return False, None, grant, context, None, None
            granted = len(running)
        else:
            granted = int(np.count_nonzero(grant > 0))
            need = np.maximum(need[:granted], 0.0)
        preempted = False
        i = 0
        while i < min(granted, len(running)):
            end = min(granted, len(running))
            cumulative = np.add.accumulate(need[i:end])
            served = i + int(cumulative.searchsorted(kv.allocatable, side="right"))
            if served > i and cumulative[served - i - 1]:  # the blocks rows i..served-1 need
                kv.reserve(int(cumulative[served - i - 1]))
                self._blocks[i:served] += need[i:served]  # (0 for a row with room)
            i = served
            if i >= end:
                break
            req, k = running[i], int(need[i])
            while True:
                victim = self._pop_last()
                self._preempt(victim)
                preempted = True
                if victim is req or kv.allocate(req, k):
                    break
            if victim is req:
                break
            self._blocks[i] += k
            i += 1
        rows, context = self._row_numbers[:i], context[:i]
        if everyone:  # the rows served all decode: their moments and split as they stand
            width = self.config.decode_width
            context_sum = whole_sum(context)
            tokens, square = float(i * width), float(i * width * width)
            moments = (tokens, i, context_sum, width * context_sum, square)
            return preempted, rows, grant[:i], context, moments, (None, rows, [], i * width)
        return preempted, rows, grant[:i], context, None, None
