"""SGLang's admission reserve: KV-pool tokens held back for the decodes still to come.

SGLang's scheduler (``PrefillAdder``) admits a waiting request only while its remaining
prompt plus min(max_new_tokens, clip) fits in the free and evictable KV pool less an
offset: min(tokens still to generate, clip) x ``new_token_ratio`` for every running
request, and min(max_new_tokens, clip) for every request admitted earlier in the same batch
(charged at its prompt's last chunk). The ratio starts at 0.7, falls by a fixed step after
every decode batch to 0.7 x 0.14, and after a retraction restarts from the running
requests' progress; an idle server starts again from 0.7. vLLM reserves nothing (a request
is admitted when its prompt fits and preempted later if decodes run out of blocks).

capsim takes a request's max_new_tokens as its output length (what benchmark clients send)
and counts the pool in whole blocks, as its KV cache does. Units: tokens, decode steps.

``ReserveState`` is the ratio as it moves; ``ReserveChecks``, mixed into the scheduler,
asks whether the reserve lets one request in.
"""

from __future__ import annotations

import numpy as np

from capsim.catalog.engine_schema import AdmissionReserve
from capsim.engine.request import SimRequest

# how many decode steps ahead first_admissible_step evaluates at once (an array of this
# many rows by the running requests)
STEP_CHUNK = 256


class ReserveState:
    """The running ratio of one replica's admission reserve."""

    def __init__(self, spec: AdmissionReserve):
        self.init = spec.init_ratio
        self.min = spec.init_ratio * spec.min_ratio_factor
        self.decay = (self.init - self.min) / spec.decay_steps
        self.clip = float(spec.clip_tokens)
        self.retract_steps = spec.retract_decode_steps
        self.base = self.init  # the ratio it was last set to
        self.steps = 0  # decode batches since then
        self._skip_next = False  # a batch that retracted does not decay the ratio

    def ratio(self, more_steps: int = 0) -> float:
        """The ratio after ``more_steps`` more decode batches (a closed form, so that a
        decode run and the same steps one at a time agree exactly)."""
        k = self.steps + more_steps
        return self.base if k == 0 else max(self.base - k * self.decay, self.min)

    def decode_batches(self, count: int) -> None:
        """``count`` decode batches ran."""
        if self._skip_next and count:
            self._skip_next = False
            count -= 1
        self.steps += count

    def retracted(self, generated: np.ndarray, output: np.ndarray) -> None:
        """Requests were preempted: restart from the survivors' progress (``generated``
        and ``output`` tokens of the running requests left)."""
        n = generated.size
        total_out = float(np.sum(output))
        value = (float(np.sum(generated)) + self.retract_steps * n) / (total_out + 1.0)
        self.base, self.steps, self._skip_next = min(1.0, value), 0, True

    def reset(self) -> None:
        """The server went idle."""
        self.base, self.steps, self._skip_next = self.init, 0, False

    def running_offset(self, left: np.ndarray, more_steps: int = 0) -> float:
        """Tokens held for running requests with ``left`` output tokens still to generate."""
        return self.ratio(more_steps) * float(np.add.reduce(np.minimum(left, self.clip)))

    def request_tokens(self, left: float) -> float:
        """What a request with ``left`` output tokens to generate reserves on admission."""
        return min(left, self.clip)

    def first_admissible_step(
        self,
        limit: int,
        head_tokens: float,
        free_blocks: float,
        block_size: int,
        kv: np.ndarray,
        held: np.ndarray,
        left: np.ndarray,
        advance: float,
        first_step_end: float,
        physical_need: float,
    ) -> int | None:
        """The fewest decode steps k (1 <= k < ``limit``) after which a waiting request
        needing ``head_tokens`` (remaining prompt plus its reserve) would pass the reserve
        check, the running requests (``kv`` tokens in KV, ``held`` blocks, ``left`` output
        tokens to go) having advanced k steps of ``advance`` tokens and taken the blocks
        up to ``first_step_end`` + (k - 1) x ``advance`` tokens; None if none does, or if
        the request stops fitting physically (``physical_need`` blocks) first, which
        then holds until a request finishes (free blocks only shrink in a decode run)."""
        for start in range(1, limit, STEP_CHUNK):
            k = np.arange(start, min(limit, start + STEP_CHUNK), dtype=float)
            ends = kv[None, :] + first_step_end + (k[:, None] - 1.0) * advance
            taken = np.maximum(np.ceil(ends / block_size) - held[None, :], 0.0).sum(axis=1)
            free = free_blocks - taken
            fits = free >= physical_need
            # ratio(j) for each j at once (steps + k >= 1: the decayed branch)
            ratios = np.maximum(self.base - (self.steps + k) * self.decay, self.min)
            reserve = ratios * np.minimum(left[None, :] - k[:, None] * advance, self.clip).sum(
                axis=1
            )
            passes = fits & (head_tokens < free * block_size - reserve)
            if passes.any():
                return int(k[int(np.argmax(passes))])
            if not fits.all():
                return None
        return None


class ReserveChecks:
    """Whether the admission reserve lets a request in, and whether a refusal shuts
    admission (a mixin of Scheduler, which holds the ``reserve`` (a ReserveState, or None
    for vLLM), ``admission_shut``, the running rows and the KV cache)."""

    def _shut_admission(self, prefills: list) -> None:
        """The pool refused the queue's head: an engine whose refusal holds
        (AdmissionReserve.holds_until_finish, SGLang's batch_is_full) admits nobody more
        until a running request finishes or is retracted. Not when nothing runs and
        nothing was admitted, where no finish would ever reopen it."""
        if self._latches and (self.running or prefills):
            self.admission_shut = True

    def _running_reserve(self) -> float:
        """Tokens the admission reserve holds for the decoding requests' output to come."""
        n = len(self.running)
        left = self._out[:n] - self._gen[:n]
        if self._prefilling:
            left = left[self._dec[:n]]
        return self.reserve.running_offset(left)

    def _reserve_tokens(self, req: SimRequest, computed: float) -> float:
        """What admitting ``req`` asks of the reserve: its prompt still to compute (past
        ``computed`` tokens) plus its own output reserve."""
        return (
            req.prefill_target
            - computed
            + self.reserve.request_tokens(req.output_len - req.generated)
        )

    def _reserve_admits(
        self, req: SimRequest, computed: float, offset: float | None = None
    ) -> bool:
        """Whether the admission reserve lets ``req`` in (``computed`` of its prompt's
        tokens in KV or cached), against ``offset`` tokens already held (None: the
        decoding requests' holds)."""
        if offset is None:
            offset = self._running_reserve()
        tokens = self._reserve_tokens(req, computed)
        return tokens < self.kv.allocatable * self.config.block_size - offset
