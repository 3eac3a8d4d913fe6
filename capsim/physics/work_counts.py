"""What a step's work is made of, per GPU of one tensor-parallel group: the weight bytes
read every step, the routed experts' bytes and one expert's slice, and the FLOPs per token
of the dense GEMMs, the routed experts, the lm_head, attention's query-key pairs and the
linear-attention (Gated DeltaNet, Mamba-2) state updates. FLOP counts as in physics/step.py's
docstring.

``WorkCounts`` is mixed into ``StepModel`` (physics/step.py).
"""

from __future__ import annotations

import math

from capsim.physics.elementwise import elementwise_bytes_per_token
from capsim.physics.memory import weight_bytes
from capsim.physics.parameters import parameter_breakdown


class WorkCounts:
    """Bytes and FLOPs of one deployment's step (a mixin of StepModel)."""

    def _init_work_counts(self, elementwise_bytes: float | None) -> dict[str, float]:
        """Set the weight bytes and FLOPs per token (``elementwise_bytes``: bytes per token
        of the elementwise kernels, None for vLLM's fused layer); returns the weights'
        bytes by part (``memory.weight_bytes``), which the drafter's set-up reads too."""
        model, fmt, tp = self.model, self.fmt, self.deployment.tp
        # data-parallel attention: a GPU reads its rank's whole attention, split over the
        # rank's attention_tp GPUs, every step; its FLOPs per token are unchanged (a rank
        # computes 1 / ranks of the tokens with ranks times the heads)
        attention_tp = self.deployment.attention_tp
        # vLLM's DP+EP: the dense layers and shared experts whole on each rank as well
        dense_tp = attention_tp if self.deployment.dense_in_ranks else None
        parts = weight_bytes(
            model, fmt, tp, include_mtp=False, attention_tp=attention_tp, dense_tp=dense_tp
        )
        self.expert_bytes_all = parts["experts"]
        breakdown = parameter_breakdown(model)
        self.params_breakdown = breakdown
        routed_share = 0.0
        if breakdown.routed_experts:
            shared_and_routed = breakdown.routed_experts + breakdown.shared_experts
            routed_share = breakdown.routed_experts / shared_and_routed
        # the routed experts always span the group: their share of the group-split bytes
        split = weight_bytes(model, fmt, tp, include_mtp=False) if dense_tp else parts
        self.routed_bytes_all = split["experts"] * routed_share
        # everything read every step: all but the embedding table (a step looks up one
        # row per token), the routed experts and a vision tower (text-only steps never run
        # it); a tied table is the output head as well, and the head reads all of it
        looked_up = 0.0 if model.tie_word_embeddings else parts["embeddings"]
        looked_up += parts["per_layer_embeddings"]  # Gemma 3n/4: a row per token and layer
        self.dense_weight_bytes = (
            sum(parts.values()) - looked_up - parts["vision"] - self.routed_bytes_all
        )
        self.moe_layers = breakdown.moe_layers
        self.expert_slice_bytes = (
            self.routed_bytes_all / (self.moe_layers * model.moe.num_experts)
            if model.moe and self.moe_layers
            else 0.0
        )

        # --- FLOPs per token
        body_active = breakdown.active_excluding_embedding - breakdown.lm_head
        routed_active = breakdown.routed_experts_active
        # MLA's down-projections run whole on every GPU of an attention rank, on the rank's
        # tokens (1 / dp_attention of a step's, the ranks balanced)
        replicated = breakdown.attention_replicated
        self.dense_flops_per_token = (
            2.0 * (body_active - routed_active - replicated) / tp
            + 2.0 * replicated / self.deployment.dp_attention
        )
        self.expert_flops_per_token = 2.0 * routed_active / tp
        self.lm_head_flops_per_token = 2.0 * model.vocab_size * model.hidden_size / tp
        # norms, rotary, cache writes, activation, MoE sums: separate memory-bound kernels
        self.elementwise_bytes_per_token = (
            elementwise_bytes_per_token(model, tp)
            if elementwise_bytes is None
            else elementwise_bytes
        )
        self.full_layers = model.count_layers("full_attention")
        self.sliding_layers = model.count_layers("sliding_attention")
        # FLOPs of one query-key pair (QK^T and PV), summed over the layers of each kind;
        # each kind with its own head dimension (Gemma 4's full layers: global_head_dim)
        self.full_pair_flops = self.full_layers * _pair_flops(model, "full_attention", tp)
        self.sliding_pair_flops = self.sliding_layers * _pair_flops(model, "sliding_attention", tp)
        # MLA prefills in the "compute friendly" form (vLLM's mla/common.py, SGLang's MHA
        # path): the cached latents up-projected to per-head K and V, then ordinary attention
        # at the q/k head dim (qk_nope + qk_rope) and the v head dim, where decode stays in
        # the absorbed latent form the pair FLOPs above count. In those units: a prefill
        # pair's FLOPs, and the up-projection of one cached context token per step
        self.mla_prefill_pair_ratio, self.mla_context_upproj_pairs = _mla_prefill_units(model, tp)
        # an MLA decode kernel runs a sequence's query rows (the heads this GPU holds x the
        # tokens it decodes) in tiles of mla_decode_row_tile rows, a partly empty tile at
        # the cost of a full one: the decode pair's FLOPs as executed. Prefill pairs (the
        # up-projected form, ordinary attention kernels) keep their own FLOPs
        self.mla_decode_padding = mla_decode_padding(
            model, attention_tp, self.decode_width, self.params.mla_decode_row_tile
        )
        if self.mla_decode_padding != 1.0:
            self.full_pair_flops *= self.mla_decode_padding
            self.mla_prefill_pair_ratio /= self.mla_decode_padding
            self.mla_context_upproj_pairs /= self.mla_decode_padding
        # whether a prefill pair costs other than a decode pair (MLA's two forms, or the
        # decode tile's padding): the step then sums its sequences' pairs form by form
        self.mla_two_forms = (
            bool(self.mla_context_upproj_pairs) or self.mla_prefill_pair_ratio != 1.0
        )
        self.linear_layers = model.count_layers("linear_attention")
        la = model.linear_attention
        # Gated DeltaNet: the state update and read-out, 6 x dk x dv FLOPs a head and token
        self.gdn_flops_per_token = (
            6.0
            * self.linear_layers
            * (la.num_value_heads / tp)
            * la.key_head_dim
            * la.value_head_dim
            if la
            else 0.0
        )
        self.linear_flops_per_token = self.gdn_flops_per_token
        mb = model.mamba
        if mb is not None:  # Mamba-2 SSM: state update and read-out, per head
            self.linear_flops_per_token += (
                6.0
                * model.count_layers("mamba")
                * (mb.num_heads / tp)
                * mb.head_dim
                * mb.state_size
            )
        return parts


