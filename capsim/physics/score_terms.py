"""Attention without a fused kernel: the query-key scores written to memory as a matrix.

A fused attention kernel (FlashAttention, FlashInfer, llama.cpp's ``-fa``) keeps each
query's scores on chip. Without one, llama.cpp's graph (``llm_build_kqv`` before flash
attention became its default, and with ``-fa off`` since) multiplies K by Q into an F32
score tensor of n_kv x n_tokens x n_head per layer, soft-maxes it into another F32 tensor,
and multiplies V by it; on CUDA that last product converts the scores to F16 first
(``ggml_cuda_mul_mat_batched_cublas``: "convert src1 to fp16"). Each score so moves
``attention_score_bytes`` through memory: written in F32 by the first product (4 B), read
and written by the soft-max (4 + 4 B), read and written by the conversion (4 + 2 B) and
read by the second product (2 B): 20 B.

Two physical consequences, both terms here:

- **Traffic**: every score of every head and attention layer, at the elementwise kernels'
  bandwidth, for the share of a layer's score tensor that does not stay in the L2 cache
  (a 512-token pass over 512 cached tokens holds 32 heads x 512 x 512 x 4 B = 34 MB: in
  the 40-96 MB L2 of an A100, RTX 4090 or 5090, not in a 6 MB RTX 3090's; over 4,096
  cached tokens 268 MB, in none).
- **Work**: a step scores every query against every cell of the KV cache it attends over
  (the causal mask is applied to the scores, not skipped), so its attention FLOPs count
  those pairs instead of the causal ones; and where the cache is one unified buffer for
  all sequences (llama.cpp's before split KV streams), against the other sequences' cells
  too.

``ScoreTerms`` is mixed into ``StepModel`` (physics/step.py).
"""

from __future__ import annotations

SCORE_TENSOR_BYTES = 4.0
"""Bytes of one score in the tensor the L2 has to hold (F32, the first product's output)."""


def score_elements(tokens: float, sum_total: float, passes: int) -> float:
    """Scores one attention head computes in one layer over a step (query-key cells),
    without a fused kernel: each of the step's ``tokens`` queries against every KV cell
    its pass attends over. ``sum_total`` is the step's KV cells at its end (every
    sequence's context plus its new tokens, one unified cache); the step runs as
    ``passes`` physical batches (llama.cpp's ubatches), and a pass attends over the cells
    written by the passes before it and itself, so a single prompt of n tokens over c
    cached ones in passes of u scores n c + n (n + u) / 2 cells, not n (c + n)."""
    if tokens <= 0:
        return 0.0
    per_pass = tokens / passes
    return tokens * max(sum_total - 0.5 * (tokens - per_pass), per_pass)


class ScoreTerms:
    """The materialized attention scores of a step (a mixin of StepModel)."""

    def _init_scores(self) -> None:
        """Per-deployment constants: whether the scores are materialized, their bytes per
        head-layer cell summed over the heads and layers one GPU runs, and the L2 size."""
        dep, model = self.deployment, self.model
        self.scores_materialized = not dep.flash_attention
        heads = model.num_attention_heads / dep.attention_tp
        layers = self.full_layers + self.sliding_layers
        self.score_bytes_per_cell = heads * layers * self.params.attention_score_bytes
        self.score_tensor_bytes_per_cell = heads * SCORE_TENSOR_BYTES
        self.l2_bytes = (self.gpu.l2_cache_mb or 0.0) * 1e6

    def score_cells(self, tokens: float, sum_total: float) -> float:
        """``score_elements`` of a step, per head and layer (0 with a fused kernel, and for
        the context-free part of a step, whose sums hold no KV cells: the step's own
        tokens are among its cells)."""
        if not self.scores_materialized or tokens <= 0 or sum_total <= 0:
            return 0.0
        return score_elements(tokens, sum_total, self.passes(tokens))

    def score_spill(self, cells: float, tokens: float) -> float:
        """Share of the score traffic that reaches DRAM (dimensionless): what of one
        layer's score tensor in one pass (all heads, F32) the L2 cannot hold; 1 on a GPU
        whose L2 size the catalog does not know."""
        if not self.l2_bytes:
            return 1.0
        tensor = cells / self.passes(tokens) * self.score_tensor_bytes_per_cell
        if tensor <= self.l2_bytes:
            return 0.0
        return 1.0 - self.l2_bytes / tensor

    def score_step(
        self, pairs: float, tokens: float, sum_total: float
    ) -> tuple[float, float, float]:
        """A step's materialized scores, their cells counted once: (the full-attention pairs
        whose FLOPs it runs, bytes through DRAM, seconds). The pairs are every score cell
        (``score_cells``) where the step scores more than the causal ``pairs`` (MLA's pairs,
        in their own units, are kept); the bytes are every cell's ``attention_score_bytes``
        for every head and attention layer, the share the L2 does not hold, moved at the
        elementwise kernels' bandwidth. (``pairs``, 0, 0) with a fused kernel."""
        cells = self.score_cells(tokens, sum_total)
        if not cells:
            return pairs, 0.0, 0.0
        run = pairs if self.mla_two_forms else max(pairs, cells)
        moved = cells * self.score_bytes_per_cell * self.score_spill(cells, tokens)
        return run, moved, moved / self.elementwise_bw
