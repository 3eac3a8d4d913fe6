"""Block-FP8 dense GEMMs that leave multiprocessors idle: narrow GEMMs at decode batches.

A checkpoint with block-scaled FP8 weights (DeepSeek-V3's format, ``Model.fp8_weight_block``)
runs its dense linear layers on the engine's block-FP8 GEMM kernel. Where that kernel has one
tile shape and splits neither K nor the batch (vLLM's CUTLASS SM90 blockwise kernel: 128 x
128 tiles, ``EfficiencyParams.block_fp8_gemm_tile_columns``), a GEMM of N output columns and
M rows runs ceil(N / tile) x ceil(M / 128) thread blocks, one a multiprocessor. A decode
step's M is a few rows, so a GEMM of 2,112 columns (DeepSeek's fused q/kv down-projection)
keeps 17 of an H100's 132 multiprocessors busy, each streaming its K x 128 slab of weights
at about its fair share of the bandwidth: the GEMM reads at 17 / 132 of the rate a kernel
filling the GPU reaches. With more blocks than multiprocessors they run in waves, the last
one partly empty.

``share(T) = T / (S x ceil(T / S))`` for T blocks on S multiprocessors (``GPU.sm_count``);
a GEMM of B weight bytes then takes B / (dense_bw x share) instead of B / dense_bw, and this
module's term is the difference, summed over a step's dense GEMMs (seconds). The routed
experts (their own fused-MoE kernel), the lm_head (16-bit) and attention's latent
up-projections (16-bit batched GEMMs in decode) are not block-FP8 dense GEMMs.

``GemmTileTerms`` is mixed into ``StepModel`` (physics/step.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from capsim.catalog.model_schema import Model

ROW_TILE = 128
"""Rows (tokens) of one block's output tile in the kernels this term describes."""


@dataclass(frozen=True)
class DenseGemm:
    """One dense linear layer's GEMM on one GPU: its output columns and weights, and the
    weight group (memory.weight_bytes's part) its bits come from."""

    name: str
    columns: int
    weights: float
    part: str


