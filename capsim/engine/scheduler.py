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
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from capsim.catalog.engine_schema import AdmissionReserve
from capsim.engine.admission import ReserveChecks, ReserveState
from capsim.engine.kv_cache import KVCache
from capsim.engine.request import DECODE, DONE, PREFILL, SimRequest
from capsim.engine.run_length import FINISH_TOLERANCE, LEAST_LEFT_MARGIN, DecodeRunLength
from capsim.engine.running_pass import RunningPass
from capsim.engine.running_rows import RunningRows
from capsim.engine.scheduled_step import ScheduledStep, token_moments
from capsim.engine.ufuncs import least, whole_sum

SMALL_BATCH = 8
"""Up to this many running requests, the per-request loop is faster than numpy's fixed
cost per call; both paths schedule identically (tested)."""


NONE_FINISH = 0.5
"""Output tokens left above which a decoding row cannot be finishing: a finishing row has
at most FINISH_TOLERANCE (and the rounding of ``output - generated``) left, far below it;
with whole-token steps every other row has at least one token left."""


@dataclass
class SchedulerConfig:
    """Engine limits (vLLM flags of the same names)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    decode_width: int = 1  # tokens per decoding sequence per step (k + 1 with speculation)
    decode_advance: float = 1.0  # expected tokens gained per decode step
    # blocks of the shared KV pool one running sequence's recurrent state takes (hybrid
    # models on an engine that pages state into the KV pool; 0 otherwise)
    state_blocks: int = 0
    # SGLang's --scheduler-recv-interval: the scheduler takes new requests off its socket
    # only once this many decode steps have run since it last did (a step with prefill
    # work, or an idle loop, counts as the whole interval); 1 = every step
    recv_interval_steps: int = 1
    # whether a step carries prefill chunks and decodes together (vLLM, llama.cpp); False:
    # SGLang's default scheduler, which runs a prefill batch (the chunk in progress, then
    # the waiting requests it can admit) on its own whenever it has one, and decode
    # batches otherwise, so decodes wait while prompts are prefilled
    mixes_prefill_and_decode: bool = True
    # vLLM V0's async output processing: a step's tokens are turned into request outputs
    # while the next step runs and reach the client when it ends, so a first token is seen
    # at the end of the step after the one that made it (at once when no step follows)
    outputs_a_step_late: bool = False
    # SGLang's admission reserve (engine/admission.py); None: vLLM's, none
    reserve: AdmissionReserve | None = None
    # most prompt tokens one request takes in a step, where that is less than the step's
    # budget: with data-parallel attention a request's prompt runs on its own rank, whose
    # chunked prefill is the server's divided by the ranks (SGLang's server_args:
    # "self.chunked_prefill_size = self.chunked_prefill_size // self.dp_size"); None: the
    # step's budget
    request_chunk_tokens: int | None = None
    # vLLM's KV offloading (--kv-offloading-size): blocks of the prefix cache's tier in
    # system RAM, and the seconds one token's KV takes to load back over the host link
    host_kv_blocks: int = 0
    host_load_s_per_token: float = 0.0

    def chunk(self, left: float, budget: float) -> float:
        """Prompt tokens a request with ``left`` to go takes of a step's ``budget``."""
        if self.request_chunk_tokens is None:
            return min(left, budget)
        return min(left, budget, self.request_chunk_tokens)


