"""Pydantic schemas of the catalog: GPUs, models, weight formats and serving engines.

Units are part of every field name or description. Every entry carries ``sources``: where
its figures came from. A figure that no source gives is ``None`` (null in YAML), never a
guess.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "fp4")
"""Tensor-core data types the catalog knows throughput figures for."""

LayerType = Literal["full_attention", "sliding_attention", "linear_attention", "mamba", "none"]
"""A layer's token mixer: softmax attention over all context or a window (also used for
Llama 4's chunked attention, whose cache never holds more than one chunk), Gated DeltaNet
linear attention, a Mamba-2 SSM, or none (an FFN-only layer of a hybrid stack)."""

FFNType = Literal["dense", "moe", "none"]
"""A layer's feed-forward block: a dense FFN, routed experts, or none (a mixer-only layer)."""


class Strict(BaseModel):
    """Base: unknown fields are errors, so a typo in a YAML file is caught."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Source(Strict):
    """Where a figure came from."""

    title: str = Field(description="Document name, e.g. 'NVIDIA Ampere GA102 GPU Architecture'")
    url: str | None = Field(default=None, description="Where to read it")
    quote: str | None = Field(default=None, description="The exact text a figure was taken from")
    note: str | None = Field(default=None, description="How the figure was read or derived")


class Price(Strict):
    """A purchase price of one GPU in US dollars on a date."""

    usd: float = Field(gt=0, description="Price of one GPU (or one GPU's share of a system), USD")
    date: dt.date = Field(description="When that price applied")
    kind: Literal["launch-msrp", "street", "used", "list", "estimate"] = Field(
        "launch-msrp",
        description="launch-msrp: the vendor's launch price; list: a reseller's or vendor's "
        "current list price; street: typical retail; used: second-hand; estimate: an analyst's "
        "or press figure where the vendor publishes none (say whose in the source)",
    )
    source: Source


class CloudPrice(Strict):
    """What one GPU costs to rent per hour from a named provider."""

    usd_per_gpu_hour: float = Field(gt=0, description="USD per GPU per hour, on demand")
    provider: str = Field(description="Who rents it at that price, e.g. 'Lambda', 'AWS'")
    date: dt.date
    source: Source


class PowerLimitRange(Strict):
    """The board power limits a user can set (nvidia-smi -pl, rocm-smi), W."""

    min_w: float | None = Field(default=None, gt=0, description="Lowest settable limit, W")
    max_w: float | None = Field(default=None, gt=0, description="Highest settable limit, W")
    source: Source


class Interconnect(Strict):
    """One way GPUs of this kind talk to each other."""

    kind: Literal["nvlink", "pcie", "infinity-fabric", "xe-link", "nvlink-c2c", "none"]
    topology: Literal["switch", "bridge", "mesh", "host"] | None = Field(
        default=None,
        description="How a group is joined: 'switch' (NVSwitch: every GPU at full bandwidth to "
        "all, in-switch reduction where supported), 'bridge' (a point-to-point bridge between "
        "2-4 cards), 'mesh' (a direct link to each peer, e.g. MI300X's xGMI), 'host' (through "
        "the CPU's PCIe root complex or a PCIe switch)",
    )
    generation: float | None = Field(default=None, description="NVLink or PCIe generation")
    lanes: int | None = Field(default=None, ge=1, description="PCIe lanes")
    bandwidth_gb_s_per_direction: float | None = Field(
        default=None,
        gt=0,
        description="Peak GPU-to-GPU bandwidth one way, GB/s (1e9 bytes/s)",
    )
    latency_us: float | None = Field(
        default=None, ge=0, description="One-hop latency in microseconds, where a source gives it"
    )
    max_gpus: int | None = Field(
        default=None,
        ge=2,
        description="Most GPUs this link joins in one group (a consumer NVLink bridge joins 2; "
        "an NVSwitch baseboard 8); None for PCIe, which any number share through the host",
    )
    note: str | None = None


class TensorThroughput(Strict):
    """Dense (no structured sparsity) tensor-core peak throughput, TFLOPS or TOPS.

    For fp16/bf16 the figure is with FP32 accumulation where the vendor distinguishes,
    since that is what inference GEMMs use. ``None`` means no native support or unknown.
    """

    bf16: float | None = Field(default=None, gt=0)
    fp16: float | None = Field(default=None, gt=0)
    fp8: float | None = Field(default=None, gt=0)
    int8: float | None = Field(default=None, gt=0)
    int4: float | None = Field(default=None, gt=0)
    fp4: float | None = Field(default=None, gt=0)


class GPU(Strict):
    """One accelerator model (a GPU or an APU's integrated GPU)."""

    name: str = Field(description="catalog key, lower-case, e.g. 'rtx3090'")
    display_name: str
    aliases: list[str] = Field(default_factory=list)
    vendor: Literal["nvidia", "amd", "intel", "apple", "generic"]
    architecture: str = Field(description="e.g. 'ampere', 'hopper', 'cdna3', 'xe2'")
    hardware_class: str = Field(
        description="Group whose default efficiency parameters apply, e.g. 'consumer-ampere'"
    )
    memory_gb: float = Field(gt=0, description="Device memory as marketed, GB")
    memory_type: str | None = None
    usable_memory_gb: float | None = Field(
        default=None,
        gt=0,
        description="Memory the GPU can use for serving where less than memory_gb "
        "(e.g. an APU's share of system RAM), GB",
    )
    memory_bandwidth_gb_s: float = Field(gt=0, description="Peak DRAM bandwidth, GB/s")
    l2_cache_mb: float | None = Field(
        default=None, gt=0, description="L2 or last-level on-chip cache, MB"
    )
    tensor_tflops: TensorThroughput = Field(description="Dense peak tensor throughput")
    native_formats: list[str] = Field(
        description="Data types the tensor cores execute natively (subset of bf16, fp16, fp8, "
        "int8, int4, fp4)"
    )
    interconnects: list[Interconnect] = Field(default_factory=list)
    tdp_w: float | None = Field(default=None, gt=0, description="Board power (TDP/TBP), W")
    power_limit_w: PowerLimitRange | None = Field(
        default=None, description="Settable power-limit range, where a source gives it"
    )
    price: Price | None = None
    cloud_price: CloudPrice | None = None
    listed: bool = Field(
        default=True, description="Shown in default listings (False: test or host entries)"
    )
    sources: list[Source] = Field(min_length=1)
    notes: str | None = None
    efficiency: dict[str, float] = Field(
        default_factory=dict,
        description="Efficiency parameters measured on this GPU itself where they differ "
        "from its hardware class's (hardware_db/efficiency/CLASS.yaml), laid over them; "
        "each with its measurement among the sources",
    )

    @field_validator("native_formats")
    @classmethod
    def _known_formats(cls, v: list[str]) -> list[str]:
        unknown = sorted(set(v) - set(DTYPES))
        if unknown:
            raise ValueError(f"unknown native format(s) {unknown}; known: {list(DTYPES)}")
        return v

    @property
    def serving_memory_gb(self) -> float:
        """Memory available to a serving engine, GB (usable_memory_gb if set)."""
        return self.usable_memory_gb if self.usable_memory_gb is not None else self.memory_gb

    @property
    def memory_bytes(self) -> float:
        """Serving memory in bytes.

        Convention: vendors' 'GB' for VRAM/HBM are binary (a '24 GB' RTX 3090 reports
        24,576 MiB), so capacity in bytes = memory_gb x 2**30.
        """
        return self.serving_memory_gb * 2**30

    def interconnect(self, kind: str) -> Interconnect | None:
        """The first interconnect of a kind ('nvlink', 'pcie', ...), or None."""
        for ic in self.interconnects:
            if ic.kind == kind:
                return ic
        return None


class MoESpec(Strict):
    """Mixture-of-experts dimensions, as in the model's config.json."""

    num_experts: int = Field(ge=1, description="Routed experts per MoE layer")
    experts_per_token: int = Field(ge=1, description="Routed experts each token uses (top-k)")
    moe_intermediate_size: int = Field(ge=1, description="FFN width of one routed expert")
    num_shared_experts: int = Field(default=0, ge=0)
    shared_expert_intermediate_size: int | None = Field(
        default=None, description="FFN width of the shared expert(s); default moe width"
    )
    first_dense_layers: int = Field(
        default=0, ge=0, description="Leading layers with a dense FFN (first_k_dense_replace)"
    )
    expert_bias: bool = Field(default=False, description="Experts carry biases (gpt-oss)")

    @model_validator(mode="after")
    def _k_le_e(self) -> MoESpec:
        if self.experts_per_token > self.num_experts:
            raise ValueError("experts_per_token cannot exceed num_experts")
        return self

    @property
    def shared_width(self) -> int:
        return self.shared_expert_intermediate_size or self.moe_intermediate_size


class LinearAttentionSpec(Strict):
    """Gated DeltaNet (linear attention) dimensions: a fixed-size recurrent state."""

    num_key_heads: int = Field(ge=1)
    num_value_heads: int = Field(ge=1)
    key_head_dim: int = Field(ge=1)
    value_head_dim: int = Field(ge=1)
    conv_kernel_dim: int = Field(ge=1)
    state_dtype_bytes: int = Field(
        default=4, description="Bytes per element of the recurrent state (mamba_ssm_dtype)"
    )


class MambaSpec(Strict):
    """Mamba-2 SSM mixer dimensions (Nemotron-H and similar hybrids)."""

    num_heads: int = Field(ge=1, description="mamba_num_heads")
    head_dim: int = Field(ge=1, description="mamba_head_dim")
    state_size: int = Field(ge=1, description="ssm_state_size (d_state)")
    n_groups: int = Field(ge=1, description="n_groups (B/C projection groups)")
    conv_kernel: int = Field(ge=1, description="conv_kernel")
    state_dtype_bytes: int = Field(
        default=2, description="Bytes per element of the SSM state as the engine keeps it"
    )

    @property
    def inner_size(self) -> int:
        """d_inner = heads x head dim."""
        return self.num_heads * self.head_dim


class SparseAttentionSpec(Strict):
    """DeepSeek Sparse Attention (V3.2): a lightning indexer picks the top-k cached tokens
    each query attends to."""

    index_n_heads: int = Field(ge=1)
    index_head_dim: int = Field(ge=1)
    index_topk: int = Field(ge=1, description="Cached tokens each query attends to")


class VisionSpec(Strict):
    """A vision-language model's image tower: capsim counts its weights in memory and
    simulates text only."""

    params_b: float = Field(gt=0, description="Vision encoder + projector parameters, billions")
    source: Source


class Checkpoint(Strict):
    """A published checkpoint of this model in a weight format (e.g. an official FP8 or a
    community AWQ repo), so its Hugging Face id resolves to the model and format."""

    hf_id: str
    quant: str = Field(description="Catalog weight format of the checkpoint")
    source: Source | None = None


class MLASpec(Strict):
    """Multi-head latent attention (DeepSeek) dimensions."""

    q_lora_rank: int | None = Field(default=None, ge=1)
    kv_lora_rank: int = Field(ge=1)
    qk_nope_head_dim: int = Field(ge=1)
    qk_rope_head_dim: int = Field(ge=1)
    v_head_dim: int = Field(ge=1)


class PublishedParams(Strict):
    """Parameter counts a model card states, to check the computed ones against."""

    total_b: float = Field(gt=0, description="Total parameters, billions")
    active_b: float | None = Field(default=None, gt=0, description="Active parameters, billions")
    active_convention: Literal["all", "excludes_embedding", "excludes_embedding_and_lm_head"] = (
        Field(
            default="all",
            description="What the card's active count leaves out: nothing (DeepSeek, Qwen), the "
            "input embedding table (OpenAI gpt-oss), or both embedding tables (GLM)",
        )
    )
    includes_mtp: bool = Field(default=False, description="Whether the total includes MTP layers")
    source: Source


class Model(Strict):
    """One LLM's architecture, in the terms of its Hugging Face config.json."""

    name: str
    display_name: str
    aliases: list[str] = Field(default_factory=list)
    hf_id: str
    architecture: str = Field(description="config.json model_type, e.g. 'qwen3_moe'")
    num_layers: int = Field(ge=1, description="num_hidden_layers")
    hidden_size: int = Field(ge=1)
    intermediate_size: int | None = Field(
        default=None, description="Dense FFN width (for MoE: of the leading dense layers)"
    )
    num_attention_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1, description="num_key_value_heads")
    head_dim: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    tie_word_embeddings: bool = False
    attention_bias: bool = Field(default=False, description="q/k/v projections carry biases")
    attn_output_gate: bool = Field(
        default=False, description="q_proj also produces an output gate (doubles its width)"
    )
    layer_pattern: list[LayerType] = Field(
        default_factory=lambda: ["full_attention"],
        description="Attention type of each layer, repeated cyclically over num_layers",
    )
    sliding_window: int | None = Field(default=None, ge=1, description="Tokens, for sliding layers")
    linear_attention: LinearAttentionSpec | None = None
    mla: MLASpec | None = None
    mamba: MambaSpec | None = None
    sparse_attention: SparseAttentionSpec | None = None
    moe: MoESpec | None = None
    mlp_gated: bool = Field(
        default=True,
        description="FFNs have a gate projection (SwiGLU/GeGLU: 3 matrices); False for "
        "2-matrix FFNs (e.g. Nemotron-H's squared ReLU)",
    )
    ffn_pattern: list[FFNType] | None = Field(
        default=None,
        description="FFN kind of each layer, repeated cyclically over num_layers (Llama 4 "
        "Maverick: [dense, moe]; Nemotron-H: none on mixer layers); default: MoE on every "
        "layer after moe.first_dense_layers, else dense",
    )
    vision: VisionSpec | None = None
    checkpoints: list[Checkpoint] = Field(default_factory=list)
    listed: bool = Field(default=True, description="Shown in default listings (False: test models)")
    mtp_layers: int = Field(default=0, ge=0, description="Multi-token-prediction layers")
    max_position_embeddings: int | None = None
    dtype: str = Field(default="bf16", description="Native weight dtype of the release")
    published: PublishedParams | None = None
    sources: list[Source] = Field(min_length=1)
    notes: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Model:
        types = set(self.layer_pattern)
        if "sliding_attention" in types and self.sliding_window is None:
            raise ValueError("layer_pattern has sliding_attention but sliding_window is not set")
        if "linear_attention" in types and self.linear_attention is None:
            raise ValueError("layer_pattern has linear_attention but linear_attention is not set")
        if "mamba" in types and self.mamba is None:
            raise ValueError("layer_pattern has mamba but mamba is not set")
        ffn_kinds = set(self.ffn_pattern or [])
        if "moe" in ffn_kinds and self.moe is None:
            raise ValueError("ffn_pattern has moe but moe is not set")
        if "dense" in ffn_kinds and self.intermediate_size is None:
            raise ValueError("ffn_pattern has dense but intermediate_size is not set")
        if self.moe is None and self.intermediate_size is None:
            raise ValueError("a dense model needs intermediate_size")
        if self.moe is not None and self.moe.first_dense_layers and not self.intermediate_size:
            raise ValueError("moe.first_dense_layers needs intermediate_size")
        return self

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def layer_types(self) -> list[LayerType]:
        """The attention type of each of the num_layers layers."""
        p = self.layer_pattern
        return [p[i % len(p)] for i in range(self.num_layers)]

    def count_layers(self, kind: LayerType) -> int:
        return sum(1 for t in self.layer_types if t == kind)

    def ffn_kind(self, layer: int) -> FFNType:
        """The feed-forward block of one layer (0-based)."""
        if self.ffn_pattern:
            return self.ffn_pattern[layer % len(self.ffn_pattern)]
        if self.moe is None or layer < self.moe.first_dense_layers:
            return "dense"
        return "moe"


