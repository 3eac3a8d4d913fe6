"""llama.cpp's FP16 GEMMs accumulate in FP16 (cuBLAS COMPUTE_16F), which GeForce cards run
at twice the FP16-with-FP32-accumulate rate the catalog records (fp16_accumulate_speedup)."""

from __future__ import annotations

import pytest

from capsim.catalog.loader import load_catalog
from capsim.physics.deployment import Deployment, default_efficiency
from capsim.physics.step import StepModel

CAT = load_catalog()


def step_model(gpu: str, quant: str, engine: str) -> StepModel:
    g = CAT.gpu(gpu)
    params = default_efficiency(g, CAT, CAT.engine(engine))
    dep = Deployment(tp=1, engine=engine)
    return StepModel(g, CAT.model("llama-3.1-8b"), CAT.quant(quant), dep, params)


def test_geforce_fp16_gemms_run_at_the_fp16_accumulate_rate_under_llama_cpp():
    llama = step_model("rtx3090", "fp16", "llama.cpp")
    vllm = step_model("rtx3090", "fp16", "vllm")
    # the RTX 3090's 71 dense TFLOPS with FP32 accumulate, 142 with FP16 accumulate
    assert vllm.gemm_peak == pytest.approx(71e12)
    assert llama.gemm_peak == pytest.approx(142e12)
    assert llama.fp16_accumulate_speedup == 2.0


@pytest.mark.parametrize(
    ("gpu", "quant"),
    [
        ("rtx3090", "bf16"),  # cuBLAS accumulates BF16 in FP32
        ("rtx-a6000", "fp16"),  # a workstation card: one rate for both
        ("a100-80g", "fp16"),  # a data-centre card
    ],
)
def test_no_speedup_where_the_gemm_accumulates_in_fp32_or_the_rates_are_equal(gpu, quant):
    sm = step_model(gpu, quant, "llama.cpp")
    assert sm.fp16_accumulate_speedup == 1.0
    peak = getattr(CAT.gpu(gpu).tensor_tflops, sm.compute_dtype)
    assert sm.gemm_peak == pytest.approx(
        peak * 1e12 * (sm.params.weight_only_compute_factor if not sm.native else 1.0)
    )


def test_a_quantised_gguf_keeps_the_int8_path_and_decode_does_not_move():
    q4 = step_model("rtx3090", "gguf-q4_k_m", "llama.cpp")
    assert q4.fp16_accumulate_speedup == 1.0
    assert q4.int8_gemm_rate is not None
    # batch-1 decode is memory-bound: the faster GEMM peak does not change it
    fp16 = step_model("rtx3090", "fp16", "llama.cpp")
    slow = step_model("rtx3090", "fp16", "vllm")
    assert fp16.step([1], [1024]).t_total == pytest.approx(slow.step([1], [1024]).t_total, rel=0.05)
    # a 512-token prompt pass is compute-bound: about twice as fast
    ratio = slow.step([512], [0]).t_total / fp16.step([512], [0]).t_total
    assert 1.5 < ratio < 2.0


def test_llama_cpp_builds_are_release_numbers_and_before_int8_mmq_take_the_fp16_path():
    """llama-bench prints its build as 'b2824 (4426e298)': read as release 2824. Builds
    before int8 MMQ was the default (PR 8075, June 2024) dequantised a quantised model's
    prompt weights to FP16 for cuBLAS; later ones multiply them on int8 tensor cores."""
    from capsim.catalog.engine_schema import parse_engine_version

    assert str(parse_engine_version("b2824 (4426e298)")) == "2824"
    assert str(parse_engine_version("b6918")) == "6918"
    assert parse_engine_version("PR #13506 branch") is None
    g = CAT.gpu("rtx3090")
    old = default_efficiency(g, CAT, CAT.engine("llama.cpp@b2824 (4426e298)"))
    new = default_efficiency(g, CAT, CAT.engine("llama.cpp@b6918"))
    assert old.weight_only_int8_gemm_efficiency is None
    assert new.weight_only_int8_gemm_efficiency == 0.35
    dep = Deployment(tp=1, engine="llama.cpp")
    sm = StepModel(g, CAT.model("llama-3.1-8b"), CAT.quant("gguf-q4_k_m"), dep, old)
    # the bf16 peak (71) x FP16 accumulate (2) x the GGUF weight-only factor
    assert sm.int8_gemm_rate is None
    assert sm.gemm_peak == pytest.approx(71e12 * 2 * old.weight_only_compute_factor)
    # a later build and another class are untouched
    apple = default_efficiency(CAT.gpu("apple-m2-max"), CAT, CAT.engine("llama.cpp@b1550"))
    assert apple == default_efficiency(CAT.gpu("apple-m2-max"), CAT, CAT.engine("llama.cpp"))
