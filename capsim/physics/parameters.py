"""Parameter counts computed from a model's dimensions (config.json), by component.

Every count is a number of weights (not bytes). The components are the groups a weight
format quantises differently (attention, MLP, experts) or leaves in 16-bit (embeddings,
router, norms), and the groups a decode step reads differently (routed experts are read
only when a token routes to them).

Formulas (gated-SiLU FFNs as in Llama/Qwen/DeepSeek/GLM/gpt-oss; h = hidden size):

* GQA attention: q = h*H*d (x2 with an output gate), k = v = h*K*d, o = H*d*h,
  plus q/k/v biases when ``attention_bias``.
* MLA (DeepSeek-V3): q_a = h*r_q, q_b = r_q*H*(d_nope+d_rope), kv_a = h*(r_kv+d_rope),
  kv_b = r_kv*H*(d_nope+d_v), o = H*d_v*h, plus the two latent norms.
* Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention):
  in_proj_qkvz = h*(2*nk*dk + 2*nv*dv),
  in_proj_ba = h*2*nv, out_proj = nv*dv*h (quantisable projections); conv1d =
  (2*nk*dk + nv*dv)*kernel, A_log and dt_bias = 2*nv, gated norm = dv (small, kept 16-bit).
* Mamba-2 (Nemotron-H): in_proj = h*(2*d_inner + 2*groups*state + heads), out_proj =
  d_inner*h (quantisable); conv1d = (d_inner + 2*groups*state)*(kernel + 1) with its bias,
  A_log, D and dt_bias = 3*heads, gated norm = d_inner (small, kept 16-bit).
* DeepSeek sparse attention (V3.2) adds its indexer to each attention layer: a query
  projection from the q latent (r_q*heads_i*d_i), a key projection h*d_i, a head-weight
  projection h*heads_i and the key norm (2*d_i).
* Dense FFN: 3*h*I gated (SwiGLU/GeGLU), 2*h*I without a gate (``mlp_gated`` false, e.g.
  Nemotron-H's squared ReLU).  One expert: the same at I_moe (+ 2*I_moe + h biases for
  gpt-oss). Each layer's FFN is dense, routed experts or none (``Model.ffn_kind``).
  Router: h*E per MoE layer; Qwen-style shared expert gate: h per layer.
* Vision tower of a vision-language model: the parameter count its source states
  (``vision.params_b``), kept apart from the text model's total.
* Per-layer attention shapes (Gemma 4): full-attention layers take their own head dim and
  KV heads (``Model.attention_shape``), no v_proj where the keys are the values
  (attention_k_eq_v); KV-shared layers (the last ``kv_shared_layers``) have no k/v
  projections.
* Latent MoE (Nemotron 3 Super): each routed expert works on ``moe.latent_size`` instead
  of h, and each MoE layer adds the h -> latent -> h projections (2*h*latent, counted with
  the always-active shared expert weights).
* Per-layer embeddings (Gemma E models): a table of vocab_per_layer x (layers x size),
  kept apart (``per_layer_embeddings``: looked up, never read whole), plus the projection
  h x (layers x size) and each layer's gate and projection back (2*h*size), with the MLPs.
* Norms: h per block (mixer and FFN) + h final (q/k norms of 2*d per attention layer where
  present are
  folded in as negligible).
* MTP module (DeepSeek-V3 / Qwen3.5 / GLM-4.5): one extra decoder layer with full attention
  and the model's FFN, plus the 2h*h projection that joins embedding and hidden state and
  three norms. It shares the embedding and lm_head with the main model and is reported
  separately, because model cards count it differently.
"""

from __future__ import annotations

from dataclasses import dataclass

from capsim.arguments import require_entries
from capsim.catalog.model_schema import Model