class Scheduler(RunningRows, RunningPass, DecodeRunLength, ReserveChecks):
    """Waiting queue, running list and KV cache of one replica.

    Decode state (tokens in KV, tokens generated, output length, blocks held) lives in
    numpy arrays parallel to ``running``, so a step costs a few vector operations however
    many sequences run. While a request runs, the arrays are authoritative: its object's
    ``blocks``, ``kv_tokens`` and ``generated`` are brought up to date before the KV cache
    reads them (prefill done, finish, preemption) and on ``sync_requests``.
    """

    def __init__(self, config: SchedulerConfig, kv: KVCache):
        self.config = config
        self.kv = kv
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.preemptions = 0
        # called with each request as it finishes (the driver logs it and lets it go)
        self.on_finish: Callable[[SimRequest], None] | None = None
        self.submitted = 0
        # the first time (s) the scheduler had room for another request and found none
        # waiting, once any had arrived; None while the queue never ran dry (see
        # engine/saturation.py)
        self.dry_at: float | None = None
        # dry moments count once this many requests have arrived: a closed loop's first C
        # requests, sent together, reach the engine one API-server turn apart, and the
        # engine may run dry between them at any level (engine/saturation.py)
        self.dry_counts_from = 1
        self.reserve = ReserveState(config.reserve) if config.reserve is not None else None
        # SGLang's batch_is_full: a refused admission shuts admission until a running
        # request finishes or is retracted (AdmissionReserve.holds_until_finish)
        self._latches = config.reserve is not None and config.reserve.holds_until_finish
        self.admission_shut = False
        # prompt tokens admitted since the last step began whose KV loads from system RAM
        self.load_tokens = 0
        cap = config.max_num_seqs + 1
        # one row per float field, so removing a running request shifts one array
        self._state = np.zeros((6, cap))
        self._kv, self._gen, self._out, self._blocks, self._computed, self._target = self._state
        self._dec = np.zeros(cap, dtype=bool)
        # read-only rows the common all-decode step hands out as views (no allocation)
        self._row_numbers = np.arange(cap)
        self._decode_widths = np.full(cap, float(config.decode_width))
        self._row_numbers.flags.writeable = self._decode_widths.flags.writeable = False
        # the block size and decode width as floats, for the vector arithmetic on the rows
        # (the same values; numpy converts a Python float with less work than an int)
        self._block_size = float(config.block_size)
        self._width = float(config.decode_width)
        self._prefilling = 0  # running rows not decoding
        # requests whose first token the last step made and the client has not yet seen
        # (outputs_a_step_late): their first_token moves to the end of the next step
        self._undelivered: list[SimRequest] = []
        # steps a request runs past its last token: with outputs_a_step_late the engine
        # learns that a request is done while the next step runs, which it is scheduled in
        # (vLLM V0's stop checks run in the output processing), and the client sees the
        # last token when that step ends
        self._extra_steps = 1.0 if config.outputs_a_step_late else 0.0
        # a lower bound on the output tokens any decoding row still has to generate:
        # while it exceeds FINISH_TOLERANCE nobody can finish, so the check is skipped
        self._least_left = math.inf
        self._least_left_exact = True  # whether it is the minimum itself, not just a bound

    # ------------------------------------------------------------------ queries

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    @property
    def decoding_count(self) -> int:
        """Running requests past their prompt (decoding)."""
        return len(self.running) - self._prefilling

    def take_load_seconds(self) -> float:
        """Seconds the next step waits for the KV it loads from system RAM (the tokens
        admitted from the tier in system RAM since the last call)."""
        tokens, self.load_tokens = self.load_tokens, 0
        return tokens * self.config.host_load_s_per_token

    def can_admit_more(self) -> bool:
        """Could a newly arrived request change the next step's schedule?"""
        return len(self.running) < self.config.max_num_seqs

    def steady_decode(self, now: float) -> bool:
        """True when the next steps are identical decode steps until an event: every
        running request decodes, the batch fits the token budget, and no waiting request
        can be admitted (none waits, the batch is at max_num_seqs, or the head of the
        queue does not fit; during a decode run free blocks only shrink, so a head that
        does not fit now cannot be admitted before a request finishes). ``now``: the
        time (s) the steps would start, or earlier."""
        n = len(self.running)
        if not n:
            return False
        cfg = self.config
        if n * cfg.decode_width > cfg.max_num_batched_tokens:
            return False
        if self._prefilling:
            return False
        if n >= cfg.max_num_seqs:  # no room for another (can_admit_more)
            return True
        if not self.waiting:
            self.note_dry(now)
            return True
        blocked = self.head_blocked()
        if blocked and self._latches:  # the step this stands for would have been refused
            self.admission_shut = True
        return blocked

    def note_held_back_room(self) -> None:
        """A request held back by async scheduling (Replica.admits_a_step_late) met room
        and an empty queue after the first burst: at a higher level it would have been
        sent earlier and waiting, and admitted where here it was not, so this run's service
        is not that of the levels above it (engine/saturation.py): it counts as having run
        dry before its last request was sent."""
        if self.submitted >= self.dry_counts_from:
            self.dry_at = -math.inf

    def note_dry(self, now: float) -> None:
        """Record that at ``now`` (s) the scheduler had room for another request and none
        was waiting (ignored before ``dry_counts_from`` requests have arrived)."""
        if self.dry_at is None and self.submitted >= self.dry_counts_from:
            self.dry_at = now

    def _admission_budget(self) -> float:
        """Tokens the next step leaves for admissions while every running request decodes
        (the decodes share the budget only where prefill and decode mix)."""
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        if cfg.mixes_prefill_and_decode:
            budget -= len(self.running) * cfg.decode_width
        return budget

    def _head_admission(self, budget: float) -> tuple[SimRequest, bool, int, float, float, int]:
        """The queue's head as the next step would admit it within ``budget``: (request,
        whether its prompt is yet to be looked up in the prefix cache, cached prefix
        blocks, prompt tokens already computed or cached, tokens of its first chunk,
        blocks that chunk needs)."""
        cfg = self.config
        bs = cfg.block_size
        req = self.waiting[0]
        hits = 0
        fresh = req.computed == 0 and not req.cached_len
        computed = req.computed
        if fresh and req.reusable:  # only a reusable prompt is looked up (cached_prefix)
            hits = self.kv.cached_prefix(req)
            computed = max(computed, hits * bs)
        if fresh and self.kv.host is not None:
            # blocks the tier in system RAM holds beyond the GPU's: loaded, not computed
            computed = max(computed, self.kv.host_prefix(req) * bs)
        left = req.prefill_target - computed
        n = min(left, budget) if cfg.request_chunk_tokens is None else cfg.chunk(left, budget)
        need = math.ceil((computed + n) / bs) - (req.blocks + req.cached_len) - hits
        return req, fresh, hits, computed, n, need

    def head_blocked(self) -> bool:
        """Whether the first waiting request could not be admitted in the next step."""
        budget = self._admission_budget()
        if budget <= 0:
            return True
        if self.admission_shut:
            return True
        req, _, hits, computed, _, need = self._head_admission(budget)
        if not self.kv.can_admit(req, need, hits):
            return True
        return self.reserve is not None and not self._reserve_admits(req, computed)

    # ------------------------------------------------------------------ one step

    def schedule(self, now: float) -> ScheduledStep:
        cfg = self.config
        if not cfg.mixes_prefill_and_decode and (
            self._prefilling or (self.waiting and len(self.running) < cfg.max_num_seqs)
        ):
            step = self._schedule_prefill_only(now)
            if step is not None:
                return step
        running = self.running
        n_running = len(running)
        preempted = False
        moments = None  # of the running rows scheduled, where summed on the way
        split = None  # and their split (RunningPass._running_parts)
        if 0 < n_running <= SMALL_BATCH:
            preempted, rows, grant, context, moments = self._running_parts_slow()
        elif n_running:
            preempted, rows, grant, context, moments, split = self._running_parts()
        else:
            rows = np.zeros(0, dtype=np.int64)
            grant = context = np.zeros(0)
        prefills: list[tuple[SimRequest, int, int]] = []
        if rows is None:  # every running request decodes
            decode_rows = self._row_numbers[:n_running]
            decoding = None
            budget = cfg.max_num_batched_tokens - n_running * cfg.decode_width
        elif split is not None:
            decoding, decode_rows, prefills, granted = split
            budget = cfg.max_num_batched_tokens - granted
        else:
            decoding = self._dec[rows]
            decode_rows = rows[decoding]
            if decode_rows.size < rows.size:
                for i in (~decoding).nonzero()[0].tolist():
                    row = int(rows[i])
                    prefills.append((running[row], int(grant[i]), row))
            budget = cfg.max_num_batched_tokens - int(whole_sum(grant))
        admitted_tokens: list[float] = []
        admitted_context: list[float] = []
        if not preempted and cfg.mixes_prefill_and_decode:
            budget = self._admit(now, budget, prefills, admitted_tokens, admitted_context)
        if not preempted and not self.waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            self.note_dry(now)
        return self._finish_schedule(
            grant,
            context,
            decode_rows,
            prefills,
            decoding,
            rows,
            n_running,
            moments,
            admitted_tokens,
            admitted_context,
        )

    def _admit(
        self,
        now: float,
        budget: float,
        prefills: list,
        admitted_tokens: list[float],
        admitted_context: list[float],
    ) -> float:
        """Admit waiting requests in arrival order while the step's token ``budget``,
        ``max_num_seqs`` and the KV cache allow, each with its first chunk; returns the
        budget left."""
        cfg, kv, running = self.config, self.kv, self.running
        if self.admission_shut:
            return budget
        reserve = self.reserve
        offset = 0.0
        if reserve is not None and self.waiting:
            offset = self._running_reserve()
            for req, n, _ in prefills:  # chunks this step that finish their prompt
                if req.computed + n >= req.prefill_target:
                    offset += reserve.request_tokens(req.output_len - req.generated)
        while self.waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            req, fresh, hits, computed, n, need = self._head_admission(budget)
            if not kv.can_admit(req, need, hits):
                self._shut_admission(prefills)
                break
            if reserve is not None:
                if not self._reserve_admits(req, computed, offset):
                    self._shut_admission(prefills)
                    break
                if computed + n >= req.prefill_target:  # its last chunk charges its outputs
                    offset += reserve.request_tokens(req.output_len - req.generated)
            kv.take_prefix(req, hits)
            if fresh:  # prompt tokens looked up, once per admission
                kv.query_tokens += req.prompt_len
            kv.allocate(req, need)
            kv.admit_state()
            if hits:
                req.cached_tokens = hits * cfg.block_size
                kv.hit_tokens += req.cached_tokens
            loaded = computed - max(req.computed, hits * cfg.block_size)
            if loaded > 0:  # from system RAM (KVCache.host): the step waits for the load
                kv.hit_tokens += loaded
                kv.host.loaded_tokens += loaded
                self.load_tokens += loaded
            req.computed = computed
            self.waiting.popleft()
            req.phase = PREFILL
            if req.first_scheduled is None:
                req.first_scheduled = now
            row = self._append(req)
            prefills.append((req, n, row))
            admitted_tokens.append(n)
            admitted_context.append(float(computed))
            budget -= n
        return budget

    def _finish_schedule(
        self,
        grant: np.ndarray,
        context: np.ndarray,
        decode_rows: np.ndarray,
        prefills: list,
        decoding: np.ndarray | None,
        rows: np.ndarray | None,
        n_running: int,
        moments: tuple | None,
        admitted_tokens: list[float],
        admitted_context: list[float],
    ) -> ScheduledStep:
        """The ScheduledStep of the running rows scheduled and the requests admitted, with
        the step's token moments where they sum exactly."""
        cfg = self.config
        whole = cfg.decode_advance == 1.0  # no fractional speculative progress
        if rows is None and whole:  # every running request decodes: the moments in one sum
            width = cfg.decode_width
            context_sum = whole_sum(context)
            moments = (
                float(n_running * width),
                n_running,
                context_sum,
                width * context_sum,
                float(n_running * width * width),
            )
        if moments is not None and whole:
            # whole-number tokens and contexts: these additions are exactly what the
            # arrays would sum to (with fractional speculative progress they need not be)
            tokens, seqs, context_sum, dot, square = moments
            for n, c in zip(admitted_tokens, admitted_context, strict=True):
                tokens += n
                context_sum += c
                dot += n * c
                square += n * n
            moments = (tokens, seqs + len(admitted_tokens), context_sum, dot, square)
        else:
            moments = None
        admitted = (admitted_tokens, admitted_context) if admitted_tokens else None
        return ScheduledStep(grant, context, decode_rows, prefills, decoding, admitted, moments)

    def _schedule_prefill_only(self, now: float) -> ScheduledStep | None:
        """SGLang's prefill batch (engines that do not mix prefill and decode): the
        running requests still in prefill take their next chunks, oldest first, then
        waiting requests are admitted, all within the step's token budget; decoding
        requests wait for the next decode batch. None when there is nothing to prefill
        (no chunk in progress and the queue's head cannot be admitted), or a chunk in
        progress cannot get its KV blocks (the step is then scheduled as usual)."""
        cfg, kv, running = self.config, self.kv, self.running
        budget = cfg.max_num_batched_tokens
        bs = cfg.block_size
        rows: list[int] = []
        tokens: list[float] = []
        contexts: list[float] = []
        prefills: list[tuple[SimRequest, int, int]] = []
        if self._prefilling:
            blocks = self._blocks
            for i in (~self._dec[: len(running)]).nonzero()[0].tolist():
                if budget <= 0:
                    break
                req = running[i]
                n = cfg.chunk(req.prefill_target - req.computed, budget)
                need = math.ceil((req.computed + n) / bs) - int(blocks[i])
                if need > 0:
                    if not kv.allocate(req, need):
                        if not rows:
                            return None
                        break
                    blocks[i] += need
                rows.append(i)
                tokens.append(float(n))
                contexts.append(float(req.computed))
                prefills.append((req, int(n), i))
                budget -= n
        admitted_tokens: list[float] = []
        admitted_context: list[float] = []
        budget = self._admit(now, budget, prefills, admitted_tokens, admitted_context)
        if not rows and not admitted_tokens:
            return None
        if not self.waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            self.note_dry(now)
        moments = token_moments(tokens, contexts)
        return self._finish_schedule(
            np.array(tokens, dtype=float),
            np.array(contexts, dtype=float),
            np.zeros(0, dtype=np.int64),
            prefills,
            np.zeros(len(rows), dtype=bool),
            np.array(rows, dtype=np.int64),
            len(running),
            moments,
            admitted_tokens,
            admitted_context,
        )

    def complete(self, step: ScheduledStep, now: float) -> list[SimRequest]:
        """Apply a finished step; return the requests that finished."""
        self._deliver(now)
        adv = self.config.decode_advance
        rows = step.decode_rows
        k = rows.size
        if k and rows[-1] == k - 1:  # the first k rows (rows are increasing)
            self._kv[:k] += adv  # tokens in KV and generated (two 1-D adds: cheaper than
            self._gen[:k] += adv  # one over the two rows)
        elif k:
            self._kv[rows] += adv
            self._gen[rows] += adv
        if k:
            if self.reserve is not None:
                self.reserve.decode_batches(1)
            self._least_left -= adv
            if k + self._prefilling < len(self.running):  # some decoding rows waited
                self._least_left_exact = False
        for req, n, row in step.prefills:
            req.computed += n
            self._computed[row] = req.computed
            if req.computed < req.prefill_target:
                continue
            req.phase = DECODE
            req.kv_tokens = float(req.prefill_target)
            req.generated += 1.0
            if req.first_token is None:
                req.first_token = now
                if self.config.outputs_a_step_late:
                    self._undelivered.append(req)
            # the row's blocks to the request for the KV cache (_store_row), which may
            # take some into the prefix cache (its total, the row's, stays); then the row
            # decodes from the request's tokens (its other fields are as they were)
            req.blocks = int(self._blocks[row]) - req.cached_len
            self.kv.register(req, req.prefill_target)
            self._kv[row] = req.kv_tokens
            self._gen[row] = req.generated
            self._dec[row] = True
            self._prefilling -= 1
            self._least_left = min(
                self._least_left, req.output_len + self._extra_steps - req.generated
            )
        return self._finish_done(now)

    def may_finish(self, step: ScheduledStep) -> bool:
        """Whether completing ``step`` could finish a request (conservative: False means
        it certainly finishes none)."""
        margin = FINISH_TOLERANCE + LEAST_LEFT_MARGIN
        if step.decoding and self._least_left - self.config.decode_advance <= margin:
            return True
        for req, n, _ in step.prefills:
            done_prefill = req.computed + n >= req.prefill_target
            left = req.output_len + self._extra_steps - (req.generated + 1.0)
            if done_prefill and left <= margin:
                return True
        return False

    def _finish_done(self, now: float) -> list[SimRequest]:
        """Finish the decoding requests that reached their output length (at ``now``, s)
        and make ``_least_left`` exact; returns them."""
        if self._least_left > FINISH_TOLERANCE + LEAST_LEFT_MARGIN:
            return []
        n = len(self.running)
        if not n:
            self._least_left = math.inf
            self._least_left_exact = True
            return []
        left = self._out[:n] - self._gen[:n]
        if self._prefilling:
            dec = self._dec[:n]
            left[~dec] = math.inf
        fewest = least(left)
        if fewest > NONE_FINISH:  # the bound was loose: nobody finishes
            self._least_left = fewest
            self._least_left_exact = True
            return []
        finishing = self._gen[:n] >= self._out[:n] - FINISH_TOLERANCE
        if self._prefilling:
            finishing &= dec
        left[finishing] = math.inf  # the least left of those still decoding
        self._least_left = least(left)
        self._least_left_exact = True
        done = finishing.nonzero()[0].tolist()
        finished = [self.running[row] for row in done]
        for row in reversed(done):  # from the back, so earlier rows keep their index
            self._finish(row, now)
        return finished

    def _deliver(self, now: float) -> None:
        """The first tokens held back a step (outputs_a_step_late) reach their clients at
        ``now``, the end of the step after the one that made them (a request that finished
        in that step keeps the time it was made)."""
        if self._undelivered:
            for req in self._undelivered:
                if req.finish is None:
                    req.first_token = now
            self._undelivered.clear()

    def advance_decode(
        self, steps: int, now: float, first_end: float | None = None
    ) -> list[SimRequest]:
        """Apply ``steps`` identical decode steps to every running request at once (the
        first of them ends at ``first_end``, by default ``now``)."""
        self._deliver(now if first_end is None else first_end)
        cfg = self.config
        n = len(self.running)
        gain = steps * cfg.decode_advance
        # the blocks the last step writes into, computed as _block_limit_search counts
        # them (before the update, the same float expression: recomputing it from the
        # advanced state can round across a block boundary and ask for one block more)
        if cfg.decode_advance == 1.0:  # whole tokens: one addition, exact
            last_step_end = self._kv[:n] + float(steps - 1 + cfg.decode_width)
        else:
            last_step_end = self._kv[:n] + (steps - 1) * cfg.decode_advance + self._width
        more = np.maximum(np.ceil(last_step_end / self._block_size) - self._blocks[:n], 0.0)
        self._kv[:n] += gain  # tokens in KV and generated
        self._gen[:n] += gain
        self._least_left -= gain
        if self.reserve is not None:
            self.reserve.decode_batches(steps)
        total = whole_sum(more)
        assert total <= self.kv.allocatable, "decode run exceeded its KV blocks"
        self._grow_leading(more, total)
        return self._finish_done(now)

    def _finish(self, row: int, now: float) -> None:
        req = self.running[row]
        self._store_row(row, req)
        req.generated = float(req.output_len)
        req.finish = now
        req.phase = DONE
        self.kv.register(req, req.prompt_len + req.output_len - 1)
        self.kv.release(req)
        self._remove(row)
        self.admission_shut = False  # the running batch shrank
        if self.reserve is not None and not self.running and not self.waiting:
            self.reserve.reset()  # the server goes idle
        if self.on_finish is not None:
            self.on_finish(req)
        if req.done is not None:
            req.done.succeed()

    def abort(self, req: SimRequest, now: float) -> bool:
        """Drop ``req`` (a client went away), waiting or running, and free its blocks, as
        vLLM aborts a request between steps. Call between steps only. Returns whether
        the request was here."""
        if req in self.waiting:
            self.waiting.remove(req)  # holds no blocks (a preempted one released them)
        elif req in self.running:
            row = self.running.index(req)
            self._store_row(row, req)
            self.kv.release(req)
            self._remove(row)
            self._least_left_exact = False
            self.admission_shut = False
        else:
            return False
        req.phase = DONE
        req.finish = now
        return True

    def submit(self, req: SimRequest) -> None:
        self.waiting.append(req)
        self.submitted += 1
