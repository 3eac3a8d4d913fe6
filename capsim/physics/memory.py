"""Memory fit: weights, KV cache and runtime reserve per GPU, the way vLLM budgets memory.

vLLM (V1 ``gpu_worker.determine_available_memory``) gives the KV cache what is left of
``total_memory x gpu_memory_utilization`` after the weights, the peak activation memory of
a profiling forward pass with ``max_num_batched_tokens`` tokens, and memory that torch does
not own (CUDA context, cuBLAS and NCCL workspaces) and CUDA graphs. capsim follows that
budget term by term:

    kv_budget = memory x utilization - weights - activations - runtime_reserve - cuda_graphs

All byte counts are per GPU of one tensor-parallel group. Units: bytes unless a name says
otherwise; ``*_gib`` is 2**30 bytes, ``*_gb`` 1e9 bytes. What the KV cache costs per token
and layer type is physics/kv_layout.py's; element sizes are physics/dtypes.py's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from capsim.arguments import require_entries
from capsim.catalog.engine_schema import SlidingWindowPool
from capsim.catalog.gpu_schema import GPU
from capsim.catalog.model_schema import Model, QuantFormat
from capsim.errors import CapsimUserError, DoesNotFitError
from capsim.physics.drafter_memory import (
    Drafter,
    drafter_kv_bytes_per_token,
    drafter_weight_bytes,
)
from capsim.physics.dtypes import ACTIVATION_BYTES
from capsim.physics.fit_options import check_fit_options
from capsim.physics.kv_layout import (
    BLOCK_SIZE_TOKENS,
    KVLayout,
    kv_layout,
    window_pages_layout,
    window_pool_layout,
)
from capsim.physics.parameters import parameter_breakdown
from capsim.physics.pipeline import check_pipeline, stage_layout, stage_weight_parts

GIB = 2**30
GB = 1e9

DEFAULT_CONTEXT_TOKENS = 4096
"""Sequence length for the 'sequences that fit' figure when neither a context nor
max_model_len is given (a typical agent turn: a few thousand tokens of context)."""


def vllm_default_batch_limits(gpu: GPU) -> tuple[int, int]:
    """vLLM's defaults for the OpenAI server: (max_num_batched_tokens, max_num_seqs).

    vLLM (``EngineArgs.get_batch_defaults``) gives GPUs with at least 70 GiB that are not
    A100s a budget of 8192 tokens and 1024 sequences, and every other GPU 2048 and 256
    ("NOTE(Kuntai): Setting large max_num_batched_tokens for A100 reduces throughput").
    """
    big = gpu.memory_gb >= 70 and not gpu.name.startswith("a100")
    return (8192, 1024) if big else (2048, 256)


@dataclass(frozen=True)
class RuntimeReserve:
    """Memory outside weights and KV that a serving engine holds, bytes per GPU.

    Attributes:
        cuda_context_bytes: CUDA context, cuBLAS/cuDNN workspaces and the allocator's
            fragmentation that vLLM counts as 'non-torch memory'. vLLM's start-up log
            reports this per GPU; 0.6-1.0 GiB is typical on NVIDIA, so the default is
            0.75 GiB. A calibration parameter, not a datasheet figure.
        nccl_bytes: extra non-torch memory of NCCL communicators when TP > 1 (default
            0.25 GiB, from the same log line; calibration parameter).
        cuda_graph_bytes: memory of captured CUDA graphs (vLLM logs 'Graph capturing
            finished ... took X GiB'; default 0.5 GiB, 0 with ``enforce_eager``).
        sampler_logit_copies: fp32 copies of the [max_num_seqs x vocab] logits the
            profiling run's sampler holds at its peak (default 2).
    """

    cuda_context_bytes: float = 0.75 * GIB
    nccl_bytes: float = 0.25 * GIB
    cuda_graph_bytes: float = 0.5 * GIB
    sampler_logit_copies: float = 2.0


DEFAULT_RESERVE = RuntimeReserve()


def check_tensor_parallel(model: Model, tp: int) -> None:
    """Reject a TP size vLLM would reject: it must divide the attention (and GDN) heads."""
    if tp < 1:
        raise CapsimUserError(f"tensor parallel size must be at least 1, got {tp}")
    if model.num_attention_heads % tp:
        raise CapsimUserError(
            f"tensor parallel size {tp} does not divide {model.name}'s "
            f"{model.num_attention_heads} attention heads",
            hint="vLLM requires num_attention_heads % tensor_parallel_size == 0; pick a "
            "divisor such as "
            + ", ".join(str(d) for d in (1, 2, 4, 8) if model.num_attention_heads % d == 0),
        )
    mb = model.mamba
    if mb is not None and mb.num_heads % tp:
        raise CapsimUserError(
            f"tensor parallel size {tp} does not divide {model.name}'s {mb.num_heads} Mamba heads"
        )
    la = model.linear_attention
    if la is not None and (la.num_key_heads % tp or la.num_value_heads % tp):
        raise CapsimUserError(
            f"tensor parallel size {tp} does not divide {model.name}'s linear-attention heads "
            f"({la.num_key_heads} key, {la.num_value_heads} value)"
        )


def check_dp_attention(model: Model, tp: int, dp_attention: int) -> None:
    """Reject data-parallel attention SGLang would reject (its DP size must divide the TP
    size: ``assert self.tp_size % self.dp_size == 0``) or capsim does not model."""
    if dp_attention == 1:
        return
    if dp_attention < 1 or tp % dp_attention:
        raise CapsimUserError(
            f"--dp {dp_attention} with --enable-dp-attention does not divide --tp {tp}",
            hint="SGLang needs tp % dp == 0; the usual choice is --dp equal to --tp "
            "(attention on every GPU alone)",
        )
    check_tensor_parallel(model, tp // dp_attention)


def check_attention_split(model: Model, tp: int, dp_attention: int = 1) -> None:
    """Reject a split of the attention heads the engine would reject: over the whole TP
    group, or with data-parallel attention (SGLang's, and vLLM's --data-parallel-size with
    --enable-expert-parallel, simulated as it) over each rank's tp // dp_attention GPUs,
    whatever the group's size (vLLM's --dp 3 --enable-expert-parallel runs a 16-head model's
    attention whole on each of 3 GPUs)."""
    if dp_attention == 1:
        check_tensor_parallel(model, tp)
    else:
        check_dp_attention(model, tp, dp_attention)


def check_expert_parallel(model: Model, deployment) -> None:
    """Reject expert parallelism where vLLM and SGLang would, or where capsim does not
    model it: a model without routed experts, an expert count the TP group does not
    divide, experts kept in system RAM."""
    if not deployment.expert_parallel:
        return
    if model.moe is None:
        raise CapsimUserError(
            f"--enable-expert-parallel needs routed experts, and {model.name} is dense",
            hint="leave the flag out for a dense model",
        )
    tp = deployment.tp
    if model.moe.num_experts % tp:
        raise CapsimUserError(
            f"expert parallelism over {tp} GPUs does not divide {model.name}'s "
            f"{model.moe.num_experts} routed experts",
            hint="pick a group (--tp, times --dp with vLLM's --enable-expert-parallel) "
            "that divides the expert count: "
            + ", ".join(str(d) for d in (1, 2, 4, 8, 16) if model.moe.num_experts % d == 0),
        )
    if deployment.cpu_moe_layers:
        raise CapsimUserError(
            "--enable-expert-parallel with --n-cpu-moe is not modelled",
            hint="leave one of them out",
        )


def _format_bits(fmt: QuantFormat, group: str) -> float:
    return fmt.bits_per_weight if group in fmt.quantized_tensors else fmt.unquantized_bits


def weight_bytes(
    model: Model,
    fmt: QuantFormat,
    tp: int = 1,
    include_mtp: bool = False,
    attention_tp: int | None = None,
    dense_tp: int | None = None,
) -> dict[str, float]:
    """Weight bytes per GPU by component.

    Linear layers, embeddings and the output head are split over the TP group (vLLM's
    column/row-parallel and vocab-parallel layers); norms and routers are replicated. The
    attention layers are split over ``attention_tp`` GPUs where that is given (one
    data-parallel attention rank's, SGLang's --enable-dp-attention), else over the group;
    MLA's down-projections (``attention_replicated``) are whole on every GPU, as the engines
    hold them.
    Quantised groups cost ``fmt.bits_per_weight`` bits per weight, the rest
    ``fmt.unquantized_bits`` (embedding and head at their own bits where the format says).
    A tied embedding table is the output head too and is stored at the head's bits
    (llama.cpp gives a tied token_embd the output tensor's type: see gguf-q4_0.yaml).
    ``dense_tp``, where given, splits the dense MLP layers and the shared experts over that
    many GPUs instead (vLLM's data parallelism with expert parallelism: each rank runs them
    whole on its own GPUs, only the routed experts span the group).
    """
    p = parameter_breakdown(model)
    lm_head_bits = fmt.lm_head_bits or fmt.unquantized_bits
    embedding_bits = (
        lm_head_bits if model.tie_word_embeddings else fmt.embedding_bits or fmt.unquantized_bits
    )
    parts = {
        "embeddings": p.embeddings * embedding_bits / 8 / tp,
        "per_layer_embeddings": p.per_layer_embeddings
        * (fmt.embedding_bits or fmt.unquantized_bits)
        / 8
        / tp,
        "lm_head": p.lm_head * lm_head_bits / 8 / tp,
        "attention": (
            (p.attention - p.attention_replicated) / (attention_tp or tp) + p.attention_replicated
        )
        * _format_bits(fmt, "attention")
        / 8,
        "linear_attention": (
            p.linear_attention * _format_bits(fmt, "linear_attention") / 8 / tp
            + p.linear_attention_small * fmt.unquantized_bits / 8 / tp
        ),
        "mlp": p.mlp * _format_bits(fmt, "mlp") / 8 / (dense_tp or tp),
        "experts": (p.routed_experts / tp + p.shared_experts / (dense_tp or tp))
        * _format_bits(fmt, "experts")
        / 8,
        "router": p.router * fmt.unquantized_bits / 8,
        "norms": p.norms * fmt.unquantized_bits / 8,
        "vision": p.vision * fmt.unquantized_bits / 8 / tp,
        "mtp": 0.0,
    }
    if include_mtp and p.mtp:
        parts["mtp"] = p.mtp * fmt.bits_per_weight / 8 / tp
    return parts


def activation_peak_bytes(
    model: Model,
    tp: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    reserve: RuntimeReserve = DEFAULT_RESERVE,
) -> float:
    """Peak activation memory of vLLM's profiling pass, bytes per GPU.

    The profiling pass runs ``max_num_batched_tokens`` tokens through the model; the peak
    sits in the FFN, where the residual stream (2 x hidden), the gate/up output
    (2 x ffn width / tp) and the down-projection input (ffn width / tp) coexist. For MoE the
    fused-MoE kernel holds those per token per routed expert (x top-k). The sampler then
    holds ``sampler_logit_copies`` fp32 copies of [max_num_seqs x vocab] logits.
    """
    h = model.hidden_size
    if model.moe is not None:
        width = model.moe.experts_per_token * model.moe.moe_intermediate_size
        width += model.moe.num_shared_experts * model.moe.shared_width
    else:
        assert model.intermediate_size is not None
        width = model.intermediate_size
    per_token = (2 * h + 3 * width / tp) * ACTIVATION_BYTES
    ffn_peak = max_num_batched_tokens * per_token
    logits = max_num_seqs * model.vocab_size * 4 * reserve.sampler_logit_copies
    return ffn_peak + logits


@dataclass(frozen=True)
class MemoryFit:
    """Result of fitting a model on a GPU: the budget term by term, bytes per GPU."""

    gpu: str
    model: str
    quant: str
    kv_dtype: str
    tp: int
    gpu_memory_utilization: float
    memory_bytes: float
    budget_bytes: float
    weight_bytes: float
    weight_breakdown: dict[str, float]
    activation_bytes: float
    runtime_reserve_bytes: float
    kv_budget_bytes: float
    kv_bytes_per_token: float
    kv_full_bytes_per_token: float
    kv_sliding_bytes_per_token: float
    sliding_window: int | None
    state_bytes_per_sequence: float
    state_layout: str
    state_pool_bytes: float
    state_blocks_per_sequence: int
    state_sequence_cap: int | None
    state_slots_per_sequence: int
    kv_per_layer_type: dict[str, float]
    kv_capacity_tokens: int
    max_model_len: int
    max_model_len_limit: int
    context_tokens: int
    max_sequences: int
    max_num_seqs: int
    max_num_batched_tokens: int
    fits: bool
    reason: str
    experts_in_system_ram_bytes: float = 0.0  # routed experts kept in host memory (--n-cpu-moe)
    # window-pool tokens per full-pool token where the engine keeps sliding-window layers
    # in a pool apart (SGLang's hybrid SWA memory); kv_bytes_per_token is then one
    # full-pool token's cost
    sliding_pool_ratio: float | None = None
    # the sliding-window pages a running sequence holds where the engine keeps only the
    # window (vLLM), counted with its state pages (state_blocks_per_sequence)
    window_bytes_per_sequence: float = 0.0
    # data-parallel attention ranks in the TP group (SGLang's --enable-dp-attention): the
    # KV capacity and sequences are theirs together, each rank's pool laid out for
    # tp / dp_attention GPUs (kv_bytes_per_token is one rank's GPU's)
    dp_attention: int = 1
    # pipeline stages: the figures per GPU are the busiest stage's
    pp: int = 1
    # weights kept in pinned system RAM (--cpu-offload-gb), bytes per GPU
    weights_in_system_ram_bytes: float = 0.0

    @property
    def weight_gib(self) -> float:
        return self.weight_bytes / GIB

    @property
    def state_caps_batch(self) -> bool:
        """Whether the engine's own recurrent-state pool, not max_num_seqs as asked, sets
        how many requests run at once (memory_fit lowered max_num_seqs to its cap)."""
        return self.state_sequence_cap is not None and self.max_num_seqs == self.state_sequence_cap

    def to_dict(self) -> dict:
        d = asdict(self)
        d["units"] = "bytes per GPU unless named otherwise"
        return d


def memory_fit(
    gpu: GPU,
    model: Model,
    fmt: QuantFormat,
    *,
    tp: int = 1,
    kv_dtype: str = "auto",
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    context_tokens: int | None = None,
    enforce_eager: bool = False,
    reserve: RuntimeReserve = DEFAULT_RESERVE,
    default_limits: tuple[int, int] | None = None,
    state_layout: str = "shared",
    state_share: float | None = None,
    state_slots_per_sequence: int = 1,
    cpu_moe_layers: int = 0,
    sliding_window_pool: SlidingWindowPool | None = None,
    sliding_window_pages: bool = False,
    dp_attention: int = 1,
    drafter: Drafter | None = None,
    pp: int = 1,
    cpu_offload_gb: float = 0.0,
    dense_in_ranks: bool = False,
) -> MemoryFit:
    """Fit ``model`` in ``fmt`` on a TP group of ``gpu``; report the budget and KV capacity.

    Args:
        tp: tensor-parallel size (GPUs that share one copy of the weights).
        kv_dtype: ``--kv-cache-dtype`` (auto, bf16, fp16, fp8, ...).
        gpu_memory_utilization: fraction of GPU memory vLLM may use (0 < u <= 1).
        max_model_len: longest sequence (prompt + output) in tokens; None means the model's
            maximum context capped by what one sequence's KV can hold (vLLM's
            ``--max-model-len auto``).
        max_num_seqs: most sequences batched at once (default: vLLM's for this GPU).
        max_num_batched_tokens: token budget per step (default: vLLM's for this GPU; see
            vllm_default_batch_limits).
        context_tokens: sequence length for the 'sequences that fit' figure; default
            max_model_len if given, else 4096 tokens (capped by what fits).
        enforce_eager: no CUDA graphs (their memory is not reserved).
        default_limits: the serving engine's (max_num_batched_tokens, max_num_seqs) for
            this GPU where the flags leave them unset (default: vLLM's).
        state_layout: where a hybrid model's recurrent state lives: "shared" (pages of
            the KV pool, one set per running sequence: vLLM) or "split" (a pool of its own,
            ``state_share`` of the memory left after weights and reserves, holding
            ``state_slots_per_sequence`` slots per running sequence: SGLang). With "split"
            the state pool caps running sequences (``state_sequence_cap``).
        cpu_moe_layers: MoE layers whose routed experts stay in system RAM (llama.cpp's
            ``--n-cpu-moe``): their bytes leave the GPU's weights
            (``experts_in_system_ram_bytes``).
        sliding_window_pool: the engine's pool apart for sliding-window layers (SGLang's
            hybrid SWA memory), where it applies to this model: the KV capacity is then
            counted in full-pool tokens (kv_layout.window_pool_layout).
        sliding_window_pages: the engine keeps a sliding-window layer's window only (vLLM's
            hybrid KV cache manager): the window's pages are a fixed part of each running
            sequence (kv_layout.window_pages_layout).
        dp_attention: data-parallel attention ranks inside the TP group (SGLang's
            --enable-dp-attention): each GPU holds the attention weights of its rank's
            tp / dp_attention GPUs and a KV cache of its own rank's sequences, so the
            capacity (tokens, sequences) is dp_attention ranks' worth, each laid out for
            tp / dp_attention GPUs.
        drafter: the speculative drafter loaded beside the model (drafter_memory.Drafter):
            its weights leave the KV budget (an MTP drafter's are the model's MTP module)
            and its attention layers' KV joins every token of the pool.
        dense_in_ranks: with data-parallel attention, the dense MLP layers and shared
            experts too are whole on each rank's GPUs (vLLM's --data-parallel-size with
            --enable-expert-parallel), not split over the group (SGLang's DP attention).
        cpu_offload_gb: GiB of each GPU's weights kept in pinned system RAM (vLLM's and
            SGLang's --cpu-offload-gb), at most all of them: they leave the GPU's weights
            (``weights_in_system_ram_bytes``) and are read over the host link every pass.
        pp: pipeline stages: a GPU holds the busiest stage's layers and their KV cache
            (physics/pipeline.py), so the figures are that stage's; the KV capacity in
            tokens is the whole pipeline's.
    """
    if not (isinstance(gpu, GPU) and isinstance(model, Model) and isinstance(fmt, QuantFormat)):
        require_entries(gpu, model, fmt)  # the Python API's: a name where an entry is taken
    check_fit_options(
        kv_dtype=kv_dtype,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enforce_eager=enforce_eager,
        reserve=reserve,
        default_limits=default_limits,
        state_layout=state_layout,
        state_slots_per_sequence=state_slots_per_sequence,
        cpu_moe_layers=cpu_moe_layers,
        sliding_window_pool=sliding_window_pool,
        sliding_window_pages=sliding_window_pages,
        drafter=drafter,
        dense_in_ranks=dense_in_ranks,
    )
    for name, count in (("tp", tp), ("pp", pp), ("dp_attention", dp_attention)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            # the Python API's arguments: a 0 divided by zero further down
            raise CapsimUserError(f"{name} must be a whole number of 1 or more, got {count!r}")
    for name, value in (("cpu_offload_gb", cpu_offload_gb), ("context_tokens", context_tokens)):
        if value is not None and not (isinstance(value, int | float) and 0 <= value < 1e15):
            raise CapsimUserError(f"{name} must be a finite number of 0 or more, got {value!r}")
    if state_share is not None and not (
        isinstance(state_share, int | float) and 0 < state_share <= 1
    ):
        raise CapsimUserError(f"state_share must be in (0, 1], got {state_share!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise CapsimUserError(
            f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}",
            hint="vLLM's default is 0.9",
        )
    default_batched, default_seqs = default_limits or vllm_default_batch_limits(gpu)
    # each data-parallel attention rank runs a scheduler of its own: SGLang divides a set
    # --max-running-requests among them (scheduler.py: "self.per_dp_max_running_requests =
    # self.max_running_requests // self.dp_size"), and unset each takes what its own pool
    # holds, so the default ceiling is one per rank
    max_num_seqs = default_seqs * dp_attention if max_num_seqs is None else max_num_seqs
    if max_num_seqs < 1:
        raise CapsimUserError(f"max_num_seqs must be at least 1, got {max_num_seqs}")
    check_attention_split(model, tp, dp_attention)
    check_pipeline(model, pp)
    attention_tp = tp // dp_attention
    limit = model.max_position_embeddings
    if max_model_len is not None and limit and max_model_len > limit:
        raise CapsimUserError(
            f"max_model_len {max_model_len} is above {model.name}'s maximum context of "
            f"{limit} tokens",
            hint="vLLM rejects it too; use a value up to max_position_embeddings",
        )
    if max_model_len is not None and max_model_len < 1:
        raise CapsimUserError(f"max_model_len must be at least 1, got {max_model_len}")
    batched = default_batched if max_num_batched_tokens is None else max_num_batched_tokens
    if batched < 1:
        raise CapsimUserError(f"max_num_batched_tokens must be at least 1, got {batched}")

    memory = gpu.memory_bytes
    budget = memory * gpu_memory_utilization
    # each rank's GPUs hold its whole attention, split over attention_tp
    include_mtp = drafter is not None and drafter.method == "mtp"
    parts = weight_bytes(
        model,
        fmt,
        tp,
        include_mtp=include_mtp,
        attention_tp=attention_tp,
        dense_tp=attention_tp if dense_in_ranks else None,
    )
    parts["drafter"] = drafter_weight_bytes(drafter, model, fmt, tp)
    parts = stage_weight_parts(parts, model, pp)
    if cpu_moe_layers:
        if gpu.unified_memory:
            raise CapsimUserError(
                f"{gpu.name} shares one memory between its CPU and GPU "
                f"({gpu.memory_type or 'unified'}), so --n-cpu-moe keeps no experts anywhere "
                "else: they stay in the same memory, read by the slower CPU",
                hint=f"leave --n-cpu-moe out; the model has to fit the {gpu.memory_gb:g} GB "
                "the two share",
            )
        breakdown = parameter_breakdown(model)
        if not breakdown.moe_layers or not breakdown.routed_experts:
            raise CapsimUserError(
                f"{model.name} has no routed experts to keep in system RAM (--n-cpu-moe)"
            )
        if cpu_moe_layers > breakdown.moe_layers:  # taken, as llama.cpp takes it
            from capsim.notices import notice

            notice(
                f"--n-cpu-moe {cpu_moe_layers:,} is more than {model.name}'s "
                f"{breakdown.moe_layers} MoE layers: the routed experts of all of them are "
                f"kept in system RAM (llama.cpp's --cpu-moe; up to "
                f"{breakdown.moe_layers - 1} keeps some on the GPU)"
            )
        share = min(cpu_moe_layers, breakdown.moe_layers) / breakdown.moe_layers
        routed = breakdown.routed_experts * _format_bits(fmt, "experts") / 8 / tp
        parts["experts"] -= share * routed
        offloaded = share * routed
    else:
        offloaded = 0.0
    weights = sum(parts.values())
    weights_in_host = 0.0
    if cpu_offload_gb:
        if gpu.unified_memory:
            raise CapsimUserError(
                f"{gpu.name} shares one memory between its CPU and GPU "
                f"({gpu.memory_type or 'unified'}), so --cpu-offload-gb moves no weights "
                "out of it",
                hint=f"leave --cpu-offload-gb out; the model has to fit the "
                f"{gpu.memory_gb:g} GB the two share",
            )
        weights_in_host = min(cpu_offload_gb * GIB, weights)
        weights -= weights_in_host
    # a rank samples its own sequences: the logits a GPU holds are one rank's
    rank_seqs = max(1, max_num_seqs // dp_attention)
    activations = activation_peak_bytes(model, tp, batched, rank_seqs, reserve)
    runtime = reserve.cuda_context_bytes + (reserve.nccl_bytes if tp > 1 else 0.0)
    runtime += 0.0 if enforce_eager else reserve.cuda_graph_bytes
    kv_budget = budget - weights - activations - runtime

    window_pool = sliding_window_pool
    if window_pool is not None and not (
        window_pool.applies_to(model.architecture) and model.count_layers("sliding_attention")
    ):
        window_pool = None
    if window_pool is not None:
        layout = window_pool_layout(
            kv_layout(model, kv_dtype, attention_tp, window_pool.shared_kv_layers_allocated),
            window_pool.full_tokens_ratio,
        )
    else:
        layout = kv_layout(model, kv_dtype, attention_tp)
    extra = drafter_kv_bytes_per_token(drafter, model, kv_dtype, attention_tp)
    if extra:  # the drafter's layers take pages of the same pool for every token
        layout = KVLayout(
            layout.full_bytes_per_token + extra,
            layout.sliding_bytes_per_token,
            layout.sliding_window,
            layout.state_bytes_per_sequence,
            {**layout.per_layer_type, "drafter": extra},
        )
    layout = stage_layout(layout, model, pp)
    shown = layout  # the layers' own figures, for the report
    if window_pool is None and sliding_window_pages:
        layout = window_pages_layout(layout)
    model_limit = model.max_position_embeddings or 10**9
    per_token = layout.bytes_per_token
    state = layout.state_bytes_per_sequence
    split = state > 0 and state_layout == "split"
    state_pool = 0.0
    state_cap = None
    state_blocks = 0
    if split:
        if state_share is None or not 0 < state_share < 1:
            raise ValueError(f"a split state pool needs 0 < state_share < 1, got {state_share}")
        state_pool = max(kv_budget, 0) * state_share
        state_cap = int(state_pool // (state * max(state_slots_per_sequence, 1))) * dp_attention
        kv_pool = max(kv_budget, 0) - state_pool
        # the attention pool alone holds a sequence's tokens; its state has a slot apart
        token_layout = KVLayout(
            layout.full_bytes_per_token,
            layout.sliding_bytes_per_token,
            layout.sliding_window,
            0.0,
            layout.per_layer_type,
        )
        max_num_seqs = max(min(max_num_seqs, state_cap), 1)
    else:
        kv_pool = kv_budget
        token_layout = layout
        if state and per_token:
            # each running sequence's state takes whole pages of the shared pool
            state_blocks = math.ceil(state / (BLOCK_SIZE_TOKENS * per_token))
    capacity_tokens = int(max(kv_pool, 0) // per_token) if per_token else 10**12
    capacity_tokens -= capacity_tokens % BLOCK_SIZE_TOKENS
    capacity_tokens *= dp_attention  # each attention rank has a pool of its own

    # The longest single sequence the KV pool can hold.
    longest = _longest_sequence(token_layout, kv_pool, model_limit)
    fits = True
    reason = "fits"
    if weights + runtime > budget:
        fits = False
        drafted = parts["drafter"]
        of_which = f", the speculative drafter's {drafted / GB:.1f} GB among them" * bool(drafted)
        reason = (
            f"the weights alone need {weights / GB:.1f} GB ({weights / GIB:.1f} GiB) per GPU"
            f"{of_which}; "
            f"the GPU has {gpu.serving_memory_gb:g} GiB ({memory / GB:.1f} GB), of which "
            f"{budget / GIB:.1f} GiB is usable at gpu_memory_utilization "
            f"{gpu_memory_utilization:g}"
        )
    elif kv_budget <= 0 or longest < BLOCK_SIZE_TOKENS:
        fits = False
        reason = (
            f"weights ({weights / GIB:.1f} GiB) plus activations and runtime reserve "
            f"({(activations + runtime) / GIB:.1f} GiB) leave no room for a KV cache in "
            f"{budget / GIB:.1f} GiB"
        )
    elif split and not state_cap:
        fits = False
        reason = (
            f"the recurrent-state pool ({state_pool / GIB:.2f} GiB) holds no running request: "
            f"each needs {state_slots_per_sequence} slots of {state / 2**20:.1f} MiB"
        )
    resolved_len = max_model_len if max_model_len is not None else longest
    if fits and max_model_len is not None and max_model_len > longest:
        fits = False
        reason = (
            f"max_model_len {max_model_len} needs "
            f"{layout.sequence_bytes(max_model_len) / GIB:.2f} GiB of KV cache for one "
            f"sequence but only {max(kv_budget, 0) / GIB:.2f} GiB is left (at most {longest} "
            "tokens fit)"
        )
    if context_tokens is not None:
        ctx = context_tokens
    elif max_model_len is not None:
        ctx = max_model_len
    else:
        ctx = max(min(resolved_len, DEFAULT_CONTEXT_TOKENS), 1)
    seq_bytes = token_layout.sequence_bytes(ctx)
    max_sequences = int(max(kv_pool, 0) // seq_bytes) * dp_attention if seq_bytes else 10**9
    if state_cap is not None:
        max_sequences = min(max_sequences, state_cap)
    return MemoryFit(
        gpu=gpu.name,
        model=model.name,
        quant=fmt.name,
        kv_dtype=kv_dtype,
        tp=tp,
        gpu_memory_utilization=gpu_memory_utilization,
        memory_bytes=memory,
        budget_bytes=budget,
        weight_bytes=weights,
        weight_breakdown=parts,
        activation_bytes=activations,
        runtime_reserve_bytes=runtime,
        kv_budget_bytes=kv_budget,
        kv_bytes_per_token=per_token,
        kv_full_bytes_per_token=shown.full_bytes_per_token,
        kv_sliding_bytes_per_token=shown.sliding_bytes_per_token,
        sliding_window=shown.sliding_window,
        state_bytes_per_sequence=shown.state_bytes_per_sequence,
        window_bytes_per_sequence=layout.state_bytes_per_sequence - shown.state_bytes_per_sequence,
        state_layout="split" if split else "shared",
        state_pool_bytes=state_pool,
        state_blocks_per_sequence=state_blocks,
        state_sequence_cap=state_cap,
        state_slots_per_sequence=state_slots_per_sequence if split else 1,
        kv_per_layer_type=layout.per_layer_type,
        kv_capacity_tokens=max(capacity_tokens, 0),
        max_model_len=int(resolved_len),
        max_model_len_limit=int(min(longest, model_limit)),
        context_tokens=int(ctx),
        max_sequences=max_sequences,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=batched,
        fits=fits,
        reason=reason,
        experts_in_system_ram_bytes=offloaded,
        pp=pp,
        weights_in_system_ram_bytes=weights_in_host,
        sliding_pool_ratio=window_pool.full_tokens_ratio if window_pool is not None else None,
        dp_attention=dp_attention,
    )


def _longest_sequence(layout: KVLayout, kv_budget: float, model_limit: int) -> int:
    """Longest sequence (tokens, a multiple of the block size) one KV pool holds."""
    if kv_budget <= 0:
        return 0
    lo, hi = 0, model_limit
    if layout.sequence_bytes(hi) <= kv_budget:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if layout.sequence_bytes(mid) <= kv_budget:
            lo = mid
        else:
            hi = mid
    return lo - lo % BLOCK_SIZE_TOKENS


TP_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)


def smallest_fitting_tp(gpu: GPU, model: Model, fmt: QuantFormat, **kwargs) -> int | None:
    """Smallest tensor-parallel size (a divisor of the heads, up to 64) at which it fits."""
    for tp in TP_CANDIDATES:
        try:
            if memory_fit(gpu, model, fmt, tp=tp, **kwargs).fits:
                return tp
        except CapsimUserError:
            continue
    return None


def formats_that_fit(
    gpu: GPU, model: Model, formats: list[QuantFormat], tp: int, **kwargs
) -> list[str]:
    """The names of ``formats`` in which ``model`` fits a TP group of ``gpu``, widest
    first (a format the model cannot be served in is skipped)."""
    fitting = []
    for fmt in sorted(formats, key=lambda f: -f.bits_per_weight):
        try:
            if memory_fit(gpu, model, fmt, tp=tp, **kwargs).fits:
                fitting.append(fmt.name)
        except CapsimUserError:
            continue
    return fitting


def fit_hint(
    here: MemoryFit,
    gpu: GPU,
    model: Model,
    fmt: QuantFormat,
    formats: list[QuantFormat],
    tp: int,
    **kwargs,
) -> str:
    """What would make ``here`` (the fit of ``fmt`` at ``tp``, which failed) fit: fewer
    batched tokens when their activations alone fill the memory, more GPUs, or a smaller
    weight format."""
    hints = []
    if here.weight_bytes < here.budget_bytes and here.activation_bytes > 0.5 * here.budget_bytes:
        # a profiling pass of --max-num-batched-tokens 2**31 tokens needs 180,000 GiB: no
        # format or TP size helps, and the hint said none fits (issue 47's fuzzing)
        tokens = kwargs.get("max_num_batched_tokens")
        step = f"{tokens:,}-token step" if tokens else "step of the default batched tokens"
        return (
            f"the activations of a {step} ({here.activation_bytes / 2**30:,.1f} GiB) leave "
            "no room for the KV cache: lower --max-num-batched-tokens"
        )
    need_tp = smallest_fitting_tp(gpu, model, fmt, **kwargs)
    if need_tp and need_tp > tp:
        hints.append(f"in {fmt.name} it fits with --tp {need_tp} ({need_tp}x {gpu.name})")
    fitting = formats_that_fit(gpu, model, [f for f in formats if f.name != fmt.name], tp, **kwargs)
    if fitting:
        hints.append(f"at TP={tp} these formats fit: {', '.join(fitting[:4])}")
    elif tp == 1:
        hints.append("no weight format fits on one GPU")
    if not hints:
        hints.append("try --kv-dtype fp8, a shorter --max-model-len or a larger GPU")
    return "; ".join(hints)


AUTO_FORMAT_ORDER = ("fp8", "awq-int4")
"""Formats ``--quant auto`` falls back to, in order, when the release format does not fit:
FP8 where the GPU runs it natively, then AWQ 4-bit (the W4A16 format vLLM serves on every
NVIDIA GPU since Ampere)."""


def release_format(formats: dict[str, QuantFormat], dtype: str) -> QuantFormat | None:
    """The model's release format (``dtype``) among ``formats`` (those an engine loads),
    or its GGUF counterpart where only that is there (mxfp4: gguf-mxfp4); None: neither."""
    return formats.get(dtype) or formats.get(f"gguf-{dtype}")


def auto_format(
    gpu: GPU,
    model: Model,
    formats: dict[str, QuantFormat],
    tp: int = 1,
    order: tuple[str, ...] | list[str] = AUTO_FORMAT_ORDER,
    **kwargs,
) -> tuple[QuantFormat, str]:
    """Pick a weight format: the model's release format if it fits, else the first of
    ``order`` (AUTO_FORMAT_ORDER, or the engine's) that fits (FP8 only where native).
    ``formats`` holds the formats the engine loads: a release format not among them is
    replaced by its GGUF counterpart where there is one (mxfp4: gguf-mxfp4). Returns
    (format, why)."""
    release = release_format(formats, model.dtype)
    candidates = [release] if release is not None else []
    for name in order:
        fmt = formats.get(name)
        if fmt is None or fmt in candidates:
            continue
        if fmt.compute_dtype not in gpu.native_formats and not fmt.weight_only:
            continue
        candidates.append(fmt)
    if not candidates:
        raise CapsimUserError(
            f"no weight format capsim knows for {model.name} is one this engine loads",
            hint="name one with --quant (capsim quants), or another --engine",
        )
    fits = [(fmt, memory_fit(gpu, model, fmt, tp=tp, **kwargs)) for fmt in candidates]
    for fmt, fit in fits:
        if fit.fits:
            if fmt is release and fmt.name == model.dtype:
                return fmt, f"{fmt.name}, the release format"
            if fmt is release:
                return fmt, f"{fmt.name}, the release format ({model.dtype}) as the engine loads it"
            shown = release.name if release is not None else model.dtype
            return fmt, f"{fmt.name}, because the release format ({shown}) does not fit"
    # Nothing fits: report against the first format whose weights fit, so the error names
    # the constraint that binds (KV cache, max_model_len) rather than the weights.
    for fmt, fit in fits:
        if fit.weight_bytes + fit.runtime_reserve_bytes <= fit.budget_bytes:
            return fmt, f"{fmt.name} (its weights fit, but the deployment does not)"
    first = candidates[0]
    return first, f"{first.name}, the release format (nothing smaller fits either)"


def require_fit(fit: MemoryFit, hint: str = "") -> MemoryFit:
    """Raise DoesNotFitError with the reason if the deployment does not fit."""
    if not fit.fits:
        raise DoesNotFitError(
            f"{fit.model} ({fit.quant}) does not fit on {fit.gpu} with TP={fit.tp}: {fit.reason}",
            hint=hint
            or "try a smaller weight format (--quant awq-int4), more GPUs (--tp), "
            "--kv-dtype fp8 or a shorter --max-model-len",
        )
    return fit
