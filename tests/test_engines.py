"""Serving engines as catalog data: their batch defaults, CUDA-graph schemes, micro-batches,
and the --engine flag."""

from __future__ import annotations

import json

import numpy as np
import pytest
from packaging.version import Version
from typer.testing import CliRunner

from capsim.catalog.loader import load_catalog
from capsim.cli.main import app
from capsim.engine.setup import engine_deployment, engine_fit_options
from capsim.physics.cuda_graphs import graph_sizes, sglang_capture_sizes
from capsim.physics.deployment import default_efficiency
from capsim.physics.memory import memory_fit
from capsim.physics.step import build_step_model

runner = CliRunner()
CAT = load_catalog()


def test_engines_listing_and_aliases():
    r = runner.invoke(app, ["engines", "--json"])
    assert r.exit_code == 0, r.output
    names = {e["name"] for e in json.loads(r.stdout)}
    assert {"vllm", "sglang", "llama.cpp"} <= names
    assert CAT.engine("sgl").name == "sglang"


@pytest.mark.parametrize(
    ("gpu", "tokens", "graph_batch"),
    [("rtx3090", 2048, 24), ("a100-40g", 4096, 32), ("h100-sxm", 8192, 256), ("b200", 16384, 512)],
)
def test_sglang_defaults_follow_its_memory_tiers(gpu, tokens, graph_batch):
    g = CAT.gpu(gpu)
    row = CAT.engine("sglang").batch_limits(g.name, g.memory_gb)
    assert (row.max_num_batched_tokens, row.cuda_graph_max_batch) == (tokens, graph_batch)


def test_vllm_defaults_unchanged_a100_keeps_the_small_budget():
    vllm = CAT.engine("vllm")
    h100, a100 = CAT.gpu("h100-sxm"), CAT.gpu("a100-80g")
    assert vllm.batch_limits(h100.name, h100.memory_gb).max_num_batched_tokens == 8192
    assert vllm.batch_limits(a100.name, a100.memory_gb).max_num_batched_tokens == 2048


def test_sglang_capture_list_by_hand():
    assert sglang_capture_sizes(24) == (1, 2, 4, 8, 12, 16, 24)
    sizes = sglang_capture_sizes(300)
    assert sizes[-3:] == (256, 272, 288)
    # with speculation (query length 3) every graph holds 3 tokens per sequence
    assert sglang_capture_sizes(8, decode_query_len=3) == tuple(3 * b for b in range(1, 9))


def test_llama_cpp_graphs_cover_one_sequence_only():
    assert graph_sizes("single-token", max_num_seqs=4) == (1,)
    assert graph_sizes("none", max_num_seqs=4) == ()


def _step_model(engine: str, gpu: str = "h100-sxm", model: str = "llama-3.1-8b"):
    eng, g, m = CAT.engine(engine), CAT.gpu(gpu), CAT.model(model)
    dep = engine_deployment(eng, g, tp=1, quant="bf16", max_num_seqs=64)
    return build_step_model(CAT, g, m, dep, default_efficiency(g, CAT, eng))


def test_llama_cpp_prefill_runs_in_ubatch_passes():
    sm = _step_model("llama.cpp")
    assert sm.passes(512) == 1 and sm.passes(513) == 2 and sm.passes(2048) == 4
    one = sm.step(np.array([512]), np.array([0]))
    four = sm.step(np.array([2048]), np.array([0]))
    # each 512-token pass reads the weights again
    assert four.weight_bytes == pytest.approx(4 * one.weight_bytes, rel=1e-9)
    vllm = _step_model("vllm").step(np.array([2048]), np.array([0]))
    assert vllm.weight_bytes == pytest.approx(one.weight_bytes, rel=1e-9)


