"""The first DeepSeek-V3/R1 kernel stacks (early 2025): a per-MLA-layer floor set by the
engine generations that ran them (issue 46: engine generations as data)."""

from __future__ import annotations

import pytest

from capsim.catalog.loader import load_catalog
from capsim.engine.setup import engine_deployment
from capsim.physics.deployment import default_efficiency
from capsim.physics.step import build_step_model

CAT = load_catalog()

# SGLang's published batch-1 decode of DeepSeek-V3/R1 at TP8 in those releases, tokens/s:
# PR 2643 (0.4.1.post2) 30.29; issue 3196 (8xH200, February 2025) "30-35", its middle 32.5;
# PR 4591 (March 2025) 30.56 with FlashMLA and 29.02 with FlashInfer MLA.
SGLANG_EARLY_BATCH1_TOK_S = (30.29, 32.5, 30.56, 29.02)


def step_model(
    engine: str,
    model: str = "deepseek-r1",
    quant: str = "fp8",
    tp: int = 8,
    **overrides: float,
):
    eng, gpu, m = CAT.engine(engine), CAT.gpu("h200"), CAT.model(model)
    dep = engine_deployment(eng, gpu, tp=tp, quant=quant, max_num_seqs=256)
    params = default_efficiency(gpu, CAT, eng).with_overrides(overrides)
    return build_step_model(CAT, gpu, m, dep, params)


def decode_s(sm, batch: int, context: int = 300) -> float:
    return sm.step_time([1] * batch, [context] * batch)


def test_the_floor_is_the_releases_batch_one_figures():
    """440 us a layer is the median published batch-1 token time less the current
    kernels' step: sglang@0.4.3 lands on it within 2%."""
    middle_two = sorted(SGLANG_EARLY_BATCH1_TOK_S)[1:3]
    median_s = 1.0 / (sum(middle_two) / 2)  # 30.4 tokens/s: 32.9 ms a token
    assert median_s == pytest.approx(0.0329, abs=0.0002)
    assert decode_s(step_model("sglang@0.4.3.post2"), 1) == pytest.approx(median_s, rel=0.02)
    # the current kernels decode the same step 5x faster
    assert decode_s(step_model("sglang"), 1) < median_s / 4


def test_the_floor_is_61_layers_times_440_us_on_deepseek_and_nothing_elsewhere():
    for batch in (1, 8, 64):
        floor = step_model("sglang", mla_layer_overhead_us=440.0)
        added = decode_s(floor, batch) - decode_s(step_model("sglang"), batch)
        assert added == pytest.approx(61 * 440e-6, rel=1e-9)
    # a model without MLA attention is untouched by the same releases
    dense_old = step_model("sglang@0.4.3", model="llama-3.1-8b", quant="bf16", tp=1)
    dense_new = step_model("sglang", model="llama-3.1-8b", quant="bf16", tp=1)
    assert decode_s(dense_old, 4) == pytest.approx(decode_s(dense_new, 4), rel=1e-12)


@pytest.mark.parametrize(
    ("release", "floor_us"),
    [
        ("vllm@0.7.0", 0.0),  # before MLA: DeepSeek ran as multi-head attention
        ("vllm@0.7.3", 440.0),
        ("vllm@0.7.4.dev181+gf35f8e22", 440.0),
        ("vllm@0.8.0", 0.0),
        ("vllm", 0.0),
        ("sglang@0.4.0", 0.0),
        ("sglang@0.4.1.post2", 440.0),
        ("sglang@0.4.4.post1", 440.0),
        ("sglang@0.4.5", 0.0),
        ("sglang", 0.0),
    ],
)
def test_the_releases_that_carry_the_floor(release, floor_us):
    eng = CAT.engine(release)
    assert eng.params.get("mla_layer_overhead_us", 0.0) == floor_us


def test_vllm_0_7_keeps_its_v0_host_loop_beside_the_floor():
    eng = CAT.engine("vllm@0.7.3")
    assert eng.generation == "V0 engine + first DeepSeek-V3/R1 MLA kernels"
    assert eng.params["step_overhead_us"] == 4000.0
    assert eng.graph_capture == "vllm-v0"


def test_explain_shows_the_floor_with_its_units():
    from typer.testing import CliRunner

    from capsim.cli.main import app

    args = ["explain", "--gpu", "h200", "--model", "deepseek-r1", "--quant", "fp8"]
    r = CliRunner().invoke(app, [*args, "--tp", "8", "--engine", "sglang@0.4.3", "--batch", "4"])
    assert r.exit_code == 0, r.output
    assert "early MLA kernel stack" in r.output and "440 us x 61 layers" in r.output
    r = CliRunner().invoke(app, [*args, "--tp", "8", "--engine", "sglang", "--batch", "4"])
    assert r.exit_code == 0 and "early MLA kernel stack" not in r.output