@dataclass(frozen=True)
class ParameterBreakdown:
    """Weights by component, as counts (not bytes)."""

    embeddings: int
    lm_head: int
    attention: int
    linear_attention: int
    linear_attention_small: int
    mlp: int
    shared_experts: int
    routed_experts: int
    router: int
    norms: int
    mtp: int
    routed_experts_active: int
    expert_params_per_expert: int
    moe_layers: int
    vision: int = 0
    per_layer_embeddings: int = 0
    # of ``attention``, the weights every GPU of a tensor-parallel group holds whole: MLA's
    # down-projections of q and kv (vLLM's fused_qkv_a_proj with disable_tp, SGLang's
    # ReplicatedLinear) and DeepSeek sparse attention's indexer
    attention_replicated: int = 0

    @property
    def total(self) -> int:
        """All weights of the main model (MTP excluded)."""
        return (
            self.embeddings
            + self.per_layer_embeddings
            + self.lm_head
            + self.attention
            + self.linear_attention
            + self.linear_attention_small
            + self.mlp
            + self.shared_experts
            + self.routed_experts
            + self.router
            + self.norms
        )

    @property
    def total_with_vision(self) -> int:
        """All weights including a vision-language model's image tower."""
        return self.total + self.vision

    @property
    def active(self) -> int:
        """Weights one token uses, counting the whole input embedding table (DeepSeek/Qwen
        model-card convention)."""
        return self.total - self.routed_experts + self.routed_experts_active

    @property
    def active_excluding_embedding(self) -> int:
        """Weights one token uses, without the input embedding table (OpenAI gpt-oss
        convention; also what a decode step actually reads, since an embedding lookup
        reads one row, not the table)."""
        return self.active - self.embeddings - self.per_layer_embeddings

    def active_by_convention(self, convention: str) -> int:
        """Active weights counted the way a model card does (see PublishedParams)."""
        if convention == "all":
            return self.active
        if convention == "excludes_embedding":
            return self.active_excluding_embedding
        if convention == "excludes_embedding_and_lm_head":
            return self.active_excluding_embedding - self.lm_head
        raise ValueError(f"unknown active-parameter convention {convention!r}")

    def as_dict(self) -> dict[str, int]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(
            total=self.total,
            total_with_vision=self.total_with_vision,
            active=self.active,
            active_excluding_embedding=self.active_excluding_embedding,
        )
        return d


def attention_params(model: Model, kind: str = "full_attention", own_kv: bool = True) -> int:
    """Weights of one softmax-attention layer of ``kind`` (full or sliding, each with its
    own head shape: Model.attention_shape), MLA included; ``own_kv`` False for a KV-shared
    layer, which has no k/v projections."""
    h = model.hidden_size
    heads = model.num_attention_heads
    if model.mla is not None:
        m = model.mla
        qk_dim = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            q = h * m.q_lora_rank + m.q_lora_rank * heads * qk_dim + m.q_lora_rank
        else:
            q = h * heads * qk_dim
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
        kv += m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        o = heads * m.v_head_dim * h
        return q + kv + o + indexer_params(model)
    d, kv_heads = model.attention_shape(kind)  # type: ignore[arg-type]
    q_width = heads * d * (2 if model.attn_output_gate else 1)
    kv_width = kv_heads * d
    shape = model.full_attention
    kv_projections = (
        0 if not own_kv else (1 if kind == "full_attention" and shape and shape.k_eq_v else 2)
    )
    params = h * q_width + kv_projections * h * kv_width + heads * d * h
    if model.attention_bias:
        params += q_width + kv_projections * kv_width
    return params