class QuantFormat(Strict):
    """A weight format: how many bits a quantised parameter costs and what stays unquantised."""

    name: str
    display_name: str
    aliases: list[str] = Field(default_factory=list)
    weight_bits: float = Field(gt=0, description="Bits of the stored value itself")
    group_size: int | None = Field(default=None, ge=1, description="Weights sharing one scale")
    scale_bits: float = Field(default=0, ge=0, description="Bits of each group's scale")
    zero_bits: float = Field(default=0, ge=0, description="Bits of each group's zero point")
    bits_per_weight_override: float | None = Field(
        default=None,
        gt=0,
        description="Effective bits/weight where the format mixes block types (GGUF k-quants)",
    )
    compute_dtype: Literal["bf16", "fp16", "fp8", "int8", "fp4"] = Field(
        description="Tensor-core type the GEMM runs in when the GPU supports it natively"
    )
    weight_only: bool = Field(
        description="Activations stay 16-bit; weights are dequantised in the kernel"
    )
    quantized_tensors: list[Literal["attention", "linear_attention", "mlp", "experts"]] = Field(
        description="Weight groups this format quantises"
    )
    unquantized_tensors: list[str] = Field(
        default_factory=lambda: ["embeddings", "lm_head", "router", "norms"],
        description="Tensors that usually stay in 16-bit",
    )
    unquantized_bits: float = Field(default=16, description="Bits of the tensors left unquantised")
    embedding_bits: float | None = Field(
        default=None, gt=0, description="Bits/weight of the embedding table if not unquantized_bits"
    )
    lm_head_bits: float | None = Field(
        default=None, gt=0, description="Bits/weight of the output head if not unquantized_bits"
    )
    repo_suffixes: list[str] = Field(
        default_factory=list,
        description="Endings of Hugging Face repo ids for checkpoints in this format "
        "('FP8-Dynamic', 'AWQ-4bit', 'Q4_K_M'), so an id names its format",
    )
    sources: list[Source] = Field(min_length=1)
    notes: str | None = None

    @property
    def bits_per_weight(self) -> float:
        """Effective storage bits per quantised weight, scales and zeros included."""
        if self.bits_per_weight_override is not None:
            return self.bits_per_weight_override
        overhead = 0.0
        if self.group_size:
            overhead = (self.scale_bits + self.zero_bits) / self.group_size
        return self.weight_bits + overhead