def test_why_dstacks_early_runs_stay_reference_only():
    """The named cause (corpus-dstack-*'s reference_only): at C=4 a 3,200-token prompt's
    first token came at 800-3,300 prompt tokens/s on every stack, and at C=128 prompts went
    in at 2,900-3,700 tokens/s (output tokens/s x 3,200 / 800), where the step model, early
    floor and MoE rate included, prefills the same prompt at 16,000-26,000 tokens/s. Decode
    is modelled; this is not, and closed-loop throughput at high C follows the prompts' wait."""
    from capsim.calibration.compare import simulated_engine
    from capsim.calibration.published import load_published

    datasets = {d.name: d for d in load_published()}
    ds = datasets["corpus-dstack-dsr1-h200-mi300x-3200in-800out"]
    assert ds.reference_only and "prefill" in ds.reference_only
    for sc in ds.scenarios:
        eng, gpu, m = CAT.engine(simulated_engine(sc)), CAT.gpu(sc.gpu), CAT.model(sc.model)
        dep = engine_deployment(eng, gpu, tp=sc.tp, quant=sc.quant, max_num_seqs=256)
        sm = build_step_model(CAT, gpu, m, dep, default_efficiency(gpu, CAT, eng))
        modelled = 3200 / sm.step_time([3200], [0])
        at = {(p.concurrency, p.metric, p.statistic): p.value for p in sc.points}
        first_token = 3200 / at[(4, "ttft_s", "mean")]
        out_128 = [p.value for p in sc.points if (p.concurrency, p.metric) == (128, "output_tok_s")]
        intake = 4 * out_128[0]  # prompt tokens/s: 3,200 in for every 800 out
        assert modelled > 15_000, sc.name
        assert first_token < modelled / 4 and intake < modelled / 4, sc.name


def test_early_fused_moe_calls_take_their_kernels_time():
    """vLLM PR 13932 (February 2025, H100) timed vLLM's Triton fused-MoE call at
    DeepSeek-V3's TP8 shapes at 1,732-1,989 us from 128 to 1,536 tokens: vLLM 0.7's read
    rate on Hopper (moe_bandwidth_efficiency 0.24) gives each within 12%; the current
    kernels' (0.94), which SGLang 0.4.x keeps, take under half of that."""
    from capsim.physics.deployment import Deployment
    from capsim.physics.step import StepModel

    measured = {128: 1732.33, 256: 1728.73, 512: 1810.36, 1024: 1892.75, 1536: 1988.70}
    gpu = CAT.gpu("h100-sxm")
    predicted = {}
    for release in ("vllm@0.7.3", "sglang@0.4.3", "vllm"):
        params = default_efficiency(gpu, CAT, CAT.engine(release))
        sm = StepModel(gpu, CAT.model("deepseek-r1"), CAT.quant("fp8"), Deployment(tp=8), params)
        predicted[release] = {b: sm.fused_moe_seconds(b) * 1e6 for b in measured}
    for b, us in measured.items():
        assert predicted["vllm@0.7.3"][b] == pytest.approx(us, rel=0.12), b
        assert predicted["sglang@0.4.3"][b] == predicted["vllm"][b] < us / 2


def test_the_8bit_moe_rate_applies_to_w8a8_experts_only():
    from capsim.physics.deployment import Deployment
    from capsim.physics.step import StepModel

    gpu = CAT.gpu("h100-sxm")
    params = default_efficiency(gpu, CAT).with_overrides({"moe_compute_efficiency_8bit": 0.05})
    rates = {}
    for model, quant in (
        ("deepseek-r1", "fp8"),
        ("qwen3-30b-a3b", "bf16"),
        ("qwen3-30b-a3b", "awq-int4"),
    ):
        sm = StepModel(
            gpu,
            CAT.model(model),
            CAT.quant(quant),
            Deployment(tp=8 if model == "deepseek-r1" else 1),
            params,
        )
        rates[quant] = sm.moe_gemm_rate
    assert rates["fp8"] == pytest.approx(gpu.tensor_tflops.fp8 * 1e12 * 0.05)
    sixteen = gpu.tensor_tflops.bf16 * 1e12 * params.moe_compute_efficiency
    assert rates["bf16"] == pytest.approx(sixteen)
    assert rates["awq-int4"] == pytest.approx(sixteen * params.weight_only_compute_factor)


def test_capsim_engines_says_what_each_older_release_changes():
    from typer.testing import CliRunner

    from capsim.cli.main import app

    r = CliRunner().invoke(app, ["engines"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert (
        "vllm >=0.7.1,<0.8: first DeepSeek-V3/R1 MLA kernels (mla_layer_overhead_us 440; "
        "datacenter-hopper: moe_bandwidth_efficiency 0.24)" in text
    )
    assert "sglang >=0.4.1,<0.4.5: first DeepSeek-V3/R1 kernels (mla_layer_overhead_us 440)" in text
    assert "vllm <0.8: V0 engine (batch_defaults 2048/256;" in text
    assert "a release takes every range that holds it" in text


def test_an_unset_moe_rate_fits_from_the_rate_it_stands_for():
    """A fit of moe_compute_efficiency_8bit (or moe_compute_efficiency) on a class that
    leaves it unset starts from the figure the step model uses in its place."""
    from capsim.calibration.least_squares import prior_value
    from capsim.physics.efficiency import EfficiencyParams

    generic = EfficiencyParams()
    assert generic.moe_compute_efficiency is None and generic.moe_compute_efficiency_8bit is None
    assert prior_value(generic, "moe_compute_efficiency_8bit") == generic.compute_efficiency
    hopper = default_efficiency(CAT.gpu("h200"), CAT)
    assert prior_value(hopper, "moe_compute_efficiency_8bit") == hopper.moe_compute_efficiency