def replicated_attention_params(model: Model) -> int:
    """Weights of one attention layer that engines keep whole on every GPU of a
    tensor-parallel group (0 without MLA): the q and kv down-projections (h x (q_lora_rank
    + kv_lora_rank + qk_rope_head_dim); the kv one alone without a q LoRA) and the
    indexer of DeepSeek sparse attention."""
    m = model.mla
    if m is None:
        return 0
    h = model.hidden_size
    down = (m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_rope_head_dim
    return h * down + indexer_params(model)


def indexer_params(model: Model) -> int:
    """Weights of DeepSeek sparse attention's lightning indexer in one layer (0 without)."""
    sa = model.sparse_attention
    if sa is None:
        return 0
    h = model.hidden_size
    q_in = model.mla.q_lora_rank if model.mla and model.mla.q_lora_rank else h
    width = sa.index_n_heads * sa.index_head_dim
    return q_in * width + h * sa.index_head_dim + h * sa.index_n_heads + 2 * sa.index_head_dim


def mamba_params(model: Model) -> tuple[int, int]:
    """(projection weights, small 16-bit weights) of one Mamba-2 layer."""
    mb = model.mamba
    if mb is None:
        return 0, 0
    h = model.hidden_size
    inner = mb.inner_size
    bc = 2 * mb.n_groups * mb.state_size
    proj = h * (2 * inner + bc + mb.num_heads) + inner * h
    small = (inner + bc) * (mb.conv_kernel + 1) + 3 * mb.num_heads + inner
    return proj, small


def linear_attention_params(model: Model) -> tuple[int, int]:
    """(projection weights, small 16-bit weights) of one Gated DeltaNet layer."""
    la = model.linear_attention
    if la is None:
        return 0, 0
    h = model.hidden_size
    key_width = la.num_key_heads * la.key_head_dim
    value_width = la.num_value_heads * la.value_head_dim
    proj = h * (2 * key_width + 2 * value_width) + h * 2 * la.num_value_heads + value_width * h
    small = (2 * key_width + value_width) * la.conv_kernel_dim + 2 * la.num_value_heads
    small += la.value_head_dim
    return proj, small


def ffn_params(hidden: int, width: int, gated: bool = True) -> int:
    """FFN weights: gate, up and down projections (gated), or up and down."""
    return (3 if gated else 2) * hidden * width


def expert_params(model: Model) -> int:
    """Weights of one routed expert (on the latent width for a latent MoE)."""
    assert model.moe is not None
    width_in = model.moe.latent_size or model.hidden_size
    p = ffn_params(width_in, model.moe.moe_intermediate_size, model.mlp_gated)
    if model.moe.expert_bias:
        p += 2 * model.moe.moe_intermediate_size + model.hidden_size
    return p


def layer_ffn_params(model: Model, layer: int) -> dict[str, int]:
    """FFN weights of one layer, split into mlp / shared / routed / router / active."""
    h = model.hidden_size
    kind = model.ffn_kind(layer)
    if kind == "none":
        return {}
    if kind == "dense":
        assert model.intermediate_size is not None
        width = model.intermediate_size
        if model.double_wide_mlp and layer >= model.first_kv_shared_layer:
            width *= 2
        return {"mlp": ffn_params(h, width, model.mlp_gated)}
    moe = model.moe
    assert moe is not None
    per_expert = expert_params(model)
    shared = moe.num_shared_experts * ffn_params(h, moe.shared_width, model.mlp_gated)
    if moe.latent_size:  # the down- and up-projections around the latent experts
        shared += 2 * h * moe.latent_size
    router = h * moe.num_experts + (h if moe.num_shared_experts else 0)
    return {
        "shared": shared,
        "routed": moe.num_experts * per_expert,
        "routed_active": moe.experts_per_token * per_expert,
        "router": router,
    }


def parameter_breakdown(model: Model) -> ParameterBreakdown:
    """Count the model's weights by component from its dimensions."""
    if not isinstance(model, Model):
        require_entries(model=model)  # the Python API's: a name where the Model is taken
    h = model.hidden_size
    totals = dict.fromkeys(
        (
            "attention",
            "linear_attention",
            "linear_attention_small",
            "mlp",
            "shared",
            "routed",
            "routed_active",
            "router",
        ),
        0,
    )
    moe_layers = 0
    blocks = 0
    replicated = 0
    attn = attention_params(model)
    la_proj, la_small = linear_attention_params(model)
    mamba_proj, mamba_small = mamba_params(model)
    for layer, kind in enumerate(model.layer_types):
        if kind == "linear_attention":
            totals["linear_attention"] += la_proj
            totals["linear_attention_small"] += la_small
        elif kind == "mamba":
            totals["linear_attention"] += mamba_proj
            totals["linear_attention_small"] += mamba_small
        elif kind != "none":
            totals["attention"] += attention_params(
                model, kind, own_kv=layer < model.first_kv_shared_layer
            )
            replicated += replicated_attention_params(model)
        ffn = layer_ffn_params(model, layer)
        if "routed" in ffn:
            moe_layers += 1
        for key, value in ffn.items():
            totals[key] += value
        blocks += (kind != "none") + bool(ffn)
    norms = h * blocks + h
    embeddings = model.vocab_size * h
    per_layer_embeddings = 0
    if model.per_layer_input is not None:
        # the per-layer table, the projection of the hidden state to every layer's input
        # (and its norm), and each layer's gate and projection back (and their norm)
        ple = model.per_layer_input
        width = model.num_layers * ple.size
        per_layer_embeddings = ple.vocab_size * width
        totals["mlp"] += h * width + model.num_layers * 2 * h * ple.size
        norms += ple.size + model.num_layers * h
    lm_head = 0 if model.tie_word_embeddings else model.vocab_size * h

    mtp = 0
    if model.mtp_layers:
        last = model.num_layers - 1  # an MTP layer uses the FFN kind of the deep layers
        ffn = layer_ffn_params(model, last)
        ffn_total = ffn.get("mlp", 0) + ffn.get("shared", 0) + ffn.get("routed", 0)
        ffn_total += ffn.get("router", 0)
        mtp = model.mtp_layers * (attn + ffn_total + 2 * h * h + 5 * h)
    vision = round(model.vision.params_b * 1e9) if model.vision else 0

    per_expert = expert_params(model) if model.moe else 0
    return ParameterBreakdown(
        embeddings=embeddings,
        lm_head=lm_head,
        attention=totals["attention"],
        linear_attention=totals["linear_attention"],
        linear_attention_small=totals["linear_attention_small"],
        mlp=totals["mlp"],
        shared_experts=totals["shared"],
        routed_experts=totals["routed"],
        router=totals["router"],
        norms=norms,
        mtp=mtp,
        routed_experts_active=totals["routed_active"],
        expert_params_per_expert=per_expert,
        moe_layers=moe_layers,
        vision=vision,
        per_layer_embeddings=per_layer_embeddings,
        attention_replicated=replicated,
    )
