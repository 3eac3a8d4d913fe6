"""Elementwise kernels of a decoder layer: the activation traffic outside the GEMMs.

Between its GEMMs a layer runs memory-bound kernels over the step's activations: RMSNorm,
rotary embedding, the KV-cache write, the gated activation and, in MoE layers, the sum of
each token's expert outputs. Each is its own kernel, so its time adds to the GEMMs' (it
cannot hide under their compute), and each reads and writes every token's activations, so
it grows with the step's tokens. The hidden state is replicated on every rank of a
tensor-parallel group, so the norms' share does not shrink with TP while the GEMMs' FLOPs
do: at a long prompt and TP=8 these kernels take a fifth of the layer on an H200
(calibration/kernels/h200-prefill-layers.json).

Counts are for vLLM's layer with its fused kernels, in elements per token and layer
(h: hidden size, q / k: query and key-value widths per GPU, f: FFN width per GPU, x2 bytes
for 16-bit activations):

- a fused add-RMSNorm (``fused_add_rms_norm``) before the mixer and one before the FFN:
  read the input and the residual, write both, 4h each;
- rotary embedding in place on queries and keys: read and write, 2(q + k);
- the KV-cache write (``reshape_and_cache``): read the new keys and values, 2k (the write
  itself is the KV term's);
- the gated activation (``silu_and_mul``): read the gate and up halves, write one, 3f (2f
  for an ungated MLP);
- an MoE layer: the activation on each of the top-k experts' slices (3 k f_e) and the shared
  experts' (3 f_s), and ``moe_sum`` reading k expert outputs and writing one, (k + 1) h;
- a Gated DeltaNet layer: its short convolution over queries, keys and values (read and
  write) and its gated RMSNorm on the output (read the output and the gate, write one).

Mamba mixers and MLA's low-rank paths are costed as their attention's counts; FP8
activation quantisation is left out (vLLM fuses it into the norm and the activation).
"""

from __future__ import annotations

from capsim.catalog.model_schema import Model
from capsim.physics.dtypes import ACTIVATION_BYTES
from capsim.physics.kv_layout import kv_heads_per_gpu


def attention_elements(model: Model, tp: int) -> float:
    """Elements per token the attention mixer's elementwise kernels move, per GPU."""
    if model.mla is not None:
        m = model.mla
        heads = model.num_attention_heads / tp
        # rotary on the rope part of queries and the shared key; the latent cache write
        rope = heads * m.qk_rope_head_dim + m.qk_rope_head_dim
        return 2.0 * rope + 2.0 * (m.kv_lora_rank + m.qk_rope_head_dim)
    q = model.num_attention_heads / tp * model.head_dim
    k = kv_heads_per_gpu(model, tp) * model.head_dim
    return 2.0 * (q + k) + 2.0 * k


def linear_attention_elements(model: Model, tp: int) -> float:
    """Elements per token a Gated DeltaNet layer's convolution and gated norm move."""
    la = model.linear_attention
    if la is None:
        return attention_elements(model, tp)
    qk = 2.0 * la.num_key_heads * la.key_head_dim / tp
    v = la.num_value_heads * la.value_head_dim / tp
    return 2.0 * (qk + v) + 3.0 * v


def routed_moe_elements(model: Model, tp: int) -> float:
    """Elements per token an MoE layer's routed experts' elementwise kernels move, per
    GPU: the activation on each of the top-k slices and the sum of the k outputs."""
    moe = model.moe
    gate = 3.0 if model.mlp_gated else 2.0
    k = moe.experts_per_token
    return gate * k * moe.moe_intermediate_size / tp + (k + 1.0) * model.hidden_size


def ffn_elements(model: Model, layer: int, tp: int) -> float:
    """Elements per token one layer's FFN elementwise kernels move, per GPU."""
    kind = model.ffn_kind(layer)
    gate = 3.0 if model.mlp_gated else 2.0
    if kind == "none":
        return 0.0
    if kind == "dense":
        return gate * (model.intermediate_size or 0) / tp
    moe = model.moe
    shared = gate * moe.num_shared_experts * moe.shared_width / tp
    return routed_moe_elements(model, tp) + shared


def elementwise_bytes_per_token(model: Model, tp: int) -> float:
    """Bytes one token's elementwise kernels move through DRAM in one step, summed over
    the model's decoder layers, per GPU of a tensor-parallel group (bytes/token)."""
    h = float(model.hidden_size)
    attention = attention_elements(model, tp)
    linear = linear_attention_elements(model, tp)
    total = 0.0
    for layer, kind in enumerate(model.layer_types):
        if kind != "none":  # a mixer and the add-RMSNorm before it
            total += 4.0 * h + (linear if kind in ("linear_attention", "mamba") else attention)
        if model.ffn_kind(layer) != "none":
            total += 4.0 * h + ffn_elements(model, layer, tp)
    return total * ACTIVATION_BYTES