class EfficiencyProfile(Strict):
    """Default efficiency parameters for one hardware class (hardware_db/efficiency/).

    ``params`` overrides the generic defaults of capsim.physics.efficiency.EfficiencyParams
    for GPUs whose ``hardware_class`` equals ``name``. These are engineering priors, not
    measurements; calibration profiles replace them.
    """

    name: str = Field(description="The hardware_class these defaults apply to")
    aliases: list[str] = Field(default_factory=list)
    params: dict[str, float] = Field(default_factory=dict)
    fit: list[str] = Field(
        default_factory=list,
        description="Parameters 'capsim calibrate' fits for this class by default "
        "(empty: the generic set)",
    )
    rationale: str = Field(description="Why these values: what they were read or derived from")
    sources: list[Source] = Field(min_length=1)


class AdmissionReserve(Strict):
    """Output tokens an engine reserves in its KV pool before admitting a request (SGLang's
    PrefillAdder): every running request holds min(tokens still to generate, clip) x the
    current ratio, a request being admitted its whole min(max_new_tokens, clip); the ratio
    starts at ``init_ratio``, falls by (init - min) / ``decay_steps`` each decode batch to
    ``init_ratio x min_ratio_factor``, and after a retraction (preemption) restarts from
    (generated + ``retract_decode_steps`` x running) / (sum of max_new_tokens + 1), at
    most 1."""

    init_ratio: float = Field(ge=0, le=1)
    min_ratio_factor: float = Field(gt=0, le=1)
    decay_steps: int = Field(ge=1)
    clip_tokens: int = Field(ge=1, description="CLIP_MAX_NEW_TOKENS: cap on one request's reserve")
    retract_decode_steps: int = Field(ge=0)