def _pair_flops(model, kind: str, tp: int) -> float:
    """FLOPs of one query-key pair in one attention layer of ``kind``, per GPU."""
    heads = model.num_attention_heads / tp
    if model.mla is not None:
        m = model.mla
        return float(2 * heads * (m.kv_lora_rank + m.qk_rope_head_dim) + 2 * heads * m.kv_lora_rank)
    head_dim, _ = model.attention_shape(kind)
    return float(4 * heads * head_dim)


def mla_decode_padding(model, attention_tp: int, rows_per_head: int, tile: int) -> float:
    """Executed over counted FLOPs of an MLA decode step's attention (dimensionless): the
    query rows of one sequence, heads a GPU x ``rows_per_head`` (tokens decoded a step),
    rounded up to whole tiles of ``tile`` rows; 1 without MLA or without a tile."""
    if model.mla is None or tile <= 1:
        return 1.0
    rows = model.num_attention_heads / attention_tp * rows_per_head
    return math.ceil(rows / tile) * tile / rows


def _mla_prefill_units(model, tp: int) -> tuple[float, float]:
    """(prefill pair FLOPs over decode pair FLOPs, up-projection FLOPs of one cached
    context token over decode pair FLOPs) of an MLA model's attention layers; (1, 0)
    without MLA. A decode pair in the absorbed form costs 2 (kv_lora_rank + qk_rope) + 2
    kv_lora_rank FLOPs a head; a prefill pair in the up-projected form 2 (qk_nope +
    qk_rope) + 2 v_head_dim; the up-projection (kv_b_proj) of a cached latent 2
    kv_lora_rank (qk_nope + v_head_dim) a head."""
    m = model.mla
    if m is None or model.sparse_attention is not None:
        # DeepSeek sparse attention (V3.2, GLM-5) prefills in the absorbed form too, its
        # sparse kernel reading the indexer's top-k keys, which capsim does not model
        return 1.0, 0.0
    absorbed = 2.0 * (m.kv_lora_rank + m.qk_rope_head_dim) + 2.0 * m.kv_lora_rank
    expanded = 2.0 * (m.qk_nope_head_dim + m.qk_rope_head_dim) + 2.0 * m.v_head_dim
    upproj = 2.0 * m.kv_lora_rank * (m.qk_nope_head_dim + m.v_head_dim)
    return expanded / absorbed, upproj / absorbed