def test_llama_cpp_sycl_runs_moe_prefill_at_its_per_expert_rate():
    """llama.cpp's SYCL backend on Arc (workstation-xe2) runs a prompt's routed experts one
    at a time: its expert GEMMs take the rate that reproduces an unpatched B70 build's
    Qwen3.6-35B-A3B pp2048 (688 t/s, llama.cpp PR 23142). Against the class default that
    slows a MoE prompt several-fold and leaves a decode token (memory-bound) almost alone;
    other engines keep the class's rate."""
    eng, g, m = CAT.engine("llama.cpp"), CAT.gpu("intel-arc-pro-b70"), CAT.model("qwen3.5-35b-a3b")
    llama = default_efficiency(g, CAT, eng)
    assert llama.moe_compute_efficiency == 0.011
    assert default_efficiency(g, CAT, CAT.engine("vllm")).moe_compute_efficiency is None
    dep = engine_deployment(eng, g, tp=1, quant="gguf-q4_k_m", max_num_seqs=4)
    sycl = build_step_model(CAT, g, m, dep, llama)
    default = build_step_model(CAT, g, m, dep, default_efficiency(g, CAT))
    prompt = [np.array([512]), np.array([0])]
    assert 5 < sycl.step(*prompt).t_total / default.step(*prompt).t_total < 12
    token = [np.array([1]), np.array([512])]
    assert sycl.step(*token).t_total / default.step(*token).t_total < 1.05


@pytest.mark.parametrize(
    ("model", "quant", "measured_tok_s"),
    [
        ("llama-3.1-8b", "fp16", 769.84),
        ("llama-3.1-8b", "gguf-q4_k_m", 693.32),
        ("llama-3.1-70b", "gguf-q4_k_m", 70.19),
    ],
)
def test_apple_class_reproduces_an_m3_max_llama_bench_prompt(model, quant, measured_tok_s):
    """The apple-silicon class's GEMM share (0.8) and weight-only factor (0.89) come from
    llama-bench pp512 on an M3 Max (40 GPU cores, half the M3 Ultra's, at 14.2 of its 28.4
    TFLOPS; build 2795, XiongjieDai's notebook): one 512-token prompt pass of Llama 3 8B in
    F16 and Q4_K_M, and of the 70B in Q4_K_M (the architecture of capsim's Llama 3.1), lands
    within 5% of the measured rate."""
    ultra = CAT.gpu("apple-m3-ultra")
    m3_max = ultra.model_copy(
        update={
            "name": "apple-m3-max",
            "memory_gb": 64,
            "memory_bandwidth_gb_s": 400,
            "tensor_tflops": ultra.tensor_tflops.model_copy(update={"fp16": 14.2}),
        }
    )
    eng = CAT.engine("llama.cpp")
    dep = engine_deployment(eng, m3_max, tp=1, quant=quant, max_num_seqs=1)
    sm = build_step_model(CAT, m3_max, CAT.model(model), dep, default_efficiency(m3_max, CAT, eng))
    seconds = sm.step(np.array([512]), np.array([0])).t_total
    assert 512 / seconds == pytest.approx(measured_tok_s, rel=0.05)


def test_llama_cpp_sycl_attention_slows_a_long_prompt_as_measured_on_a_b70():
    """llama.cpp's SYCL flash attention (vector units, March-June 2026 builds) runs at 2.5%
    of the B70's 16-bit rate: one 2,048-token micro-batch of Qwen3.5-27B Q4_K_M at depths 0,
    8,000, 16,000 and 32,000 lands within 12% of issue 21862's fa=1 rows (882.7, 595.4,
    414.3, 227.1 t/s), where the class rate left the prompt rate almost flat with depth;
    vLLM keeps the class rate."""
    eng, g, m = CAT.engine("llama.cpp"), CAT.gpu("intel-arc-pro-b70"), CAT.model("qwen3.5-27b")
    assert default_efficiency(g, CAT, eng).attention_compute_efficiency == 0.025
    assert default_efficiency(g, CAT, CAT.engine("vllm")).attention_compute_efficiency == 0.25
    dep = engine_deployment(eng, g, tp=1, quant="gguf-q4_k_m", max_num_seqs=1, ubatch_tokens=2048)
    sm = build_step_model(CAT, g, m, dep, default_efficiency(g, CAT, eng))
    for depth, measured in [(0, 882.7), (8000, 595.4), (16000, 414.3), (32000, 227.1)]:
        rate = 2048 / sm.step(np.array([2048]), np.array([depth])).t_total
        assert rate == pytest.approx(measured, rel=0.12), depth


