"""Schemas of a model (hardware_db/models/: its architecture in config.json's terms) and of
a weight format (hardware_db/quant_formats/), each with its source."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, model_validator

from capsim.catalog.schemas import Source, Strict, catalog_key

LayerType = Literal["full_attention", "sliding_attention", "linear_attention", "mamba", "none"]
"""A layer's token mixer: softmax attention over all context or a window (also used for
Llama 4's chunked attention, whose cache never holds more than one chunk), Gated DeltaNet
linear attention, a Mamba-2 SSM, or none (an FFN-only layer of a hybrid stack)."""

FFNType = Literal["dense", "moe", "none"]
"""A layer's feed-forward block: a dense FFN, routed experts, or none (a mixer-only layer)."""

MAX_DIM = 10_000_000
"""The largest dimension (width, heads, experts, vocabulary, window) a model entry may
state: about 100 times today's largest, so an imported config with an absurd value is
refused rather than overflowing the arithmetic."""
MIN_CONTEXT_TOKENS = 16
"""The shortest context (max_position_embeddings, tokens) a model entry may state: one
KV-cache block of vLLM's (16 tokens). Below it no sequence fills a block, and a model of
8 tokens read as one that does not fit any GPU."""
MIN_BITS = 1
"""The narrowest bit width a weight format may state for a stored weight (BitNet's ternary
weights take 1.58 bits, GGUF's IQ1_S 1.56): 1e-300 made every model's weights weigh
nothing."""
MAX_LAYERS = 10_000
"""The most layers a model entry may have (the largest released models have under 200):
an imported config beyond it is refused rather than expanded layer by layer."""


class MoESpec(Strict):
    """Mixture-of-experts dimensions, as in the model's config.json."""

    num_experts: int = Field(ge=1, le=MAX_DIM, description="Routed experts per MoE layer")
    experts_per_token: int = Field(
        ge=1, le=MAX_DIM, description="Routed experts each token uses (top-k)"
    )
    moe_intermediate_size: int = Field(
        ge=1, le=MAX_DIM, description="FFN width of one routed expert"
    )
    num_shared_experts: int = Field(default=0, ge=0, le=MAX_DIM)
    shared_expert_intermediate_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_DIM,
        description="FFN width of the shared expert(s); default moe width",
    )
    first_dense_layers: int = Field(
        default=0,
        ge=0,
        le=MAX_LAYERS,
        description="Leading layers with a dense FFN (first_k_dense_replace)",
    )
    expert_bias: StrictBool = Field(default=False, description="Experts carry biases (gpt-oss)")
    latent_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_DIM,
        description="Latent MoE (Nemotron 3 Super, moe_latent_size): routed experts work on "
        "a latent of this width, projected down from and back up to the hidden size by two "
        "always-active projections per MoE layer",
    )

    @model_validator(mode="after")
    def _k_le_e(self) -> MoESpec:
        if self.experts_per_token > self.num_experts:
            raise ValueError("experts_per_token cannot exceed num_experts")
        return self

    @property
    def shared_width(self) -> int:
        return self.shared_expert_intermediate_size or self.moe_intermediate_size


class FullAttentionShape(Strict):
    """The full-attention layers' own shape where it differs from the other (sliding)
    layers' (Gemma 4: global_head_dim, num_global_key_value_heads, attention_k_eq_v)."""

    head_dim: int = Field(
        ge=1, le=MAX_DIM, description="Head dimension of the full-attention layers"
    )
    num_kv_heads: int = Field(ge=1, le=MAX_DIM, description="KV heads of the full-attention layers")
    k_eq_v: StrictBool = Field(
        default=False,
        description="Values are the keys (attention_k_eq_v): no v_proj on these layers",
    )


class PerLayerInputSpec(Strict):
    """Per-layer embeddings (Gemma 3n/4 E2B and E4B: hidden_size_per_layer_input): a second
    token-embedding table giving every layer a small input of its own, looked up per token
    (one row read), and the projections that mix it into each layer."""

    size: int = Field(ge=1, le=MAX_DIM, description="hidden_size_per_layer_input, per layer")
    vocab_size: int = Field(ge=1, le=MAX_DIM, description="vocab_size_per_layer_input")


class LinearAttentionSpec(Strict):
    """Gated DeltaNet (linear attention) dimensions: a fixed-size recurrent state."""

    num_key_heads: int = Field(ge=1, le=MAX_DIM)
    num_value_heads: int = Field(ge=1, le=MAX_DIM)
    key_head_dim: int = Field(ge=1, le=MAX_DIM)
    value_head_dim: int = Field(ge=1, le=MAX_DIM)
    conv_kernel_dim: int = Field(ge=1, le=MAX_DIM)
    state_dtype_bytes: int = Field(
        default=4, description="Bytes per element of the recurrent state (mamba_ssm_dtype)"
    )


