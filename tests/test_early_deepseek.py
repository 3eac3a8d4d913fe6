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
    assert eng.generation == (
        "V0 engine + first DeepSeek-V3/R1 MLA kernels + gpu_memory_utilization 0.9 + GGUF "
        "checkpoints loadable"
    )
    assert eng.params["step_overhead_us"] == 4000.0
    assert eng.graph_capture == "vllm-v0"


def test_explain_shows_the_floor_with_its_units():
    from typer.testing import CliRunner

    from capsim.cli.main import app

    args = ["explain", "--gpu", "h200", "--model", "deepseek-r1", "--quant", "fp8"]
    r = CliRunner().invoke(app, [*args, "--tp", "8", "--engine", "sglang@0.4.3", "--batch", "4"])
    assert r.exit_code == 0, r.output
    assert "MLA blocks' extra kernels" in r.output and "440 us x 61 layers" in r.output
    r = CliRunner().invoke(app, [*args, "--tp", "8", "--engine", "sglang", "--batch", "4"])
    # current stacks: the MLA block's extra kernels only, 0.75 of Hopper's 36 us floor
    assert r.exit_code == 0 and "27 us x 61 layers" in r.output, r.output


def dstack_level(scenario: str, level: int):
    """One level of dstack's 3,200-in / 800-out runs, simulated as validate does."""
    from capsim.calibration.compare import scenario_config
    from capsim.calibration.published import load_published
    from capsim.engine.simulate import predict

    datasets = {d.name: d for d in load_published()}
    ds = datasets["corpus-dstack-dsr1-h200-mi300x-3200in-800out"]
    sc = next(s for s in ds.scenarios if s.name == scenario)
    measured = {(p.concurrency, p.metric, p.statistic): p.value for p in sc.points}
    result = predict(scenario_config(ds, sc, [level]), CAT)
    return result.levels[0].metrics, measured


@pytest.mark.parametrize("level", [4, 16])
def test_dstacks_vllm_waves_are_prefilled_whole(level):
    """Equal prompts and outputs make a closed loop run in waves. vLLM V0 prefills a
    DeepSeek wave whole (no chunked prefill for MLA) and its clients see a step's tokens
    when the next step ends, so every request of a wave gets its first token together,
    as dstack's H200 run shows (C=4: mean 976 ms, median 975, standard deviation 11 ms):
    the simulated median is the mean within 5%, and both within 35% of the measured mean
    (-34..-41% when the wave was chunked and the first prompt seen alone)."""
    m, measured = dstack_level("h200-deepseek-r1-vllm-tp8", level)
    mean, p50 = m.ttft_ms.mean / 1e3, m.ttft_ms.p50 / 1e3
    assert p50 == pytest.approx(mean, rel=0.05)
    assert mean == pytest.approx(measured[(level, "ttft_s", "mean")], rel=0.35)


def test_the_early_rocm_stacks_prefill_as_sglang_measured_them():
    """SGLang PR 3237 (2025-02-24, ROCm, `sglang.bench_one_batch --batch-size 4 --input 2048
    --output 256 --model deepseek-ai/DeepSeek-V3 --tp 8`): "Decode.  median latency:
    0.03850 s" and "Total. latency: 10.656 s", so 4 x 2,048 prompt tokens took about
    10.656 - 255 x 0.0385 = 0.84 s. The early ROCm grouped-GEMM rate (2.6% of the FP8
    peak) gives both within 5%; the current rates prefill it in a third of that. dstack's
    MI300X waves then land within 50% on every level (-56..-80% before)."""
    gpu, m = CAT.gpu("mi300x"), CAT.model("deepseek-v3")
    prefill_measured = 10.656 - 255 * 0.0385
    for release, prefill_within in (("sglang@0.4.3", True), ("sglang", False)):
        eng = CAT.engine(release)
        dep = engine_deployment(eng, gpu, tp=8, quant="fp8", max_num_seqs=256)
        sm = build_step_model(CAT, gpu, m, dep, default_efficiency(gpu, CAT, eng))
        prefill = sm.step_time([2048] * 4, [0] * 4)
        assert (prefill == pytest.approx(prefill_measured, rel=0.05)) is prefill_within
        if release == "sglang@0.4.3":
            assert sm.step_time([1] * 4, [2048] * 4) == pytest.approx(0.0385, rel=0.05)
        else:
            assert prefill < prefill_measured / 2.5
    for scenario in ("mi300x-deepseek-r1-sglang-tp8", "mi300x-deepseek-r1-vllm-tp8"):
        level, measured = dstack_level(scenario, 16)
        assert level.ttft_ms.mean / 1e3 == pytest.approx(measured[(16, "ttft_s", "mean")], rel=0.5)