@pytest.mark.parametrize(
    ("gpu", "quant", "share_2024", "measured_tok_s"),
    [("rtx3090", "gguf-q6_k", 0.20, 3596.13), ("rtx4090", "gguf-q5_0", 0.29, 10491.78)],
)
def test_llama_cpp_multiplies_gguf_weights_on_int8_tensor_cores_on_geforce(
    gpu, quant, share_2024, measured_tok_s
):
    """On GeForce Ampere and Ada llama.cpp's MMQ kernels run a GGUF model's dense GEMMs on
    int8 tensor cores (4x the FP16/FP32-accumulate rate there): at the shares fitted to
    llama.cpp PR 8062's June 2024 rows, a pp2048 of Llama 3 8B in 512-token passes lands
    within 5% of them; the 16-bit path it replaced (dequantise to FP16, cuBLAS with FP16
    accumulate, 2x the FP32-accumulate rate on GeForce) comes close at these sizes (PR 8075
    made MMQ the default; its users found cuBLAS faster only at large batches); today's
    default share (0.35, the scoreboard's builds of 2025-2026) is faster. vLLM on the same
    card keeps the 16-bit path; off the int8 path a routed expert's GEMM runs at the
    FP16-accumulate rate too."""
    eng, g = CAT.engine("llama.cpp"), CAT.gpu(gpu)
    dep = engine_deployment(eng, g, tp=1, quant=quant, max_num_seqs=1)
    params = default_efficiency(g, CAT, eng)
    assert params.weight_only_int8_gemm_efficiency == 0.35
    assert default_efficiency(g, CAT, CAT.engine("vllm")).weight_only_int8_gemm_efficiency is None
    sixteen = params.with_overrides({"weight_only_int8_gemm_efficiency": None})
    june_2024 = params.with_overrides({"weight_only_int8_gemm_efficiency": share_2024})

    def rate(p):
        sm = build_step_model(CAT, g, CAT.model("llama-3.1-8b"), dep, p)
        seconds = sum(sm.step(np.array([512]), np.array([c])).t_total for c in (0, 512, 1024, 1536))
        return 2048 / seconds, sm

    (int8, sm), (dequantised, sm16) = rate(june_2024), rate(sixteen)
    assert int8 == pytest.approx(measured_tok_s, rel=0.05)
    assert 0.8 < int8 / dequantised < 1.6
    assert rate(params)[0] > int8
    assert sm16.expert_gemm_rate(512, 8) == pytest.approx(2 * sm.expert_gemm_rate(512, 8))


def test_one_mmq_share_serves_geforce_ampere_ada_and_blackwell():
    """One share of the int8 peak (0.35) reads the CUDA scoreboard's pp512 of Llama 2 7B
    Q4_0 (llama.cpp discussion 15013) within 15% on every GeForce generation it holds, as
    validate predicts them (front end included); Blackwell, which had no int8 path, read
    them 58-61% slow on the 16-bit one."""
    from pathlib import Path

    from capsim.calibration.compare import compare_dataset
    from capsim.calibration.published import load_dataset

    root = Path(__file__).resolve().parents[1]
    ds = load_dataset(
        root / "calibration/published/corpus-llamacpp-cuda-disc15013-llama2-7b-q4_0-scoreboard.yaml"
    )
    geforce = {"rtx3090", "rtx3090ti", "rtx4090", "rtx4080", "rtx5090", "rtx5080", "rtx5070ti"}
    ds = ds.model_copy(update={"scenarios": [sc for sc in ds.scenarios if sc.gpu in geforce]})
    prompts = [p for p in compare_dataset(ds, CAT) if p.metric == "prompt_tok_s"]
    assert {p.gpu for p in prompts} == geforce
    for p in prompts:
        assert p.predicted == pytest.approx(p.measured, rel=0.15), p.gpu