class MambaSpec(Strict):
    """Mamba-2 SSM mixer dimensions (Nemotron-H and similar hybrids)."""

    num_heads: int = Field(ge=1, le=MAX_DIM, description="mamba_num_heads")
    head_dim: int = Field(ge=1, le=MAX_DIM, description="mamba_head_dim")
    state_size: int = Field(ge=1, le=MAX_DIM, description="ssm_state_size (d_state)")
    n_groups: int = Field(ge=1, le=MAX_DIM, description="n_groups (B/C projection groups)")
    conv_kernel: int = Field(ge=1, le=MAX_DIM, description="conv_kernel")
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

    index_n_heads: int = Field(ge=1, le=MAX_DIM)
    index_head_dim: int = Field(ge=1, le=MAX_DIM)
    index_topk: int = Field(ge=1, le=MAX_DIM, description="Cached tokens each query attends to")


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

    q_lora_rank: int | None = Field(default=None, ge=1, le=MAX_DIM)
    kv_lora_rank: int = Field(ge=1, le=MAX_DIM)
    qk_nope_head_dim: int = Field(ge=1, le=MAX_DIM)
    qk_rope_head_dim: int = Field(ge=1, le=MAX_DIM)
    v_head_dim: int = Field(ge=1, le=MAX_DIM)


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
    includes_mtp: StrictBool = Field(
        default=False, description="Whether the total includes MTP layers"
    )
    total_label_unit_b: float | None = Field(
        default=None,
        gt=0,
        description="Where the card states the total only as a rounded label ('1T'), the "
        "unit of its last digit in billions (1000 for 1T): the total is known only to half it",
    )
    active_label_unit_b: float | None = Field(
        default=None,
        gt=0,
        description="The same for an active count stated only as a label ('A17B': 1)",
    )
    includes_vision: StrictBool = Field(
        default=False,
        description="Whether the total (and the active count) includes the vision/audio "
        "encoders (vision.params_b); Gemma's cards count them",
    )
    source: Source


