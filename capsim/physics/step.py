"""Step time: how long one forward step of a serving engine takes for a batch, and why.

A step processes, for each scheduled sequence i, ``new_tokens[i]`` tokens (1 for decode,
a chunk for prefill, k + 1 for speculative verification) on top of ``context[i]`` tokens
already in its KV cache. The time is a sum of per-kernel-class rooflines plus terms that
do not overlap with them:

    t = t_host                                 per step and per sequence (scheduling,
                                               input preparation, sampling): CPU, serial
      + max(t_gpu, t_dispatch)                 the GPU's work, or launching it (eager)
      + t_draft                                the speculative drafter, when enabled

    t_gpu = R(t_mem, t_flop)[dense weights]    attention/GDN projections, dense FFN,
                                               shared experts, router, lm_head
      + R(t_mem, t_flop)[routed experts]       only the experts some token routed to
      + R(t_mem, t_flop)[attention]            KV/state reads and writes vs attention FLOPs
      + t_comm                                 2 all-reduces per layer when TP > 1
      + t_floor                                per layer: graph gaps, MoE routing kernels

In eager mode the CPU launches every kernel itself: ``t_dispatch`` = layers x
``layer_overhead_eager_us`` + all-reduces x ``allreduce_eager_launch_us``. A step above the
largest captured size runs vLLM's compiled code without a graph, with fewer, fused kernels
per layer (``layer_overhead_compiled_us`` instead). Launches are asynchronous, so the GPU
runs one kernel while the CPU launches the next: the step takes the longer of the two, not
their sum. A big model on one GPU hides the launches behind its weight reads; split over TP
ranks, each GPU's work shrinks but the launches do not, and the step becomes bound by the
CPU. With CUDA graphs the step is one launch (``t_dispatch`` = 0).

R is a smooth roofline, (t_mem^p + t_flop^p)^(1/p) with p = ``roofline_sharpness``: a
kernel far from the ridge point costs its bound, one near it costs more than either (memory
and compute never overlap perfectly), and p -> infinity is the plain max.

Memory terms divide bytes by peak bandwidth x an efficiency; compute terms divide FLOPs by
the dense tensor peak of the GEMM's data type x an efficiency that grows with the GEMM's
rows M (``gemm_efficiency``): ``compute_efficiency`` for decode-shaped GEMMs of up to 512
rows, ``prefill_compute_efficiency`` from 8,192 rows (prefill chunks), log-linear between.
A routed expert's GEMM has the tokens routed to it as rows, so MoE prefill stays
decode-shaped. A power limit scales both (see power.py). All byte and FLOP counts are per
GPU of one tensor-parallel group.

CUDA graphs: a step whose tokens fit a captured graph runs padded to that graph's size
(physics/cuda_graphs.py), so the GEMMs, the all-reduces and (``moe_padding_routed``) the
MoE router see ``graph_tokens`` >= tokens; attention and the KV cache see the real tokens.
A larger step runs eager and pays the eager launch costs instead.

FLOP counts: a GEMM with a (tokens x in) input and (in x out) weight costs 2 x tokens x in x
out, so the body costs 2 x active weights per token. Causal attention costs 4 x heads x
head_dim per (query, key) pair (QK^T and PV); a chunk of n new tokens on c cached ones has
n c + n (n + 1) / 2 pairs per full-attention layer, and a sliding window caps each query's
keys at the window. MLA in its absorbed form costs 2 x heads x (kv_lora + rope) +
2 x heads x kv_lora per pair. A Gated DeltaNet layer costs about 6 x value_heads x
key_dim x value_dim per token (state update and read-out), a Mamba-2 layer 6 x heads x
head_dim x state_size.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from capsim.catalog.gpu_schema import GPU
from capsim.catalog.loader import Catalog
from capsim.catalog.model_schema import Model, QuantFormat
from capsim.errors import CapsimUserError
from capsim.physics.allreduce_terms import AllReduceTerms
from capsim.physics.attention_backend import attention_backend, runs_triton
from capsim.physics.cuda_graphs import graph_sizes, padded_tokens
from capsim.physics.decode_run import DecodeRuns
from capsim.physics.deployment import Deployment, default_efficiency
from capsim.physics.draft_terms import DrafterTerms
from capsim.physics.drafter_memory import draft_format
from capsim.physics.efficiency import EfficiencyParams
from capsim.physics.expert_terms import ExpertTerms
from capsim.physics.gemm_tiles import GemmTileTerms
from capsim.physics.host_terms import HostTerms
from capsim.physics.kv_layout import kv_layout, per_rank_share
from capsim.physics.memory import (
    check_attention_split,
    check_dp_attention,
    check_expert_parallel,
)
from capsim.physics.offload_terms import OffloadTerms
from capsim.physics.pipeline import PipelineTerms
from capsim.physics.rate_terms import RateTerms
from capsim.physics.roofline import (
    causal_pairs,
    roofline_scalar,
)
from capsim.physics.score_terms import ScoreTerms
from capsim.physics.state_terms import StateTerms
from capsim.physics.step_report import StepReport
from capsim.physics.work_counts import WorkCounts

CONTEXT_FREE_CACHE_SIZE = 65536
"""Entries kept of a step model's context-free step parts before the cache starts over."""