class StatePool(Strict):
    """Where a hybrid model's fixed-size recurrent state (Gated DeltaNet, Mamba) lives.

    ``shared``: each running sequence's state takes pages of the one KV pool (vLLM's hybrid
    KV-cache manager), so state and attention KV compete for the same bytes. ``split``: the
    engine carves a separate pool of state slots out of the memory left after the weights
    (SGLang's mamba pool: a share ``r / (1 + r)`` with ``r`` its mamba_full_memory_ratio)
    and caps running requests at slots / ``slots_per_sequence`` (with prefix caching the
    engine keeps checkpoint slots beside each request's working one, more of them while its
    overlap scheduler runs a step ahead)."""

    layout: Literal["shared", "split"] = "shared"
    state_share: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="split: share of the memory left after weights and reserves that goes "
        "to the state pool (the rest holds the attention KV)",
    )
    slots_per_sequence: int = Field(
        1,
        ge=1,
        description="split: state slots one running request holds while prefix caching is "
        "on (1 without it), with the engine's overlap (async) scheduler on, its default",
    )
    slots_per_sequence_without_overlap: int | None = Field(
        None,
        ge=1,
        description="split: the same with the overlap scheduler off (None: as with it)",
    )

    @model_validator(mode="after")
    def _share_for_split(self) -> StatePool:
        if self.layout == "split" and self.state_share is None:
            raise ValueError("a split state pool needs state_share")
        return self


