"""How many identical decode steps can run before anything changes: the length of a decode
run, which the replica waits for in one event (engine/replica.py). A run ends at the first
finish, when the KV cache runs out of blocks for the next step, or (SGLang) when the
shrinking admission reserve first lets the queue's head in.

``DecodeRunLength`` is mixed into ``Scheduler`` (engine/scheduler.py) and reads its
per-row numpy state and KV cache.
"""

from __future__ import annotations

import math

import numpy as np

from capsim.engine.ufuncs import least

LEAST_LEFT_MARGIN = 1e-6
"""Slack on the lower bound of output tokens left, so rounding in it cannot skip a finish."""

FINISH_TOLERANCE = 1e-9
"""Fractional token progress (speculative decoding) within this of the output length
counts as finished, so step-by-step and fast-forwarded runs agree despite rounding."""


class DecodeRunLength:
    """The length of the next decode run (mixed into ``Scheduler``)."""

    def run_length(self) -> int:
        """Most identical decode steps before a request finishes or blocks run out."""
        cfg = self.config
        n = len(self.running)
        adv = cfg.decode_advance
        # ceil is monotone, so the first finish is the smallest remaining output's
        if not self._least_left_exact:
            self._least_left = least(self._out[:n] - self._gen[:n])
            self._least_left_exact = True
        remaining = self._least_left
        m_finish = max(math.ceil((remaining - FINISH_TOLERANCE) / adv), 1)
        m = None
        if adv == 1.0:
            m = self._block_limit_one_token(m_finish)
        if m is None:
            m = self._block_limit_search(m_finish)
        if self.reserve is not None and m > 1:
            cap = self._reserve_cap(m)
            if cap is not None:
                m = min(m, cap)
        return m

    def _block_limit_one_token(self, m_finish: int) -> int | None:
        """``_block_limit_search`` in closed form for one token a step, or None when the
        form does not apply. A sequence with r tokens of room in its blocks needs a new
        block at steps floor(r) + 1, + bs, + 2 bs, ... With every r in [0, bs) the
        sequences take turns in order of r, so the (free + 1)-th block, the first that
        does not fit, is due at step floor(r_j) + 1 + k bs, where k and j are free divided
        by the batch and its remainder; one step earlier still fits."""
        cfg = self.config
        n = len(self.running)
        bs = cfg.block_size
        if cfg.decode_width == 1:  # (kv + 1) - 1.0 is kv: whole tokens, one token a step
            room = self._blocks[:n] * self._block_size - self._kv[:n]
        else:
            room = self._blocks[:n] * self._block_size - (self._kv[:n] + self._width - 1.0)
        room.sort()  # a temporary, sorted in place: its least, its j-th and its most
        if room[0] < 0 or room[-1] >= bs:
            return None
        k, j = divmod(self.kv.allocatable, n)
        r_j = float(room[j])
        return min(m_finish, math.floor(r_j) + k * bs)

    def _block_limit_search(self, m_finish: int) -> int:
        """Most decode steps, up to ``m_finish``, whose new blocks the KV cache can give."""
        cfg = self.config
        n = len(self.running)
        adv, width, bs = cfg.decode_advance, cfg.decode_width, cfg.block_size
        kv_now = self._kv[:n]
        held = self._blocks[:n]
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

    def _reserve_cap(self, limit: int) -> int | None:
        """In a decode run of up to ``limit`` steps with requests waiting: the step after
        which the reserve, shrinking as the ratio decays and outputs progress, first lets
        the head of the queue in (None if it does not within the run, or something else
        holds it back: the token budget, max_num_seqs, the KV cache)."""
        cfg = self.config
        if not self.waiting or len(self.running) >= cfg.max_num_seqs or self.admission_shut:
            return None
        budget = self._admission_budget()
        if budget <= 0:
            return None
        req, _, hits, computed, _, need = self._head_admission(budget)
        if hits:
            return 1  # a cached prefix may be evicted mid-run: look again after one step
        if not self.kv.can_admit(req, need, 0):
            return None
        rows = len(self.running)
        adv, width = cfg.decode_advance, cfg.decode_width
        return self.reserve.first_admissible_step(
            limit,
            self._reserve_tokens(req, computed),
            float(self.kv.allocatable),
            cfg.block_size,
            self._kv[:rows],
            self._blocks[:rows],
            self._out[:rows] - self._gen[:rows],
            adv,
            # the blocks taken before admission: a mixed step first gives the decodes theirs
            width + (adv if cfg.mixes_prefill_and_decode else 0.0),
            need + self.kv.state_blocks,
        )