def test_why_dstacks_dp_attention_and_trtllm_runs_stay_reference_only():
    """The named causes (corpus-dstack-dsr1-h200-sglang-dpattn-trtllm-*'s reference_only):
    SGLang 0.4.3.post2's --enable-dp-attention set dp_size = tp_size; capsim simulates that
    deployment (8 attention ranks), but the release's first tokens came 5-10x later than
    any prefill the step model gives, even with all of a prompt's attention on one rank;
    TensorRT-LLM has no engine entry, and its client's concurrency column reads far above
    the level it was run at."""
    import numpy as np

    from capsim.calibration.compare import compare_dataset
    from capsim.calibration.published import load_published
    from capsim.physics.deployment import Deployment
    from capsim.physics.parameters import parameter_breakdown
    from capsim.physics.step import StepModel

    datasets = {d.name: d for d in load_published()}
    ds = datasets["corpus-dstack-dsr1-h200-sglang-dpattn-trtllm-3200in-800out"]
    assert ds.reference_only and "5-10x later" in ds.reference_only
    assert {sc.engine for sc in ds.scenarios} == {"sglang", "trt-llm"}
    assert "trt-llm" not in {e.name for e in CAT.engines}
    sglang = next(sc for sc in ds.scenarios if sc.engine == "sglang")
    assert sglang.dp == 8 and sglang.tp == 8 and sglang.flags["enable_dp_attention"]
    assert "dp_size = tp_size" in ds.workload.unknowns["sglang_dp_attention"].replace("self.", "")
    # one 3,200-token prefill step, ranks balanced, and its attention all on one rank
    gpu, eng = CAT.gpu("h200"), CAT.engine("sglang@0.4.3")
    dep = Deployment(tp=8, dp_attention=8, engine="sglang", eager_outside_graphs=True)
    sm = StepModel(
        gpu, CAT.model("deepseek-r1"), CAT.quant("fp8"), dep, default_efficiency(gpu, CAT, eng)
    )
    prompt, empty = np.array([3200.0]), np.array([0.0])
    balanced = sm._seconds(sm._even_sums(prompt, empty), 1, 0.0)
    # the step model puts the prompt's query-key pairs on its rank (_busiest_rank); its
    # attention projections, spread evenly there, would take 8x on one rank as well
    on_its_rank = sm.step_time([3200], [0])
    projections = 2 * parameter_breakdown(sm.model).attention * 3200 / 8
    one_rank = on_its_rank + 7 * projections / sm.dense_gemm_rate(3200)
    assert 0.1 < balanced < on_its_rank < one_rank < 0.5
    compared = [p for p in compare_dataset(ds, CAT) if p.scenario == sglang.name]
    ttft = {p.concurrency: p.measured for p in compared if p.metric == "ttft_s"}
    assert min(ttft[4], ttft[8]) > 5 * one_rank
    tpot = [p.predicted / p.measured - 1 for p in compared if p.metric == "tpot_s"]
    assert all(-0.37 < e < -0.07 for e in tpot)  # decode steps within -8..-35%
    trt = next(sc for sc in ds.scenarios if sc.engine == "trt-llm")
    column = [float(p.quote.split(",")[-1]) for p in trt.points if p.metric == "output_tok_s"]
    levels = [p.concurrency for p in trt.points if p.metric == "output_tok_s"]
    # a closed loop of C clients holds at most C requests: the column reads 111 at C=4
    assert all(c > level for c, level in zip(column, levels, strict=True))
    assert column[levels.index(4)] > 25 * 4
    for name in ("corpus-dstack-dsr1-h200-mi300x-3200in-800out",):
        assert datasets[name].reference_only is None  # the modelled stacks count


def test_early_fused_moe_calls_take_their_kernels_time():
    """vLLM PR 13932 (February 2025, H100) timed vLLM's Triton fused-MoE call at
    DeepSeek-V3's TP8 shapes at 1,732-1,989 us from 128 to 1,536 tokens: vLLM 0.7's read
    rates on Hopper (moe_bandwidth_efficiency 0.27, moe_compute_efficiency_8bit 0.045) give
    each within 12%, and the 2,048-token call (2,818.65 us), compute-bound, within 12%; the
    current kernels' (0.94), which SGLang 0.4.x keeps, take under half of that."""
    from capsim.physics.deployment import Deployment
    from capsim.physics.step import StepModel

    measured = {128: 1732.33, 256: 1728.73, 512: 1810.36, 1024: 1892.75, 1536: 1988.70}
    measured[2048] = 2818.65
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
        "mla_layer_floor_share 0; "
        "datacenter-hopper: moe_bandwidth_efficiency 0.27, moe_compute_efficiency_8bit 0.045; "
        "datacenter-cdna3: moe_compute_efficiency_8bit 0.026)" in text
    )
    assert (
        "sglang >=0.4.1,<0.4.5: first DeepSeek-V3/R1 kernels (mla_layer_overhead_us 440; "
        "mla_layer_floor_share 0; "
        "datacenter-cdna3: moe_compute_efficiency_8bit 0.026)" in text
    )
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