def test_engine_defaults_reach_memory_fit():
    g = CAT.gpu("h100-sxm")
    opts = engine_fit_options(CAT.engine("sglang"), g, kv_dtype="auto")
    assert opts["gpu_memory_utilization"] == pytest.approx(0.88)
    opts = engine_fit_options(CAT.engine("sglang"), g, gpu_memory_utilization=0.5)
    assert opts["gpu_memory_utilization"] == 0.5
    assert opts["default_limits"] == (8192, 1024)


def test_unknown_engine_is_exit_2_with_suggestion():
    r = runner.invoke(
        app, ["predict", "--gpu", "rtx3090", "--model", "qwen3-8b", "--engine", "sglng"]
    )
    assert r.exit_code == 2
    assert "sglang" in r.stderr and "Traceback" not in r.output


def test_engine_changes_the_prediction():
    def run(engine, quant):
        r = runner.invoke(
            app,
            [
                *("predict", "--gpu", "rtx3090", "--model", "qwen3-8b", "--quant", quant),
                *("--concurrency", "4", "--requests", "24", "--engine", engine, "--json"),
            ],
        )
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["results"][0]

    # a 4-bit checkpoint in the format each engine loads (llama.cpp loads GGUF files only)
    vllm, llama = run("vllm", "awq-int4"), run("llama.cpp", "gguf-q4_k_m")
    assert llama["config"]["engine"] == "llama.cpp"
    assert vllm["points"][0]["output_tok_s"] != llama["points"][0]["output_tok_s"]


def test_sglang_caps_hybrid_batches_by_its_state_pool():
    g = CAT.gpu("h200")
    opts = engine_fit_options(CAT.engine("sglang"), g, kv_dtype="auto")
    # default launch: radix cache and overlap scheduler on -> extra_buffer, 3 + 2 slots
    assert opts["state_layout"] == "split" and opts["state_slots_per_sequence"] == 5
    assert opts["state_share"] == pytest.approx(0.9 / 1.9, abs=1e-4)
    # --disable-overlap-schedule (capsim --no-async-scheduling) -> no_buffer, 3 slots
    sync = engine_fit_options(CAT.engine("sglang"), g, async_scheduling=False, kv_dtype="auto")
    assert sync["state_slots_per_sequence"] == 3
    # an engine without the field keeps one count either way
    assert (
        engine_fit_options(CAT.engine("vllm"), g, async_scheduling=False)[
            "state_slots_per_sequence"
        ]
        == CAT.engine("vllm").state_pool.slots_per_sequence
    )
    # without prefix caching SGLang holds one slot per request
    off = engine_fit_options(CAT.engine("sglang"), g, prefix_caching=False, kv_dtype="auto")
    assert off["state_slots_per_sequence"] == 1
    off_sync = engine_fit_options(
        CAT.engine("sglang"), g, prefix_caching=False, async_scheduling=False
    )
    assert off_sync["state_slots_per_sequence"] == 1
    assert engine_fit_options(CAT.engine("vllm"), g)["state_layout"] == "shared"


def test_turning_sglangs_overlap_scheduler_off_raises_its_hybrid_state_cap():
    """--no-async-scheduling reaches the memory fit: SGLang then keeps 3 state slots a
    request instead of 5, so the same pool serves 5/3 as many (within a slot's rounding)."""
    from capsim.engine.config import PredictConfig
    from capsim.engine.setup import build_setup

    def cap(async_scheduling):
        config = PredictConfig(
            gpu="h200",
            model="qwen3.6-35b-a3b",
            engine="sglang",
            concurrency=[1],
            async_scheduling=async_scheduling,
        )
        return build_setup(config, CAT).fit.state_sequence_cap

    default, sync = cap(None), cap(False)
    assert sync == pytest.approx(default * 5 / 3, abs=2)