class BatchDefaults(Strict):
    """One row of a serving engine's default scheduler limits: it applies to GPUs of at
    least ``min_memory_gb`` that ``except_gpus`` does not name (an engine's rows are read
    in order and the first that applies wins)."""

    min_memory_gb: float = Field(0, ge=0, description="Smallest GPU memory (GB) of the row")
    except_gpus: list[str] = Field(
        default_factory=list, description="GPU catalog names (prefixes) the row skips"
    )
    max_num_batched_tokens: int = Field(ge=1, description="Token budget of one step")
    max_num_seqs: int = Field(ge=1, description="Most sequences scheduled in one step")
    cuda_graph_max_batch: int | None = Field(
        None,
        ge=0,
        description="Largest batch (sequences) the engine captures a CUDA graph for, where "
        "the engine sizes it by GPU (SGLang's cuda_graph_max_bs); None: the engine's rule",
    )
    cuda_graph_max_batch_tp4: int | None = Field(
        None, ge=0, description="The same at tensor-parallel size 4 or more, where it differs"
    )

    def applies_to(self, gpu_name: str, memory_gb: float) -> bool:
        return memory_gb >= self.min_memory_gb and not any(
            gpu_name.startswith(prefix) for prefix in self.except_gpus
        )


GraphCapture = Literal["vllm", "sglang", "single-token", "none"]
"""How an engine captures CUDA graphs: vLLM's capture sizes (up to 512 tokens, 1,024 on
datacenter Blackwell), SGLang's batch sizes (up to cuda_graph_max_bs sequences), a graph
for single-token steps only (llama.cpp), or none."""


