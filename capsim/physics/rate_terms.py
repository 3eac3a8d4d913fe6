"""The rates a step's terms divide by: memory bandwidth per kind of traffic (weights,
experts, KV cache, recurrent state, elementwise kernels) and GEMM FLOP/s by format and by
rows (``gemm_efficiency``), each a datasheet peak x an efficiency parameter x the power
limit's scale.

``RateTerms`` is mixed into ``StepModel`` (physics/step.py) and reads its GPU, weight
format, deployment, parameters and FLOP counts.
"""

from __future__ import annotations

import math

from capsim.errors import CapsimUserError
from capsim.physics.deployment import compute_dtype_for
from capsim.physics.power import power_scales

DECODE_GEMM_ROWS = 512
"""Rows up to which a GEMM runs at ``compute_efficiency`` (the decode-shaped regime the
H100/H200 kernel measurements cover)."""
PREFILL_GEMM_ROWS = 8192
"""Rows from which a GEMM runs at ``prefill_compute_efficiency`` (a full prefill chunk)."""


class RateTerms:
    """Bandwidths (bytes/s) and GEMM rates (FLOP/s) of one deployment (a mixin of StepModel)."""

    def _init_rates(self) -> None:
        """Set the deployment's rates from its GPU, format, power limit and parameters."""
        gpu, fmt, dep, p = self.gpu, self.fmt, self.deployment, self.params
        compute_scale, bw_scale = power_scales(
            gpu, dep.power_limit_w, p.compute_power_exponent, p.bandwidth_power_exponent
        )
        self.compute_dtype, native = compute_dtype_for(gpu, fmt)
        peak = getattr(gpu.tensor_tflops, self.compute_dtype)
        if not peak:
            raise CapsimUserError(
                f"{gpu.name} has no {self.compute_dtype} tensor throughput in the catalog",
                hint="add tensor_tflops to the GPU's YAML (dense figures)",
            )
        sixteen = gpu.tensor_tflops.bf16 or gpu.tensor_tflops.fp16 or peak
        bandwidth = gpu.memory_bandwidth_gb_s * 1e9 * bw_scale
        format_bw = 1.0 if native else p.non_native_bandwidth_factor
        weight_only = fmt.weight_only or not native
        gemm_factor = p.weight_only_compute_factor if weight_only else 1.0
        self.native = native
        self.dense_bw = bandwidth * p.bandwidth_efficiency * format_bw
        expert_read = p.moe_bandwidth_efficiency
        if not native and p.moe_dequant_bandwidth_efficiency is not None:
            expert_read = p.moe_dequant_bandwidth_efficiency  # packed experts' own kernel
        self.expert_bw = bandwidth * expert_read * format_bw
        # a Triton attention backend reads the cache at its share of the default kernels'
        # rate (physics/attention_backend.py)
        triton = p.triton_attention_kv_share if dep.triton_attention else 1.0
        self.kv_bw = bandwidth * p.kv_bandwidth_efficiency * triton
        # the recurrent linear-attention kernel's state stream (decode and verify)
        self.state_bw = bandwidth * (
            p.linear_attention_state_bandwidth_efficiency or p.kv_bandwidth_efficiency
        )
        self.elementwise_bw = bandwidth * p.elementwise_bandwidth_efficiency
        # weight-only dense GEMMs on int8 tensor cores (activations quantised to 8 bits, as
        # llama.cpp's MMQ does) where the engine and class say so and the GPU has the rate
        int8_peak = gpu.tensor_tflops.int8 if "int8" in gpu.native_formats else None
        int8_path = bool(weight_only and int8_peak and p.weight_only_int8_gemm_efficiency)
        # GEMM peak of this format before the row-dependent efficiency (gemm_efficiency);
        # FP16 GEMMs that accumulate in FP16 run at that rate (fp16_accumulate_speedup): FP16
        # weights, or weight-only ones the engine dequantises to FP16 off the int8 path
        on_fp16 = self.compute_dtype == "fp16" or (weight_only and not int8_path)
        self.fp16_accumulate_speedup = p.fp16_accumulate_speedup if on_fp16 else 1.0
        # the tensor rate before any dequantisation cost, and the dense GEMMs' after it
        tensor_peak = peak * 1e12 * compute_scale * self.fp16_accumulate_speedup
        self.gemm_peak = tensor_peak * gemm_factor
        # fused-MoE grouped GEMMs: the format's GEMM peak x moe_compute_efficiency when set
        # (W8A8 experts on 8-bit tensor cores: moe_compute_efficiency_8bit where the class
        # sets it)
        moe_efficiency = p.moe_compute_efficiency
        if self.compute_dtype in ("fp8", "int8") and not weight_only:
            moe_efficiency = p.moe_compute_efficiency_8bit or moe_efficiency
        self.moe_gemm_peak = self.gemm_peak
        if not native and p.moe_dequant_compute_efficiency is not None:
            # experts dequantised from a format without tensor cores here, in their kernel:
            # its share of the tensor rate, in place of the dense dequantisation factor
            self.moe_gemm_peak = tensor_peak
            moe_efficiency = p.moe_dequant_compute_efficiency
        self.moe_gemm_rate = self.moe_gemm_peak * moe_efficiency if moe_efficiency else None
        self.int8_gemm_rate = (
            int8_peak * 1e12 * compute_scale * p.weight_only_int8_gemm_efficiency
            if int8_path
            else None
        )
        self.attention_flops_rate = sixteen * 1e12 * compute_scale * p.attention_compute_efficiency
        # the chunked Gated DeltaNet prefill kernels, where the class sets their own rate,
        # and their serial walk over chunks, seconds per token and layer
        self.gdn_prefill_token_seconds = (p.linear_attention_prefill_token_ns or 0.0) * 1e-9
        self.gdn_prefill_rate = (
            sixteen * 1e12 * compute_scale * p.linear_attention_compute_efficiency
            if p.linear_attention_compute_efficiency and self.gdn_flops_per_token
            else None
        )

    def gemm_efficiency(self, rows: float) -> float:
        """Fraction of tensor peak a GEMM with ``rows`` rows (tokens) reaches:
        ``compute_efficiency`` up to DECODE_GEMM_ROWS, ``prefill_compute_efficiency`` from
        PREFILL_GEMM_ROWS, log-linear between (tile and wave quantisation waste less of a
        big GEMM)."""
        p = self.params
        large = p.prefill_compute_efficiency or p.compute_efficiency
        if rows <= DECODE_GEMM_ROWS:
            return p.compute_efficiency
        if rows >= PREFILL_GEMM_ROWS:
            return large
        share = math.log(rows / DECODE_GEMM_ROWS) / math.log(PREFILL_GEMM_ROWS / DECODE_GEMM_ROWS)
        return p.compute_efficiency + share * (large - p.compute_efficiency)

    def passes(self, tokens: float) -> int:
        """Passes a step of ``tokens`` tokens runs as: 1, or with a physical batch
        (``ubatch_tokens``, llama.cpp's n_ubatch) one per ubatch it needs."""
        ubatch = self.deployment.ubatch_tokens
        if not ubatch or tokens <= ubatch:
            return 1
        return math.ceil(tokens / ubatch)

    def dense_gemm_rate(self, rows: float) -> float:
        """FLOP/s of the dense (non-expert) GEMMs of a pass of ``rows`` tokens: the int8
        tensor path where it applies (``weight_only_int8_gemm_efficiency``), else the
        format's GEMM peak x ``gemm_efficiency(rows)``."""
        if self.int8_gemm_rate is not None:
            return self.int8_gemm_rate
        return self.gemm_peak * self.gemm_efficiency(rows)