def test_hybrid_state_limits_the_running_batch_in_the_simulation():
    # a hybrid model at high concurrency: SGLang's state pool caps the batch, so the
    # decoding requests (output tok/s x TPOT) stay at or under the cap
    def run(engine):
        r = runner.invoke(
            app,
            [
                *("predict", "--gpu", "h200", "--model", "qwen3.6-35b-a3b", "--engine", engine),
                *("--concurrency", "512", "--requests", "1024", "--input-tokens", "4096"),
                *("--output-tokens", "256", "--json"),
            ],
        )
        assert r.exit_code == 0, r.output
        result = json.loads(r.stdout)["results"][0]
        return result["points"][0], result["notes"]

    sglang, notes = run("sglang")
    assert any("caps running requests" in n for n in notes)
    assert not any("caps running requests" in n for n in run("vllm")[1])
    fit = memory_fit(
        CAT.gpu("h200"),
        CAT.model("qwen3.6-35b-a3b"),
        CAT.quant("bf16"),
        **engine_fit_options(CAT.engine("sglang"), CAT.gpu("h200")),
    )
    decoding = sglang["output_tok_s"] * sglang["tpot_ms"]["mean"] / 1000
    assert decoding <= fit.state_sequence_cap * 1.02
    assert decoding > 0.5 * fit.state_sequence_cap