class Model(Strict):
    """One LLM's architecture, in the terms of its Hugging Face config.json."""

    name: str = catalog_key()
    display_name: str
    aliases: list[str] = Field(default_factory=list)
    hf_id: str
    architecture: str = Field(description="config.json model_type, e.g. 'qwen3_moe'")
    num_layers: int = Field(ge=1, le=MAX_LAYERS, description="num_hidden_layers")
    hidden_size: int = Field(ge=1, le=MAX_DIM)
    intermediate_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_DIM,
        description="Dense FFN width (for MoE: of the leading dense layers)",
    )
    num_attention_heads: int = Field(ge=1, le=MAX_DIM)
    num_kv_heads: int = Field(ge=1, le=MAX_DIM, description="num_key_value_heads")
    head_dim: int = Field(ge=1, le=MAX_DIM)
    vocab_size: int = Field(ge=1, le=MAX_DIM)
    tie_word_embeddings: StrictBool = False
    attention_bias: StrictBool = Field(default=False, description="q/k/v projections carry biases")
    attn_output_gate: StrictBool = Field(
        default=False, description="q_proj also produces an output gate (doubles its width)"
    )
    layer_pattern: list[LayerType] = Field(
        default_factory=lambda: ["full_attention"],
        min_length=1,
        max_length=MAX_LAYERS,
        description="Attention type of each layer, repeated cyclically over num_layers",
    )
    sliding_window: int | None = Field(
        default=None, ge=1, le=MAX_DIM, description="Tokens, for sliding layers"
    )
    full_attention: FullAttentionShape | None = Field(
        default=None,
        description="Shape of the full-attention layers where it differs (Gemma 4); default "
        "the model's head_dim and num_kv_heads",
    )
    kv_shared_layers: int = Field(
        default=0,
        ge=0,
        le=MAX_LAYERS,
        description="The last N layers reuse an earlier layer's KV cache and have no k/v "
        "projections of their own (Gemma 3n/4 num_kv_shared_layers)",
    )
    double_wide_mlp: StrictBool = Field(
        default=False,
        description="The KV-shared layers' dense MLPs are twice intermediate_size wide "
        "(Gemma 4 use_double_wide_mlp)",
    )
    per_layer_input: PerLayerInputSpec | None = None
    linear_attention: LinearAttentionSpec | None = None
    mla: MLASpec | None = None
    mamba: MambaSpec | None = None
    sparse_attention: SparseAttentionSpec | None = None
    moe: MoESpec | None = None
    mlp_gated: StrictBool = Field(
        default=True,
        description="FFNs have a gate projection (SwiGLU/GeGLU: 3 matrices); False for "
        "2-matrix FFNs (e.g. Nemotron-H's squared ReLU)",
    )
    ffn_pattern: list[FFNType] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_LAYERS,
        description="FFN kind of each layer, repeated cyclically over num_layers (Llama 4 "
        "Maverick: [dense, moe]; Nemotron-H: none on mixer layers); default: MoE on every "
        "layer after moe.first_dense_layers, else dense",
    )
    vision: VisionSpec | None = None
    checkpoints: list[Checkpoint] = Field(default_factory=list)
    listed: StrictBool = Field(
        default=True, description="Shown in default listings (False: test models)"
    )
    mtp_layers: int = Field(
        default=0, ge=0, le=MAX_LAYERS, description="Multi-token-prediction layers"
    )
    max_position_embeddings: int | None = Field(
        default=None,
        ge=MIN_CONTEXT_TOKENS,
        le=MAX_DIM * 100,
        description="Longest context, tokens (at least one 16-token KV block)",
    )
    dtype: str = Field(default="bf16", description="Native weight dtype of the release")
    fp8_weight_block: int | None = Field(
        default=None,
        ge=1,
        le=MAX_DIM,
        description="A block-scaled FP8 release (DeepSeek-V3's format): the side of the "
        "square block of weights that shares one scale, config.json's quantization_config "
        "weight_block_size ([128, 128] -> 128). Engines run such checkpoints on their own "
        "block-FP8 GEMM kernels (physics/gemm_tiles.py). None: not an FP8 release, or "
        "per-tensor or per-channel scales",
    )
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
        if self.moe is not None and self.moe.first_dense_layers >= self.num_layers:
            raise ValueError(
                f"moe.first_dense_layers ({self.moe.first_dense_layers}) must be below "
                f"num_layers ({self.num_layers}): 0 to {self.num_layers - 1}, so a layer "
                "has the experts"
            )
        if self.kv_shared_layers >= self.num_layers:
            raise ValueError("kv_shared_layers must leave at least one layer with its own KV")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads}): each KV head serves a whole group of "
                "query heads"
            )
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

    @property
    def first_kv_shared_layer(self) -> int:
        """Index of the first layer that reuses an earlier layer's KV (num_layers when none
        does): it and every later one have no cache and no k/v projections of their own."""
        return self.num_layers - self.kv_shared_layers

    def count_cache_layers(self, kind: LayerType) -> int:
        """Layers of ``kind`` that keep a KV cache of their own (not KV-shared)."""
        own = self.layer_types[: self.first_kv_shared_layer]
        return sum(1 for t in own if t == kind)

    def attention_shape(self, kind: LayerType) -> tuple[int, int]:
        """(head_dim, KV heads) of one layer of ``kind``."""
        if kind == "full_attention" and self.full_attention is not None:
            return self.full_attention.head_dim, self.full_attention.num_kv_heads
        return self.head_dim, self.num_kv_heads

    def ffn_kind(self, layer: int) -> FFNType:
        """The feed-forward block of one layer (0-based)."""
        if self.ffn_pattern:
            return self.ffn_pattern[layer % len(self.ffn_pattern)]
        if self.moe is None or layer < self.moe.first_dense_layers:
            return "dense"
        return "moe"


class QuantFormat(Strict):
    """A weight format: how many bits a quantised parameter costs and what stays unquantised."""

    name: str = catalog_key()
    display_name: str
    aliases: list[str] = Field(default_factory=list)
    weight_bits: float = Field(
        ge=MIN_BITS, le=64, description="Bits of the stored value itself (1 to 64)"
    )
    group_size: int | None = Field(default=None, ge=1, description="Weights sharing one scale")
    scale_bits: float = Field(default=0, ge=0, le=64, description="Bits of each group's scale")
    zero_bits: float = Field(default=0, ge=0, le=64, description="Bits of each group's zero point")
    bits_per_weight_override: float | None = Field(
        default=None,
        ge=MIN_BITS,
        le=64,
        description="Effective bits/weight where the format mixes block types (GGUF k-quants)",
    )
    compute_dtype: Literal["bf16", "fp16", "fp8", "int8", "fp4"] = Field(
        description="Tensor-core type the GEMM runs in when the GPU supports it natively"
    )
    weight_only: StrictBool = Field(
        description="Activations stay 16-bit; weights are dequantised in the kernel"
    )
    quantized_tensors: list[Literal["attention", "linear_attention", "mlp", "experts"]] = Field(
        description="Weight groups this format quantises"
    )
    unquantized_tensors: list[str] = Field(
        default_factory=lambda: ["embeddings", "lm_head", "router", "norms"],
        description="Tensors that usually stay in 16-bit",
    )
    unquantized_bits: float = Field(
        default=16, ge=MIN_BITS, le=64, description="Bits of the tensors left unquantised"
    )
    embedding_bits: float | None = Field(
        default=None,
        ge=MIN_BITS,
        le=64,
        description="Bits/weight of the embedding table if not unquantized_bits",
    )
    lm_head_bits: float | None = Field(
        default=None,
        ge=MIN_BITS,
        le=64,
        description="Bits/weight of the output head if not unquantized_bits",
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
