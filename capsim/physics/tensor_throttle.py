"""Compute-bound kernels on a part whose tensor cores are throttled against its other units.

A hardware class's compute efficiencies (hardware_db/efficiency/CLASS.yaml: the share of
the dense tensor peak a GEMM, attention or grouped-expert kernel reaches) were measured on
one GPU of the class, its ``reference_gpu``. There a compute-bound kernel's time is the
tensor math, FLOPs / P_ref, and the rest, (1 / e - 1) x FLOPs / P_ref: tile loads, softmax
exponentials, epilogues and address arithmetic on the SMs' other units, which the tensor
cores wait on. A part of the same architecture whose tensor rate is cut against those
units (NVIDIA's H20: 148 dense BF16 TFLOPS beside 44 FP32, where the H100 SXM has 989.5
beside 67) does the same rest at the rate of its own other units, so the rest is a smaller
share of its time and the kernel runs nearer its (lower) tensor peak:

    e' = 1 / (1 + (1 / e - 1) x k),    k = (P / V) / (P_ref / V_ref)

with P the dense 16-bit tensor peak and V the non-tensor FP32 rate (``vector_fp32_tflops``)
of the GPU and of the reference. Every full-rate part of a class has k = 1 (the H100 PCIe,
the H200: the same ratio as the H100 SXM) and keeps e; k < 1 raises e toward 1; an unknown V
leaves e as it is. Out of sample, the H20's own kernel benchmarks: FlashAttention-3 and
cuDNN causal prefill attention at 73% of its 148 TFLOPS from 2K tokens (flash-attention
issue 1310), GEMMs at 95% (the TileOPs H20-3e profile), against the H100 class's 45% and
73% (hardware_db/gpus/h20.yaml). Memory-bound terms are untouched: the H20 keeps Hopper's
HBM and its bandwidth shares.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from capsim.catalog.gpu_schema import GPU
    from capsim.physics.efficiency import EfficiencyParams

COMPUTE_EFFICIENCIES = (
    "compute_efficiency",
    "prefill_compute_efficiency",
    "moe_compute_efficiency",
    "moe_compute_efficiency_8bit",
    "attention_compute_efficiency",
    "linear_attention_compute_efficiency",
    "weight_only_int8_gemm_efficiency",
)
"""Shares of a tensor peak a compute-bound kernel reaches: the ones the throttle rescales
(the recurrence's per-chunk time, launch floors and bandwidth shares are not tensor-bound)."""


def tensor_to_vector(gpu: GPU) -> float | None:
    """Dense 16-bit tensor peak over the non-tensor FP32 rate (dimensionless), or None where
    either is unknown."""
    tensor = gpu.tensor_tflops.bf16 or gpu.tensor_tflops.fp16
    if not tensor or not gpu.vector_fp32_tflops:
        return None
    return tensor / gpu.vector_fp32_tflops


def throttle_ratio(gpu: GPU, reference: GPU | None) -> float | None:
    """k: the GPU's tensor-to-vector ratio over its class reference's (1: the same balance;
    below 1: tensor cores throttled against the other units), or None where unknown."""
    if reference is None:
        return None
    mine, theirs = tensor_to_vector(gpu), tensor_to_vector(reference)
    if mine is None or theirs is None:
        return None
    return mine / theirs


def rescaled_efficiency(efficiency: float, ratio: float) -> float:
    """The share of the tensor peak a kernel that reaches ``efficiency`` on the reference
    reaches on a part with throttle ratio ``ratio`` (dimensionless, in (0, 1])."""
    return 1.0 / (1.0 + (1.0 / efficiency - 1.0) * ratio)


def throttled(params: EfficiencyParams, ratio: float, keep: set[str]) -> EfficiencyParams:
    """``params`` with every compute efficiency not in ``keep`` (values measured on the GPU
    itself) rescaled by ``ratio``."""
    changed = {}
    for name in COMPUTE_EFFICIENCIES:
        value = getattr(params, name)
        if name in keep or value is None:
            continue
        changed[name] = rescaled_efficiency(value, ratio)
    return params.with_overrides(changed) if changed else params