def dense_gemms(model: Model, attention_tp: int, dense_tp: int) -> list[DenseGemm]:
    """The dense linear layers a decode step runs on one GPU, each once per layer that has
    it (summed over the layers): attention's projections (split over ``attention_tp``;
    MLA's q/kv down-projection whole on every GPU, as vLLM's replicated layer holds it),
    the dense FFN layers' and the shared experts' gate-up and down projections (split
    over ``dense_tp``). Column counts are per GPU."""
    h = model.hidden_size
    heads = model.num_attention_heads
    gemms: list[DenseGemm] = []

    def add(name: str, columns: int, k: int, layers: int, part: str = "attention") -> None:
        if columns > 0 and k > 0 and layers > 0:
            gemms.append(DenseGemm(name, columns, float(columns) * k * layers, part))

    attention_layers = model.count_layers("full_attention") + model.count_layers(
        "sliding_attention"
    )
    if model.mla is not None:
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        kv_a = m.kv_lora_rank + m.qk_rope_head_dim
        if m.q_lora_rank:
            add("q/kv down-projection", m.q_lora_rank + kv_a, h, attention_layers)
            add("q up-projection", heads * qk // attention_tp, m.q_lora_rank, attention_layers)
        else:
            add("q projection", heads * qk // attention_tp, h, attention_layers)
            add("kv down-projection", kv_a, h, attention_layers)
        add("o projection", h, heads * m.v_head_dim // attention_tp, attention_layers)
    else:
        d, kv_heads = model.attention_shape("full_attention")
        q_width = heads * d * (2 if model.attn_output_gate else 1)
        qkv = (q_width + 2 * kv_heads * d) // attention_tp
        add("qkv projection", qkv, h, attention_layers)
        add("o projection", h, heads * d // attention_tp, attention_layers)
    gate = 2 if model.mlp_gated else 1
    dense_layers = sum(1 for i in range(model.num_layers) if model.ffn_kind(i) == "dense")
    if dense_layers and model.intermediate_size:
        width = model.intermediate_size // dense_tp
        add("dense FFN gate-up", gate * width, h, dense_layers, "mlp")
        add("dense FFN down", h, width, dense_layers, "mlp")
    moe = model.moe
    moe_layers = sum(1 for i in range(model.num_layers) if model.ffn_kind(i) == "moe")
    if moe is not None and moe.num_shared_experts and moe_layers:
        width = moe.num_shared_experts * moe.shared_width // dense_tp
        add("shared expert gate-up", gate * width, h, moe_layers, "experts")
        add("shared expert down", h, width, moe_layers, "experts")
    return gemms


def wave_share(blocks: int, multiprocessors: int) -> float:
    """Share of the multiprocessors' time ``blocks`` thread blocks keep busy (0-1]: the
    blocks over the multiprocessors times the waves they take."""
    waves = math.ceil(blocks / multiprocessors)
    return blocks / (multiprocessors * waves)


def gemm_blocks(columns: int, rows: float, tile_columns: float) -> int:
    """Thread blocks of one GEMM: its output tiles, ``tile_columns`` x ROW_TILE each."""
    return math.ceil(columns / tile_columns) * max(1, math.ceil(rows / ROW_TILE))


class GemmTileTerms:
    """Block-FP8 dense GEMMs on a one-tile kernel (a mixin of StepModel)."""

    def _init_gemm_tiles(self) -> None:
        """The step's block-FP8 dense GEMMs where this term applies (the engine sets a tile,
        the checkpoint is block-scaled FP8, the GPU's multiprocessors are known); none
        otherwise."""
        from capsim.physics.memory import _format_bits

        tile = self.params.block_fp8_gemm_tile_columns
        self.block_fp8_gemms: list[tuple[DenseGemm, float]] = []
        self._tile_cache: dict[int, float] = {}
        model, dep = self.model, self.deployment
        if not (tile and self.fmt.name == "fp8" and model.fp8_weight_block and self.gpu.sm_count):
            return
        dense_tp = dep.attention_tp if dep.dense_in_ranks else dep.tp
        for gemm in dense_gemms(model, dep.attention_tp, dense_tp):
            size = gemm.weights * _format_bits(self.fmt, gemm.part) / 8
            self.block_fp8_gemms.append((gemm, size))

    def block_fp8_tile_seconds(self, tokens: float) -> float:
        """Time the block-FP8 dense GEMMs of one pass of ``tokens`` rows take beyond
        reading their weights at the full bandwidth share (s): each GEMM's bytes over
        ``dense_bw`` x (1 / wave_share - 1)."""
        if not self.block_fp8_gemms or tokens <= 0:
            return 0.0
        row_tiles = max(1, math.ceil(tokens / ROW_TILE))
        cached = self._tile_cache.get(row_tiles)
        if cached is not None:
            return cached
        sms = self.gpu.sm_count
        tile = self.params.block_fp8_gemm_tile_columns
        extra_bytes = sum(
            size * (1.0 / wave_share(gemm_blocks(g.columns, tokens, tile), sms) - 1.0)
            for g, size in self.block_fp8_gemms
        )
        seconds = extra_bytes / self.dense_bw
        self._tile_cache[row_tiles] = seconds
        return seconds

    def block_fp8_gemm_report(self, tokens: float) -> list[tuple[str, int, int, float]]:
        """Each block-FP8 dense GEMM at ``tokens`` rows: its name, thread blocks, the
        GPU's multiprocessors and the share of the bandwidth its weights stream at."""
        sms = self.gpu.sm_count
        rows = []
        for g, _size in self.block_fp8_gemms:
            blocks = gemm_blocks(g.columns, tokens, self.params.block_fp8_gemm_tile_columns)
            rows.append((g.name, blocks, sms, wave_share(blocks, sms)))
        return rows