class StepModel(
    StepReport,
    WorkCounts,
    RateTerms,
    DecodeRuns,
    AllReduceTerms,
    PipelineTerms,
    HostTerms,
    DrafterTerms,
    ExpertTerms,
    GemmTileTerms,
    OffloadTerms,
    StateTerms,
    ScoreTerms,
):
    """Step-time model of one replica (a TP group) serving one model.

    Construction precomputes per-deployment constants; ``step`` then costs a few numpy
    operations per call and holds no simulation state. Its terms live in mixins by kind:
    weights read and FLOPs per token (work_counts.py), bandwidths and GEMM rates
    (rate_terms.py), the step term by term for explain (step_report.py), all-reduces
    (allreduce_terms.py), host, launch and front-end time (host_terms.py), the speculative
    drafter (draft_terms.py), routed experts (expert_terms.py), recurrent state
    (state_terms.py), and runs of identical decode steps (decode_run.py).
    """

    def __init__(
        self,
        gpu: GPU,
        model: Model,
        fmt: QuantFormat,
        deployment: Deployment | None = None,
        params: EfficiencyParams | None = None,
        draft: StepModel | None = None,
        elementwise_bytes: float | None = None,
    ):
        """``elementwise_bytes``: bytes per token the layers' elementwise kernels move
        (default: vLLM's fused layer, ``elementwise_bytes_per_token``); a kernel benchmark
        with other kernels passes its own."""
        self.gpu = gpu
        self.model = model
        self.fmt = fmt
        self.deployment = dep = deployment or Deployment()
        self.params = p = params or EfficiencyParams()
        tp = dep.tp
        check_attention_split(model, tp, dep.dp_attention)
        if dep.spec is not None and dep.spec.method == "mtp" and not model.mtp_layers:
            raise CapsimUserError(
                f"{model.name} has no MTP layers, so --spec mtp cannot be used",
                hint="use eagle, draft:MODEL:K or ngram instead",
            )
        if dep.spec is not None and dep.spec.method == "draft" and draft is None:
            raise CapsimUserError("speculative method 'draft' needs the draft model's StepModel")
        self.draft = draft
        check_expert_parallel(model, dep)
        self._ep_cache: dict[float, tuple[float, float, float]] = {}

        # --- weights read and FLOPs per token (WorkCounts)
        parts = self._init_work_counts(elementwise_bytes)

        # --- routed experts in system RAM (OffloadTerms)
        self._init_offload()

        # --- KV layout: per GPU, for the step's sequences as a whole. With data-parallel
        # attention a GPU holds only its rank's share of the sequences (1 / dp_attention,
        # the ranks balanced), each laid out for the rank's attention_tp GPUs
        check_dp_attention(model, tp, dep.dp_attention)
        self.kv = per_rank_share(kv_layout(model, dep.kv_dtype, dep.attention_tp), dep.dp_attention)
        # what attention reads a token: every layer's K and V, KV-shared layers (Gemma 3n/4)
        # reading an earlier layer's cache that they do not write (self.kv: what is stored
        # and written)
        self.kv_read = per_rank_share(
            kv_layout(model, dep.kv_dtype, dep.attention_tp, shared_layers_allocated=True),
            dep.dp_attention,
        )
        per_type = self.kv.per_layer_type
        self.kv_bytes_per_layer_token = per_type.get(
            "mla", per_type.get("full_attention", per_type.get("sliding_attention", 0.0))
        )

        # --- rates (RateTerms)
        self._init_rates()
        # --- block-FP8 dense GEMMs on a one-tile kernel (GemmTileTerms)
        self._init_gemm_tiles()
        # --- attention scores written to memory, without a fused kernel (ScoreTerms)
        self._init_scores()

        # --- communication (AllReduceTerms)
        self._init_communication()
        self._init_pipeline()

        # --- overheads
        self.layers = model.num_layers
        spec = dep.spec
        self.async_host = (
            dep.async_scheduling
            and dep.cuda_graphs
            and (spec is None or spec.method in ("mtp", "eagle"))
        )
        # the scheduler runs a step ahead of the device (vLLM's batch queue, SGLang's
        # overlap loop), so an arrival at a busy engine joins the step after next
        # (engine/replica.py); not where nothing overlaps the device (the CPU backend
        # schedules and computes on the same cores: async_host_overlap 0)
        self.admits_a_step_late = self.async_host and self.params.async_host_overlap > 0
        self._context_free_cache: dict[
            tuple[float, int, int], tuple[float, float, float, float, float]
        ] = {}
        # --- CUDA graphs: the sizes the engine captures (none in eager mode)
        self.graph_sizes = (
            graph_sizes(
                dep.graph_capture,
                dep.max_num_seqs,
                dep.max_num_batched_tokens,
                self.decode_width,
                p.cuda_graph_max_tokens,
                dep.cuda_graph_max_batch,
            )
            if dep.cuda_graphs
            else ()
        )
        # a step runs in a graph when its tokens fit the largest size (-1: never); with
        # data-parallel attention each rank replays its own graph for its share of the
        # batch, so the step fits while each rank's does (the padding is not scaled: a
        # rank's padded rows are zeros, which route to one set of experts, not like tokens)
        self.graph_max_tokens = self.graph_sizes[-1] if self.graph_sizes else -1
        if dep.dp_attention > 1 and self.graph_max_tokens > 0:
            self.graph_max_tokens *= dep.dp_attention

        # --- drafter (MTP / EAGLE: one decoder layer and the lm_head per drafted token)
        self._init_drafter(parts)

    # ------------------------------------------------------------------ the step

    def _aggregate(self, new_tokens, context) -> tuple[float, int, float, float, float, float]:
        """Sums over a step's sequences: (tokens, sequences, context+new, windowed
        context+new, full-attention pairs, windowed pairs)."""
        n = np.asarray(new_tokens, dtype=float)
        c = np.asarray(context, dtype=float)
        if n.shape != c.shape or n.ndim != 1:
            raise ValueError("new_tokens and context must be 1-D arrays of the same length")
        if n.size and (n.min() < 0 or c.min() < 0):
            raise ValueError("token counts must be non-negative")
        active = n > 0
        if not active.all():
            n, c = n[active], c[active]
        return self._sums(n, c)

    def _sums(self, n: np.ndarray, c: np.ndarray) -> tuple[float, int, float, float, float, float]:
        """``_aggregate`` for float arrays of scheduled sequences (every ``n`` positive)."""
        sums = self._even_sums(n, c)
        if self.deployment.dp_attention > 1 and n.size:
            return self._busiest_rank(sums, n, c)
        return sums

    def _busiest_rank(
        self, sums: tuple[float, int, float, float, float, float], n: np.ndarray, c: np.ndarray
    ) -> tuple[float, int, float, float, float, float]:
        """``sums`` as the busiest data-parallel attention rank sees them, in the even
        split's units (each GPU's KV bytes and pair FLOPs are the even share, 1 / ranks, of
        these): a sequence runs on one rank, so that rank reads at least the largest
        sequence's KV and computes its query-key pairs with all of the heads, ranks times
        what the even split gives it. A lone request decodes and prefills at that cost."""
        ranks = self.deployment.dp_attention
        tokens, seqs, total, windowed, pairs, pairs_windowed = sums
        total = max(total, ranks * float((c + n).max()))
        each = self._mla_pairs(n, c) if self.mla_two_forms else n * c + 0.5 * (n * n + n)
        pairs = max(pairs, ranks * float(each.max()))
        window = self.kv.sliding_window
        if window is None:
            return tokens, seqs, total, total, pairs, pairs
        windowed = max(windowed, ranks * float(np.minimum(c + n, window).max()))
        pairs_windowed = max(pairs_windowed, ranks * float(causal_pairs(c, n, window).max()))
        return tokens, seqs, total, windowed, pairs, pairs_windowed

    def _mla_pairs(self, n: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Each sequence's causal query-key pairs in decode-pair FLOP units for an MLA
        model: a sequence that decodes (at most the decode width of new tokens) attends in
        the absorbed form; a prefill chunk in the up-projected form, at
        ``mla_prefill_pair_ratio`` of the FLOPs a pair, after up-projecting its cached
        context (``mla_context_upproj_pairs`` a cached token)."""
        pairs = n * c + 0.5 * (n * n + n)
        prefill = n > self.decode_width
        return np.where(
            prefill, pairs * self.mla_prefill_pair_ratio + c * self.mla_context_upproj_pairs, pairs
        )

    def _even_sums(
        self, n: np.ndarray, c: np.ndarray
    ) -> tuple[float, int, float, float, float, float]:
        """The sums over a step's sequences, as if they were spread evenly."""
        tokens = float(np.add.reduce(n))
        sum_total = float(np.add.reduce(c)) + tokens
        # sum of n*c + n*(n+1)/2: the causal query-key pairs of each sequence
        if self.mla_two_forms:
            pairs = float(self._mla_pairs(n, c).sum())
        else:
            pairs = float(n @ c) + 0.5 * (float(n @ n) + tokens)
        window = self.kv.sliding_window
        if window is None:
            return tokens, int(n.size), sum_total, sum_total, pairs, pairs
        windowed = float(np.minimum(c + n, window).sum())
        return (
            tokens,
            int(n.size),
            sum_total,
            windowed,
            pairs,
            float(causal_pairs(c, n, window).sum()),
        )

    def _terms(
        self,
        tokens: float,
        seqs: int,
        sum_total: float,
        sum_windowed: float,
        pairs: float,
        pairs_windowed: float,
        logits: int,
        draft_time: float,
        pad: bool = True,
    ) -> dict[str, float]:
        """Every term of one step from the sequences' sums (scalar arithmetic only).

        With ``pad`` the GEMMs, the MoE router and the all-reduces see the step's tokens
        padded to its CUDA-graph size (``graph_tokens``); attention and the KV cache see
        the real tokens."""
        kv = self.kv
        graph = padded_tokens(tokens, self.graph_sizes) if pad else tokens
        routed = tokens + (graph - tokens) * self.params.moe_padding_routed
        passes = self.passes(tokens)
        # each pass (ubatch) routes its own tokens and reads the weights again
        touched = self.experts_touched_scalar(routed / passes) if tokens else 0.0
        # the busiest GPU's share: the TP slices it reads, its GEMM pipelines, its pairs
        # over the mean (all 'touched', 'touched' and 1 without expert parallelism)
        read, pipelines, busiest = self.expert_parallel_load(routed / passes, touched)
        expert_bytes = passes * self.moe_layers * read * self.expert_slice_bytes
        if touched and self.params.l2_reuse_strength:
            expert_bytes *= 1.0 - float(self.l2_reuse_fraction(np.asarray(touched)))
        # experts in system RAM: read by the CPU, or copied over for the GPU (OffloadTerms)
        t_offload, on_gpu = self.offload_terms(routed / passes, touched, passes)
        expert_bytes *= on_gpu
        dense_bytes = passes * self.dense_weight_bytes if tokens else 0.0
        if self.weights_in_host_share:  # --cpu-offload-gb: that share over the host link
            t_offload += self.weights_in_host_seconds(dense_bytes + expert_bytes)
            dense_bytes *= 1.0 - self.weights_in_host_share
            expert_bytes *= 1.0 - self.weights_in_host_share
        # the sampler's passes over float32 logits (the driver rank holds the whole vocab)
        sampler_bytes = logits * self.model.vocab_size * 4.0 * self.params.sampler_logit_passes
        r = self.kv_read
        kv_read = sum_total * r.full_bytes_per_token + sum_windowed * r.sliding_bytes_per_token
        kv_write = tokens * kv.bytes_per_token
        state = self.state_traffic_bytes(seqs)
        t_state = state / self.state_bw
        dense_flops = graph * self.dense_flops_per_token + logits * self.lm_head_flops_per_token
        expert_flops = routed * self.expert_flops_per_token * on_gpu * busiest
        full_pairs, score_bytes, t_scores = self.score_step(pairs, tokens, sum_total)
        attn_flops = (
            self.full_pair_flops * full_pairs
            + self.sliding_pair_flops * pairs_windowed
            + tokens * self.linear_flops_per_token
        )
        t_comm = passes * self.communication_scalar(graph / passes) if tokens else 0.0
        # block-FP8 dense GEMMs whose few output tiles leave multiprocessors idle
        t_tiles = (
            passes
            * self.block_fp8_tile_seconds(graph / passes)
            * (1.0 - self.weights_in_host_share)
            if tokens
            else 0.0
        )
        activation_bytes = graph * self.elementwise_bytes_per_token
        t_host = self.host_seconds(seqs) if seqs else 0.0
        t_floor = passes * self.kernel_floor_us(tokens) * 1e-6 if seqs else 0.0
        t_dispatch = passes * self.dispatch_seconds(tokens / passes) if seqs else 0.0
        return {
            "graph_tokens": graph,
            "touched": touched,
            "ep_busiest": pipelines if self.deployment.expert_parallel and touched else 0.0,
            "ep_pair_load": busiest,
            "dense_bytes": dense_bytes,
            "expert_bytes": expert_bytes,
            "kv_read": kv_read,
            "kv_write": kv_write,
            "state": state,
            "linear_flops": dense_flops + expert_flops,
            "attn_flops": attn_flops,
            "sampler_bytes": sampler_bytes,
            "activation_bytes": activation_bytes,
            "t_elementwise": activation_bytes / self.elementwise_bw,
            "score_bytes": score_bytes,
            "t_scores": t_scores,
            "t_dense_mem": (dense_bytes + sampler_bytes) / self.dense_bw + t_tiles,
            "t_tiles": t_tiles,
            "t_dense_cmp": dense_flops / self.dense_gemm_rate(graph / passes),
            "t_exp_mem": (
                expert_bytes / self.expert_bw
                + passes * self.moe_layers * pipelines * self.params.moe_expert_overhead_us * 1e-6
            ),
            "expert_rate": (rate := self.expert_gemm_rate(routed / passes, touched)),
            "t_exp_cmp": expert_flops / rate,
            "t_att_mem": (kv_read + kv_write) / self.kv_bw + t_state,
            "t_state": t_state,
            "t_att_cmp": (
                attn_flops / self.attention_flops_rate + self.gdn_prefill_extra(tokens, seqs)
            ),
            "t_comm": t_comm,
            "t_offload": t_offload,
            "t_host": t_host,
            "t_floor": t_floor,
            "t_dispatch": t_dispatch,
            "t_draft": draft_time,
            "decode_only": self._decode_only(tokens, seqs),
        }

    def _roofline(self, t: dict[str, float]) -> float:
        """Weights, experts and attention, each its smooth roofline of memory and compute
        time (s)."""
        p = self.params.roofline_sharpness
        return (
            roofline_scalar(t["t_dense_mem"], t["t_dense_cmp"], p)
            + roofline_scalar(t["t_exp_mem"], t["t_exp_cmp"], p)
            + roofline_scalar(t["t_att_mem"], t["t_att_cmp"], p)
        )

    def _gpu(self, t: dict[str, float]) -> float:
        """The GPU's work in a step (s): rooflines, elementwise kernels, communication and
        the kernel floor."""
        return (
            self._roofline(t)
            + t["t_elementwise"]
            + t["t_scores"]
            + t["t_comm"]
            + t["t_floor"]
            + t["t_offload"]
        )

    def _device(self, t: dict[str, float]) -> float:
        """A step's device work (s): the GPU's work or its eager launches, and drafting."""
        return float(self._overlapped(self._gpu(t), t["t_dispatch"])) + t["t_draft"]

    def _total(self, t: dict[str, float], device: float | None = None) -> float:
        """A step's duration (s) from its terms (``device``: their _device, if known)."""
        device = self._device(t) if device is None else device
        return float(self._with_host(t["t_host"], device, t["decode_only"]))

    def kernel_seconds(self, new_tokens: np.ndarray | list[int], context) -> float:
        """GPU time of one step's kernels, seconds: weights, routed experts and attention
        (each the larger of its memory and compute time) plus the per-layer kernel floor
        (``layer_overhead_graph_us`` with CUDA graphs). Leaves out host-side overheads
        (per step and per sequence), communication and drafting, which is what a
        single-GPU kernel measurement (``capsim.calibration.kernels``) times; that
        measurement captures a graph for each exact batch, so nothing is padded."""
        agg = self._aggregate(new_tokens, context)
        t = self._terms(*agg, agg[1], 0.0, pad=False)
        return (
            self._roofline(t)
            + t["t_elementwise"]
            + t["t_scores"]
            + self.kernel_floor_us(agg[0]) * 1e-6
        )

    def step_time(
        self,
        new_tokens: np.ndarray | list[int],
        context: np.ndarray | list[float],
        logits_tokens: int | None = None,
        drafting_sequences: int = 0,
    ) -> float:
        """Duration of one engine step in seconds (what ``step`` reports as t_total)."""
        agg = self._aggregate(new_tokens, context)
        logits = agg[1] if logits_tokens is None else logits_tokens
        draft = self._draft_for(drafting_sequences, new_tokens, context)
        return self._seconds(agg, logits, draft)

    def scheduled_step_time(
        self,
        new_tokens: np.ndarray,
        context: np.ndarray,
        logits_tokens: int | None = None,
        draft_context: np.ndarray | None = None,
    ) -> float:
        """``step_time`` for the engine's scheduled steps, seconds: float arrays of the
        same length with every ``new_tokens`` entry positive, so no checks are repeated
        on the simulation's hot path. ``draft_context`` holds the tokens in KV of each
        sequence the speculative drafter proposes for (the decoding ones)."""
        sums = self._sums(new_tokens, context)
        logits = sums[1] if logits_tokens is None else logits_tokens
        draft = 0.0
        if draft_context is not None and draft_context.size and self.deployment.spec is not None:
            draft = self.draft_seconds(draft_context.size, draft_context)
        return self._seconds(sums, logits, draft)

    @cached_property
    def takes_moments(self) -> bool:
        """Whether a step depends on its sequences' contexts only through their sum: no
        sliding-window attention (whose KV reads need each sequence's own context), no
        speculation (whose drafter does) and no data-parallel attention (whose busiest rank
        holds at least the longest sequence), and no MLA (whose prefill chunks attend in
        another form than its decodes). Then ``moment_step_time`` applies and a
        decode run is affine in its step (``_affine_decode_run_times``)."""
        dep = self.deployment
        return (
            self.kv.sliding_window is None
            and dep.spec is None
            and dep.dp_attention == 1
            and not self.mla_two_forms  # MLA: prefill pairs cost their own
            and not self.scores_materialized  # their share in L2 is not affine in context
        )

    def moment_step_time(
        self, tokens: float, seqs: int, context_sum: float, dot: float, square: float
    ) -> float:
        """``scheduled_step_time`` from the step's token moments, seconds: ``tokens`` new
        tokens over ``seqs`` sequences that held ``context_sum`` tokens in KV before it,
        with sum(new x context) = ``dot`` and sum(new^2) = ``square`` (``takes_moments``
        must hold). The same sums ``_sums`` takes from the arrays, without them."""
        total = context_sum + tokens
        pairs = dot + 0.5 * (square + tokens)
        return self._seconds((tokens, seqs, total, total, pairs, pairs), seqs, 0.0)

    def _seconds(
        self, sums: tuple[float, int, float, float, float, float], logits: int, draft: float
    ) -> float:
        """A step's duration from its sequences' sums (``_sums``), seconds: the cached
        context-free part plus the attention term at this context, and the drafter. Equal
        to ``_total`` of the step's terms (tested), without building them."""
        tokens, seqs, sum_total, sum_windowed, pairs, pairs_windowed = sums
        host, gpu, dispatch, att_mem, att_cmp = self._context_free(tokens, seqs, logits)
        r = self.kv_read
        kv_read = sum_total * r.full_bytes_per_token + sum_windowed * r.sliding_bytes_per_token
        t_scores = 0.0
        if self.scores_materialized:  # an attribute check on the fused-attention hot path
            pairs, _, t_scores = self.score_step(pairs, tokens, sum_total)
        attention_flops = self.full_pair_flops * pairs + self.sliding_pair_flops * pairs_windowed
        attention = roofline_scalar(
            att_mem + kv_read / self.kv_bw,
            att_cmp + attention_flops / self.attention_flops_rate,
            self.params.roofline_sharpness,
        )
        gpu = gpu + attention + t_scores
        if dispatch:
            serial = (1.0 - self.params.launch_overlap) * min(gpu, dispatch)
            gpu = max(gpu, dispatch) + serial  # _overlapped, for scalars
        device = gpu + draft
        if not self.async_host or not self._decode_only(tokens, seqs):
            return host + device  # no overlap with prefill in the step
        hidden = self.params.async_host_overlap * host
        return max(device, hidden) + (host - hidden)  # _with_host, for scalars

    @cached_property
    def decode_width(self) -> int:
        """Tokens each decoding sequence processes per step (1, or k + 1 when speculating);
        like ``decode_advance`` and ``takes_moments``, read once from the deployment, which
        a step model keeps."""
        spec = self.deployment.spec
        return 1 if spec is None else spec.verify_width

    @cached_property
    def decode_advance(self) -> float:
        """Expected tokens a decoding sequence gains per step."""
        spec = self.deployment.spec
        return 1.0 if spec is None else spec.expected_tokens_per_step

    def _context_free(
        self, tokens: float, seqs: int, logits: int
    ) -> tuple[float, float, float, float, float]:
        """The parts of a step that do not depend on its sequences' contexts, seconds:
        the host's serial work, the GPU's weights, experts, communication and kernel floor
        summed, the eager launches, and the attention memory and compute terms at zero
        context (KV writes, per-sequence state, linear-attention FLOPs). The full step adds
        each attention term's context part and takes the larger. Cached per (tokens,
        sequences, logits)."""
        key = (tokens, seqs, logits)
        cached = self._context_free_cache.get(key)
        if cached is None:
            t = self._terms(tokens, seqs, 0.0, 0.0, 0.0, 0.0, logits, 0.0)
            gpu = (
                roofline_scalar(t["t_dense_mem"], t["t_dense_cmp"], self.params.roofline_sharpness)
                + roofline_scalar(t["t_exp_mem"], t["t_exp_cmp"], self.params.roofline_sharpness)
                + t["t_elementwise"]
                + t["t_comm"]
                + t["t_floor"]
                + t["t_offload"]
            )
            if len(self._context_free_cache) >= CONTEXT_FREE_CACHE_SIZE:
                self._context_free_cache.clear()
            cached = self._context_free_cache[key] = (
                t["t_host"],
                gpu,
                t["t_dispatch"],
                t["t_att_mem"],
                t["t_att_cmp"],
            )
        return cached


def with_attention_backend(catalog: Catalog, gpu: GPU, model: Model, dep: Deployment):
    """``dep`` with its attention backend resolved (the one asked for, else the engine's
    choice for this model and GPU) and whether it runs Triton kernels
    (physics/attention_backend.py)."""
    engine = catalog.engines.find(dep.engine)
    backend = attention_backend(engine, model, gpu, dep.attention_backend)
    triton = runs_triton(engine, backend)
    if backend == dep.attention_backend and triton == dep.triton_attention:
        return dep
    return dep.model_copy(update={"attention_backend": backend, "triton_attention": triton})


def build_step_model(
    catalog: Catalog,
    gpu: GPU | str,
    model: Model | str,
    deployment: Deployment | None = None,
    params: EfficiencyParams | None = None,
) -> StepModel:
    """A StepModel from catalog names, with the GPU's default efficiency parameters."""
    g = catalog.gpu(gpu) if isinstance(gpu, str) else gpu
    m = catalog.model(model) if isinstance(model, str) else model
    dep = with_attention_backend(catalog, g, m, deployment or Deployment())
    fmt = catalog.quant(dep.quant or m.dtype)
    if dep.weight_only and not fmt.weight_only and fmt.compute_dtype in g.native_formats:
        # the engine's kernel takes 16-bit inputs where the GPU could multiply the format
        # itself (a GPU without the format's tensor cores dequantises it anyway)
        fmt = fmt.model_copy(update={"weight_only": True})
    p = params or default_efficiency(g, catalog)
    draft = None
    if dep.spec is not None and dep.spec.method == "draft":
        draft_model = catalog.model(dep.spec.draft_model)
        draft = StepModel(
            g,
            draft_model,
            draft_format(catalog, dep.quant, draft_model),
            Deployment(
                tp=dep.tp,
                kv_dtype=dep.kv_dtype,
                power_limit_w=dep.power_limit_w,
                interconnect=dep.interconnect,
                cuda_graphs=dep.cuda_graphs,
            ),
            p,
        )
    return StepModel(g, m, fmt, dep, p, draft=draft)