def test_a_lower_max_num_seqs_than_the_state_cap_is_what_binds():
    """With --max-num-seqs under SGLang's state-pool cap the flag sets the batch, and
    neither predict nor the fit says the pool does."""
    g, m, q = CAT.gpu("h200"), CAT.model("qwen3.6-35b-a3b"), CAT.quant("bf16")
    opts = engine_fit_options(CAT.engine("sglang"), g)
    assert memory_fit(g, m, q, **opts).state_caps_batch
    low = memory_fit(g, m, q, max_num_seqs=64, **opts)
    assert low.max_num_seqs == 64 and not low.state_caps_batch
    r = runner.invoke(
        app,
        [
            *("predict", "--gpu", "h200", "--model", "qwen3.6-35b-a3b", "--engine", "sglang"),
            *("--max-num-seqs", "64", "--concurrency", "512", "--requests", "600", "--json"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert not any(
        "caps running requests" in n for n in json.loads(r.stdout)["results"][0]["notes"]
    )


def _with_generations(engine, *generations):
    from capsim.catalog.engine_schema import EngineGeneration

    gens = [EngineGeneration.model_validate(g) for g in generations]
    return engine.model_copy(update={"generations": gens})


SOURCE = [{"title": "a test's own entry"}]


def test_a_release_takes_every_generation_whose_range_holds_it_in_order():
    """Generations lay over the newest release in the file's order: a narrow range inside a
    wide one (an early kernel stack inside V0's releases) adds its params to the wide
    one's and replaces the fields it sets."""
    base = CAT.engine("vllm")
    eng = _with_generations(
        base,
        {
            "versions": "<0.8",
            "label": "old",
            "async_scheduling": False,
            "graph_capture": "vllm-v0",
            "params": {"step_overhead_us": 3000.0},
            "rationale": "r",
            "sources": SOURCE,
        },
        {
            "versions": "<0.12",
            "label": "middle",
            "graph_capture": "vllm",
            "params": {"mla_layer_overhead_us": 100.0},
            "rationale": "r",
            "sources": SOURCE,
        },
    )
    dev = "0.7.4.dev181+gf35f8e22"  # a development build of a covered release
    old = eng.at_version(dev)
    assert (old.generation, old.async_scheduling, old.version) == ("old + middle", False, dev)
    assert old.params["step_overhead_us"] == 3000.0
    assert old.params["mla_layer_overhead_us"] == 100.0
    assert old.graph_capture == "vllm"  # the later generation's field wins
    # what no generation sets stays the newest release's
    assert old.batch_defaults == base.batch_defaults
    assert old.mixes_prefill_and_decode == base.mixes_prefill_and_decode
    middle = eng.at_version("0.10.1")
    assert (middle.generation, middle.async_scheduling) == ("middle", base.async_scheduling)
    assert "step_overhead_us" not in middle.params
    assert middle.params["mla_layer_overhead_us"] == 100.0
    newest = eng.at_version("0.24.0")
    assert newest.generation is None and newest.async_scheduling == base.async_scheduling
    assert "mla_layer_overhead_us" not in newest.params
    with pytest.raises(ValueError, match="not a release number"):
        eng.at_version("main")


def test_a_generation_range_must_be_a_version_specifier():
    from pydantic import ValidationError

    from capsim.catalog.engine_schema import EngineGeneration

    with pytest.raises(ValidationError, match="PEP 440"):
        EngineGeneration.model_validate(
            {"versions": "before 0.8", "label": "x", "rationale": "r", "sources": SOURCE}
        )


def test_engine_at_release_on_the_command_line():
    # every shipped generation is reachable, and a bad release is exit 2 with the form
    releases = ("0.1.0", "0.4.3", "0.5.1", "0.7.3", "0.8.5", "0.9.2", "0.10.1", "0.11.0")
    builds = ("b1000", "b2000", "b3000", "b4000", "b5000", "b6000", "b6500", "b8000")
    for engine in CAT.engines:
        counts_builds = engine.releases is not None and engine.releases.newest.startswith("b")
        for gen in engine.generations:
            version = next(
                v
                for v in (builds if counts_builds else releases)
                if gen.covers(Version(v.removeprefix("b")))
            )
            labels = CAT.engine(f"{engine.name}@{version}").generation.split(" + ")
            assert gen.label in labels
    predict = ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--concurrency", "1"]
    for engine, words in (
        ("vllm@", "names no release"),
        ("vlm@0.7.3", "vllm"),
        ("vllm@b6918", "not written as vllm's releases are"),
        ("llama.cpp@0.7.3", "e.g. llama.cpp@b"),
    ):
        r = runner.invoke(app, [*predict, "--engine", engine])
        assert r.exit_code == 2 and words in r.output, r.output


def _setup(engine: str, **config):
    from capsim.engine.config import PredictConfig
    from capsim.engine.setup import build_setup

    config = {"gpu": "h100-sxm", "model": "llama-3.1-8b", **config}
    cfg = PredictConfig(engine=engine, concurrency=[1], **config)
    return build_setup(cfg, CAT)


def test_vllm_v0_prefills_whole_prompts_apart_at_a_short_context():
    # vLLM V0 (0.7.3 config.py / arg_utils.py): chunked prefill only above 32,768 tokens of
    # max_model_len; below, prompts run whole in prefill-only steps under max(len, 2048)
    short = _setup("vllm@0.7.3", max_model_len=4096)
    assert not short.scheduler.mixes_prefill_and_decode
    assert (short.scheduler.max_num_batched_tokens, short.scheduler.max_num_seqs) == (4096, 256)
    tiny = _setup("vllm@0.7.3", max_model_len=1024)
    assert tiny.scheduler.max_num_batched_tokens == 2048
    long = _setup("vllm@0.7.3")  # Llama-3.1's 131,072-token context: chunked, 2048 a step
    assert long.scheduler.mixes_prefill_and_decode
    assert long.scheduler.max_num_batched_tokens == 2048
    # V0 captures decode batches 1, 2, 4, 8, ..., 256 only
    assert long.step_model.graph_sizes == (1, 2, 4, *range(8, 257, 8))
    # the newest release keeps chunked prefill at every length
    newest = _setup("vllm", max_model_len=4096)
    assert newest.scheduler.mixes_prefill_and_decode
    assert newest.scheduler.max_num_batched_tokens == 8192


def test_vllm_v0_never_chunks_an_mla_models_prompts():
    # 0.8.0's _set_default_args_v0: "Chunked prefill not supported for Multimodal or MLA in
    # V0"; PR 13620 set the budget to max_model_len (DeepSeek-R1's 163,840 tokens)
    v0 = _setup("vllm@0.7.4.dev181", gpu="h200", model="deepseek-r1", quant="fp8", tp=8)
    assert not v0.scheduler.mixes_prefill_and_decode
    assert v0.scheduler.max_num_batched_tokens == 163_840
    assert v0.scheduler.outputs_a_step_late
    # a dense model of the same release still chunks its long context
    assert _setup("vllm@0.7.3").scheduler.mixes_prefill_and_decode
    newest = _setup("vllm", gpu="h200", model="deepseek-r1", quant="fp8", tp=8)
    assert newest.scheduler.mixes_prefill_and_decode
    assert not newest.scheduler.outputs_a_step_late


def test_v0_hands_out_each_steps_tokens_when_the_next_step_ends():
    """One client, 10 output tokens: with async output processing (V0) the first token is
    seen when the first decode step ends and the last when the step after the tenth token's
    ends, so TTFT grows by one decode step and TPOT (the steps between) does not change;
    --enforce-eager turns the processing off."""
    from capsim.engine.levels import make_workload, simulate_level

    def one(engine, **flags):
        setup = _setup(engine, input_tokens="1024", output_tokens="10", requests=3, **flags)
        level = simulate_level(setup, make_workload(setup.config, 1), keep_records=True)
        first = level.records[1]  # a steady request: sent when the one before finished
        sm = setup.step_model
        prefill = sm.step_time([1024], [0])
        decode = sm.step_time([1], [1030])
        return first.first_token - first.send, first.finish - first.first_token, prefill, decode

    late_ttft, late_rest, prefill, decode = one("vllm@0.7.3")
    assert late_ttft - _frontend(prefill) == pytest.approx(prefill + decode, rel=0.02)
    assert late_rest == pytest.approx(9 * decode, rel=0.02)
    eager_ttft, eager_rest, eager_prefill, eager_decode = one("vllm@0.7.3", enforce_eager=True)
    assert eager_ttft - _frontend(eager_prefill) == pytest.approx(eager_prefill, rel=0.02)
    assert eager_rest == pytest.approx(9 * eager_decode, rel=0.02)


def _frontend(_prefill):
    """The front end's latency of a 1,024-token request (vLLM's defaults, s)."""
    sm = _setup("vllm@0.7.3").step_model
    return float(sm.frontend_seconds(1024))


@pytest.mark.parametrize(
    ("engine", "model", "per_layer"),
    [
        ("sglang", "llama-3.1-8b", "layer_overhead_eager_us"),
        ("sglang", "deepseek-r1", "layer_overhead_eager_mla_us"),
        ("vllm@0.7.3", "llama-3.1-8b", "layer_overhead_eager_us"),
        ("vllm", "llama-3.1-8b", "layer_overhead_compiled_us"),
        ("vllm", "deepseek-r1", "layer_overhead_compiled_us"),
    ],
)
def test_a_step_no_graph_holds_launches_as_its_engine_runs_it(engine, model, per_layer):
    # SGLang and vLLM V0 run a prefill op by op (no torch.compile by default); vLLM V1 runs
    # compiled code; an MLA layer launches far more kernels than a dense one
    big = dict(gpu="h200", model=model, tp=8) if model == "deepseek-r1" else {}
    sm = _setup(engine, **big).step_model
    p = sm.params
    launches = sm.allreduces_per_step * p.allreduce_eager_launch_us if sm.link else 0.0
    expected = sm.layers * getattr(p, per_layer) + launches
    assert sm.dispatch_seconds(4096) == pytest.approx(expected * 1e-6)
    assert sm.dispatch_seconds(1) == 0.0  # a decode step in a CUDA graph


def test_v0_graph_sizes_follow_max_num_seqs():
    assert graph_sizes("vllm-v0", max_num_seqs=20) == (1, 2, 4, 8, 16)
    assert graph_sizes("vllm-v0", max_num_seqs=3) == (1, 2)
    assert graph_sizes("vllm-v0", max_num_seqs=256, decode_query_len=2)[:3] == (2, 4, 8)


@pytest.mark.parametrize("batch", [1, 16, 128])
def test_before_async_scheduling_a_decode_step_pays_all_its_host_work(batch):
    # vLLM 0.8-0.13 (async scheduling off by default): the host work of a step adds to the
    # device's; from 0.14 the share async_host_overlap of it hides under the device step
    sync = _setup("vllm@0.10.1").step_model
    newest = _setup("vllm").step_model
    context = np.full(batch, 2048)
    t_sync = sync.decode_step(context)[0].t_total
    t_async = newest.decode_step(context)[0].t_total
    host = newest.host_seconds(batch)
    hidden = newest.params.async_host_overlap * host
    assert t_sync == pytest.approx(t_async + hidden, rel=1e-9)
    assert hidden == pytest.approx(0.8 * (400 + 12 * batch) * 1e-6)


def test_a_probed_servers_release_picks_its_generation(tmp_path):
    from pathlib import Path

    from capsim.calibration.compare import simulated_engine
    from capsim.calibration.published import dataset_from_run

    run = json.loads(
        Path("calibration/runs/waves-2026-11-28/cpu-vllm-tiny-qwen3-sweep.json").read_text()
    )
    run["header"]["server"]["version"] = {"version": "0.7.3"}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(run))
    (scenario,) = dataset_from_run(path).scenarios
    assert simulated_engine(scenario) == "vllm@0.7.3"
    run["header"]["server"]["version"] = {"version": "nightly"}
    path.write_text(json.dumps(run))
    (scenario,) = dataset_from_run(path).scenarios
    assert simulated_engine(scenario) == "vllm"


def test_sglang_releases_size_their_prefill_chunks_by_memory_as_their_server_args_did():
    """SGLang's chunked_prefill_size by release (server_args.py of the 0.4.6.post5, 0.5.2
    and 0.5.6 wheels): a B200 or an MI300X prefilled 8,192 tokens a batch in 0.4, 16,384
    from 0.5; a 40-60 GB card 8,192 until 0.5.2 and 4,096 from 0.5.3; a 24 GB card 2,048
    throughout; decode graphs to 256 on an H200 in 0.4.6, to 512 at TP 4 in 0.5.6."""
    from capsim.engine.setup import build_setup

    def limits(engine, gpu, model="llama-3.1-8b", tp=1):
        from capsim.engine.config import PredictConfig

        cfg = PredictConfig(engine=engine, gpu=gpu, model=model, tp=tp, concurrency=[1])
        s = build_setup(cfg, CAT)
        return s.scheduler.max_num_batched_tokens

    assert limits("sglang@0.4.6", "mi300x") == 8192
    assert limits("sglang@0.5.2", "mi300x") == 16384
    assert limits("sglang", "mi300x") == 16384
    assert limits("sglang@0.4.6", "a100-40g") == 8192
    assert limits("sglang@0.5.2", "a100-40g") == 8192
    assert limits("sglang@0.5.3", "a100-40g") == 4096
    assert limits("sglang@0.4.6", "rtx4090") == 2048
    assert limits("sglang", "rtx4090") == 2048
    h200_04 = CAT.engine("sglang@0.4.6").batch_limits("h200", 141)
    assert h200_04.cuda_graph_max_batch == 256
    assert CAT.engine("sglang").batch_limits("rtx4060ti-16g", 16).cuda_graph_max_batch == 8


def test_every_format_an_engine_names_is_in_the_catalog():
    # weight_only_formats and auto_formats are read as format names: a typo would
    # silently change nothing
    for engine in CAT.engines:
        for name in list(engine.weight_only_formats) + list(engine.auto_formats or []):
            assert CAT.quant(name).name == name, (engine.name, name)


def test_explain_says_where_the_engines_kernel_multiplies_a_format_in_16_bits():
    # vLLM's MXFP4 experts on a B200 (FP4 tensor cores there) run in BF16: explain says
    # so, SGLang's (MXFP4 x MXFP8) keeps no note, and on an H200 every engine dequantises
    base = ["explain", "--model", "gpt-oss-120b", "--gpu"]
    vllm = runner.invoke(app, [*base, "b200", "--engine", "vllm"])
    assert vllm.exit_code == 0 and "bf16 compute, the engine's kernel" in " ".join(
        vllm.output.split()
    ), vllm.output
    sglang = runner.invoke(app, [*base, "b200", "--engine", "sglang"])
    assert sglang.exit_code == 0 and "weight-only" not in sglang.output
    hopper = runner.invoke(app, [*base, "h200", "--engine", "sglang"])
    assert "mxfp4 runs weight-only (bf16 compute)" in " ".join(hopper.output.split())
