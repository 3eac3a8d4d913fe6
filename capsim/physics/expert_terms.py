"""Routed experts in a step: how many distinct experts the step's tokens touch, the share of
their bytes the L2 serves, the grouped GEMMs' rate and rows, and one fused-MoE call's time
as vLLM's kernel benchmark measures it.

``ExpertTerms`` is mixed into ``StepModel`` (physics/step.py) and reads its model,
parameters and expert sizes.
"""

from __future__ import annotations

import math

import numpy as np

from capsim.physics.dtypes import ACTIVATION_BYTES
from capsim.physics.elementwise import routed_moe_elements
from capsim.physics.moe import expected_distinct_experts, placement_load_cv
from capsim.physics.roofline import roofline_scalar


class ExpertTerms:
    """Routed-expert terms (mixed into ``StepModel``)."""

    def experts_touched(self, tokens: float | np.ndarray) -> np.ndarray:
        """Expected distinct routed experts per MoE layer for ``tokens`` tokens."""
        if not self.model.moe:
            return np.zeros_like(np.asarray(tokens, dtype=float))
        moe = self.model.moe
        return expected_distinct_experts(
            moe.num_experts, moe.experts_per_token, tokens, self.params.moe_routing_skew
        )

    def experts_touched_scalar(self, tokens: float) -> float:
        """experts_touched for one token count, without numpy for the uniform case."""
        moe = self.model.moe
        if not moe:
            return 0.0
        if self.params.moe_routing_skew == 0.0:
            return moe.num_experts * (
                1.0 - (1.0 - moe.experts_per_token / moe.num_experts) ** tokens
            )
        return float(self.experts_touched(tokens))

    def expert_parallel_load(
        self, routed_tokens: float, touched: float
    ) -> tuple[float, float, float]:
        """What the busiest GPU of the TP group does in one MoE layer of a pass of
        ``routed_tokens`` tokens touching ``touched`` experts: (expert slices it reads, in
        units of one TP slice; expert GEMM pipelines it runs; its token-expert pairs over the
        group's mean). Tensor parallelism gives every GPU a 1/tp slice of each touched expert,
        so every GPU reads ``touched`` slices and runs that many pipelines on an even share
        of the pairs: (touched, touched, 1).

        Expert parallelism within the TP group (vLLM's --enable-expert-parallel, SGLang's
        --ep-size equal to --tp) gives each GPU num_experts / tp whole experts; the layer
        ends when the GPU with the most touched experts and the most pairs is done. With
        each expert touched independently with probability touched / num_experts, a GPU's
        touched count is Binomial(num_experts / tp, q) and the busiest one's is its expected
        maximum over the tp GPUs (exact, from the binomial CDF); a whole expert is tp slices.
        The pairs (tokens x experts per token, spread evenly in expectation) on the busiest
        GPU exceed the mean by the expected maximum of tp binomial counts (normal
        approximation: sqrt(2 ln tp) standard deviations). With routing skew
        (moe_routing_skew, a Zipf law over the experts) a GPU's share of the pairs varies
        with the popularity of the experts it holds as well (moe.placement_load_cv), and
        the two variances add: hot experts load their GPU, so skew slows the busiest one."""
        tp = self.deployment.tp
        if not self.deployment.expert_parallel or tp == 1 or not touched:
            return touched, touched, 1.0
        key = round(routed_tokens, 3)
        cached = self._ep_cache.get(key)
        if cached is not None:
            return cached
        from scipy.stats import binom  # here: scipy.stats takes a third of a second to import

        moe = self.model.moe
        per_gpu = moe.num_experts // tp
        q = min(1.0, touched / moe.num_experts)
        below = binom.cdf(np.arange(per_gpu), per_gpu, q)
        busiest = float(np.sum(1.0 - below**tp))
        pairs = routed_tokens * moe.experts_per_token
        sampling = (1.0 - 1.0 / tp) * tp / pairs if pairs else 0.0
        placement = placement_load_cv(moe.num_experts, tp, self.params.moe_routing_skew) ** 2
        spread = math.sqrt(2.0 * math.log(tp) * (sampling + placement))
        result = (busiest * tp, busiest, min(float(tp), 1.0 + spread))
        self._ep_cache[key] = result
        return result

    def l2_reuse_fraction(self, touched: np.ndarray) -> np.ndarray:
        """Share of a step's routed-expert bytes served from L2 rather than DRAM.

        The L2 can hold at most ``l2_cache_mb`` of the bytes one MoE layer touches
        (``touched`` expert slices); ``l2_reuse_strength`` says how much of that resident
        share is actually reused (0 by default; calibration decides).
        """
        if not self.gpu.l2_cache_mb or self.params.l2_reuse_strength == 0:
            return np.zeros_like(touched)
        layer_bytes = np.maximum(touched * self.expert_slice_bytes, 1.0)
        resident = np.minimum(1.0, self.gpu.l2_cache_mb * 1e6 / layer_bytes)
        return self.params.l2_reuse_strength * resident

    def fused_moe_seconds(self, tokens: int) -> float:
        """GPU time of one MoE layer's fused-experts call for a step of ``tokens`` tokens
        (s), as vLLM's ``benchmark_moe.py`` times it (in a CUDA graph): the routed experts'
        grouped GEMMs (their weight read and per-expert cost against their FLOPs, the
        step's smooth roofline), the activation on each token's expert slices and the sum
        of its expert outputs, and the call's fixed cost (``moe_layer_overhead_us``:
        routing, alignment, launches). Shared experts are not part of the call."""
        if not self.moe_layers:
            raise ValueError(f"{self.model.name} has no MoE layers")
        t = self._terms(float(tokens), int(tokens), 0.0, 0.0, 0.0, 0.0, 0, 0.0, pad=False)
        p = self.params
        experts = roofline_scalar(t["t_exp_mem"], t["t_exp_cmp"], p.roofline_sharpness)
        elements = routed_moe_elements(self.model, self.deployment.tp)
        elementwise = tokens * elements * ACTIVATION_BYTES / self.elementwise_bw
        return experts / self.moe_layers + elementwise + p.moe_layer_overhead_us * 1e-6

    def expert_gemm_rate(self, routed_tokens: float, touched: float) -> float:
        """FLOP/s of the routed experts' grouped GEMMs in a pass of ``routed_tokens``
        tokens touching ``touched`` experts a layer: the format's GEMM peak x
        ``moe_compute_efficiency`` where the class sets it, else x the dense GEMMs'
        efficiency at the rows each expert gets (``gemm_efficiency``); either x the share
        the slices' width and rows leave (``expert_gemm_shape``)."""
        shape = self.expert_gemm_shape(routed_tokens, touched)
        if self.moe_gemm_rate is not None:
            return self.moe_gemm_rate * shape
        rows = self.rows_per_expert(routed_tokens, touched)
        return self.moe_gemm_peak * self.gemm_efficiency(rows) * shape

    @property
    def expert_slice_columns(self) -> float:
        """Width of one expert's slice on a GPU (columns of its up-projection, the
        intermediate size): the whole expert under expert parallelism, 1/tp of it under
        tensor parallelism."""
        moe = self.model.moe
        if moe is None:
            return 0.0
        tp = 1 if self.deployment.expert_parallel else self.deployment.tp
        return moe.moe_intermediate_size / tp

    def expert_gemm_shape(self, routed_tokens: float, touched: float) -> float:
        """Share of ``moe_compute_efficiency`` the grouped GEMMs keep at this slice width
        and these rows an expert (0-1): w / (w + moe_gemm_half_width) x m / (m +
        moe_gemm_half_rows), each factor 1 where its parameter is unset."""
        p = self.params
        share = 1.0
        if p.moe_gemm_half_width:
            width = self.expert_slice_columns
            if width > 0:  # a dense model's rate is never used
                share *= width / (width + p.moe_gemm_half_width)
        if p.moe_gemm_half_rows:
            rows = self.rows_per_expert(routed_tokens, touched)
            share *= rows / (rows + p.moe_gemm_half_rows) if rows > 0 else 1.0
        return share

    def rows_per_expert(self, routed_tokens: float, touched: float) -> float:
        """Rows of one routed expert's GEMM: the token-expert pairs of a step spread over
        the experts they touch."""
        if not touched or self.model.moe is None:
            return 0.0
        return routed_tokens * self.model.moe.experts_per_token / touched