class Engine(Strict):
    """A serving engine (hardware_db/engines/): how it batches, launches and overlaps work.

    ``params`` lays efficiency parameters over the hardware class's for every GPU this
    engine runs on; ``class_params`` lays more over those for one hardware class. Both are
    priors with sources, like the hardware-class files; calibration profiles replace them.
    """

    name: str = Field(description="Catalog key, e.g. 'vllm', 'llama.cpp'")
    display_name: str
    aliases: list[str] = Field(default_factory=list)
    batch_defaults: list[BatchDefaults] = Field(
        min_length=1, description="Default token budget and sequence limit, by GPU memory"
    )
    graph_capture: GraphCapture = Field(description="Which steps run in a CUDA graph")
    ubatch_tokens: int | None = Field(
        None,
        ge=1,
        description="Physical batch (tokens): a step of more tokens runs as several passes of "
        "at most this many, each reading the weights again (llama.cpp's n_ubatch); None = one",
    )
    mixes_prefill_and_decode: bool = Field(
        True,
        description="Whether a step carries prefill chunks and decodes together (vLLM's and "
        "llama.cpp's chunked prefill); False: prefill batches run apart (SGLang's default)",
    )
    async_scheduling: bool = Field(
        description="Whether the engine prepares step n+1 on the CPU while the GPU runs step "
        "n by default (async_host_overlap then applies)"
    )
    custom_allreduce: bool = Field(
        description="Whether tensor-parallel all-reduces can use peer-to-peer custom kernels"
    )
    memory_utilization: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Share of GPU memory the engine budgets for weights, activations and KV "
        "cache by default (vLLM's gpu_memory_utilization)",
    )
    state_pool: StatePool = Field(
        default_factory=StatePool,
        description="Where hybrid models' recurrent state lives (shared KV pool or a pool "
        "of its own)",
    )
    admission_reserve: AdmissionReserve | None = Field(
        None,
        description="Decode tokens reserved in the KV pool before admitting a request "
        "(SGLang's new_token_ratio); None: a request is admitted when its prompt fits (vLLM)",
    )
    params: dict[str, float] = Field(default_factory=dict)
    class_params: dict[str, dict[str, float]] = Field(default_factory=dict)
    rationale: str = Field(description="Why these values: what they were read or derived from")
    sources: list[Source] = Field(min_length=1)
    notes: str | None = None

    def batch_limits(self, gpu_name: str, memory_gb: float) -> BatchDefaults:
        """The first ``batch_defaults`` row that applies to this GPU (the last row when
        none does)."""
        for row in self.batch_defaults:
            if row.applies_to(gpu_name, memory_gb):
                return row
        return self.batch_defaults[-1]

    def efficiency_overrides(self, hardware_class: str) -> dict[str, float]:
        """Efficiency parameters this engine sets on a GPU of ``hardware_class``."""
        return {**self.params, **self.class_params.get(hardware_class, {})}
