"""The capsim command: JSON listings, fit, and error paths (exit 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from capsim.cli.main import app

runner = CliRunner()


def invoke(*args: str, env: dict | None = None):
    return runner.invoke(app, list(args), env=env)


def test_gpus_json_lists_at_least_15_with_sources():
    r = invoke("gpus", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert len(data) >= 15
    assert all(entry["sources"] for entry in data)


def test_models_json_lists_at_least_13_with_sources_and_counts():
    r = invoke("models", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert len(data) >= 13
    assert all(entry["sources"] for entry in data)
    by_name = {m["name"]: m for m in data}
    assert by_name["qwen3-coder-30b-a3b"]["active_params"] / 1e9 == pytest.approx(3.35, rel=0.01)


def test_show_commands():
    r = invoke("gpus", "show", "rtx3090", "--json")
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert data["memory_bandwidth_gb_s"] == 936
    assert data["derived"]["ridge_flop_per_byte_bf16"] == pytest.approx(71e12 / 936e9)
    r = invoke("models", "show", "deepseek-v3", "--json")
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert data["derived"]["kv_auto"]["bytes_per_token"] == 70272
    assert invoke("models", "show", "qwen3.5-27b").exit_code == 0

    # the 2026 architectures' own terms are shown, each with its figure (cells may wrap)
    def shown(name: str) -> str:
        return " ".join(invoke("models", "show", name).stdout.replace("│", " ").split())

    e2b = shown("gemma-4-e2b")
    assert "the last 20 (no cache of their own)" in e2b
    assert "per-layer embeddings 2.35 B" in e2b and "with 0.45 B of encoders" in e2b
    super_ = shown("nemotron-3-super-120b-a12b")
    assert "40 mamba, 40 moe" in super_ and "on a 1024 latent" in super_
    assert invoke("gpus", "show", "b70").exit_code == 0
    assert invoke("quants", "--json").exit_code == 0


def test_fit_acceptance_cases():
    r = invoke(
        "fit", "--gpu", "rtx3090", "--model", "qwen3-coder-30b-a3b", "--quant", "awq-int4", "--json"
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["fits"] and data["kv_capacity_tokens"] > 0
    r = invoke("fit", "--gpu", "rtx3090", "--model", "llama-3.3-70b", "--quant", "bf16")
    assert r.exit_code == 2
    assert "141.1 GB" in r.stderr and "24 GiB" in r.stderr
    assert "Traceback" not in r.output + r.stderr


def test_fit_with_gpus_and_tp():
    r = invoke(
        "fit",
        "--gpu",
        "rtx3090",
        "--model",
        "qwen3.5-27b",
        "--quant",
        "awq-int4",
        "--gpus",
        "4",
        "--tp",
        "4",
        "--kv-dtype",
        "fp8",
        "--json",
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["tp"] == 4
    r = invoke("fit", "--gpu", "rtx3090", "--model", "qwen3-8b", "--gpus", "3", "--tp", "2")
    assert r.exit_code == 2 and "multiple" in r.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("fit", "--gpu", "rtx309", "--model", "qwen3-8b"), "did you mean: rtx3090"),
        (("fit", "--gpu", "rtx3090", "--model", "qwen3-8", "--quant", "awq"), "did you mean"),
        (("fit", "--gpu", "rtx3090", "--model", "qwen3-8b", "--quant", "awq5"), "unknown quant"),
        (("fit", "--gpu", "rtx3090", "--model", "qwen3-8b", "--tp", "3"), "does not divide"),
        (("fit", "--gpu", "rtx3090", "--model", "qwen3-8b", "--kv-dtype", "int2"), "KV cache"),
        (
            ("fit", "--gpu", "rtx3090", "--model", "qwen3-8b", "--gpu-memory-utilization", "2"),
            "--gpu-memory-utilization 2.0: input should be less than or equal to 1",
        ),
        (("gpus", "show", "h1000"), "unknown gpu"),
        (
            (
                "predict",
                "--gpu",
                "rtx3090",
                "--model",
                "qwen3-8b",
                "--spec",
                "mtp:2",
                "--spec-acceptance",
                "1.5",
            ),
            "--spec-acceptance '1.5': rates from 0 to 1",
        ),
        (
            ("predict", "--gpu", "rtx3090", "--model", "qwen3-8b", "--spec-acceptance", "0.7"),
            "--spec-acceptance needs --spec",
        ),
        (
            ("explain", "--gpu", "h100-sxm", "--model", "qwen3-8b", "--power-limit", "100"),
            "outside the range h100-sxm can be set to: 200.0-700.0 W",
        ),
        (
            ("explain", "--gpu", "rtx3090", "--model", "qwen3-8b", "--power-limit", "50"),
            "below 25% of rtx3090's TDP",
        ),
        (("predict", "--gpu", "rtx3090", "--model", "qwen3-8b", "--output-tokens", "0"), ">= 1"),
        (("models", "show", "llama-4"), "unknown model"),
    ],
)
def test_user_errors_exit_2_without_traceback(args, expected):
    r = invoke(*args)
    assert r.exit_code == 2, r.output
    assert expected in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_db_option_and_env_overlay(tmp_path):
    gpu = json.loads(invoke("gpus", "show", "rtx3090", "--json").stdout)
    gpu.pop("derived")
    gpu.update(name="lab-card", aliases=[], memory_gb=48)
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "lab-card.yaml").write_text(yaml.safe_dump(gpu))
    r = invoke("--db", str(tmp_path), "fit", "--gpu", "lab-card", "--model", "qwen3-8b", "--json")
    assert r.exit_code == 0, r.output
    r = invoke("fit", "--gpu", "lab-card", "--model", "qwen3-8b", "--db", str(tmp_path), "--json")
    assert r.exit_code == 0, r.output
    r = invoke("gpus", "show", "lab-card", env={"CAPSIM_DB": str(tmp_path)})
    assert r.exit_code == 0, r.output
    r = invoke("gpus", "--db", str(tmp_path / "missing"))
    assert r.exit_code == 2 and "does not exist" in r.stderr


def test_console_script_runs_as_a_process():
    out = subprocess.run(
        [sys.executable, "-m", "capsim.cli.main", "fit", "--gpu", "nope", "--model", "qwen3-8b"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2
    assert "unknown gpu 'nope'" in out.stderr
    assert "Traceback" not in out.stderr


def test_explain_json_breakdown():
    r = invoke(
        "explain",
        "--gpu",
        "rtx3090",
        "--model",
        "qwen3-coder-30b-a3b",
        "--quant",
        "awq-int4",
        "--batch",
        "4",
        "--context",
        "2048",
        "--json",
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    decode, prefill = data["decode"], data["prefill"]
    assert decode["bound"] == "memory" and prefill["bound"] == "compute"
    assert decode["experts_touched_per_layer"] == pytest.approx(29.1, abs=0.1)
    assert decode["t_total"] > 0 and prefill["tokens"] == 2048
    assert data["ridge_flop_per_byte"] == pytest.approx(71e12 / 936e9)
    assert invoke("explain", "--gpu", "rtx3090", "--model", "qwen3-coder-30b-a3b").exit_code == 0


def test_explain_costs_a_prefill_chunk_after_tokens_already_in_kv():
    """--prefill-context puts the chunk behind tokens already in KV (a later chunk of a long
    prompt, llama-bench's -d): the chunk attends to them, so its attention FLOPs grow and
    its rate falls; at a B70's 16,000-token depth the SYCL figure of issue 21862's fit."""

    def prefill(depth: int) -> dict:
        r = invoke(
            "explain", "--gpu", "intel-arc-pro-b70", "--model", "qwen3.5-27b",
            "--quant", "gguf-q4_k_m", "--engine", "llama.cpp", "--ubatch-size", "2048",
            "--prefill-chunk", "2048", "--prefill-context", str(depth), "--json",
        )  # fmt: skip
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["prefill"]

    start, deep = prefill(0), prefill(16000)
    assert start["context_tokens"] == 0 and deep["context_tokens"] == 16000
    assert deep["attention_flops"] > 5 * start["attention_flops"]
    assert deep["prefill_tok_s"] == pytest.approx(387.6, rel=0.01)
    assert start["prefill_tok_s"] > 2 * deep["prefill_tok_s"]
    for value in ("-3", "abc", "999999999999"):
        bad = invoke(
            "explain", "--gpu", "rtx3090", "--model", "qwen3-8b", "--prefill-context", value
        )
        assert bad.exit_code == 2 and "--prefill-context" in bad.output, value
        assert "Traceback" not in bad.output


def test_explain_refuses_a_context_past_the_model_and_warns_of_a_batch_past_the_cache():
    """--context must leave room for the decode's new token in the model's positions
    (exit 2 with the range); a decode batch whose KV exceeds what fits is costed but
    warned of (table and JSON ``kv_note``), with how many such sequences a server runs.
    Qwen3-8B on an RTX 3090 in BF16: 40,960 positions, 37,216 tokens of KV (vLLM's 0.92 of
    24 GiB less the weights and activations, in pages of 16)."""
    base = ("explain", "--gpu", "rtx3090", "--model", "qwen3-8b")
    for value in ("40960", "10000000", "-1", "2k"):
        bad = invoke(*base, "--context", value)
        assert bad.exit_code == 2 and "--context" in bad.output, value
        assert "Traceback" not in bad.output
    assert "0 to 40,959" in invoke(*base, "--context", "40960").output
    fine = json.loads(invoke(*base, "--batch", "4", "--context", "8000", "--json").stdout)
    assert fine["kv_note"] is None
    full = json.loads(invoke(*base, "--batch", "8", "--context", "8000", "--json").stdout)
    assert "64,008 tokens of KV cache and 37,216 fit" in full["kv_note"]
    assert "at most 4 of them" in full["kv_note"]
    table = invoke(*base, "--batch", "8", "--context", "8000")
    assert table.exit_code == 0 and "warning:" in table.output and "at most 4" in table.output
    # a hybrid's recurrent state takes pages of the same pool: the memory fit's count (11
    # sequences of 8,001 tokens of Qwen3.5-9B), not the tokens alone, sets the limit
    hybrid = ("explain", "--gpu", "rtx3090", "--model", "qwen3.5-9b", "--context", "8000")
    at_limit = json.loads(invoke(*hybrid, "--batch", "11", "--json").stdout)
    assert at_limit["kv_note"] is None
    over = json.loads(invoke(*hybrid, "--batch", "12", "--json").stdout)["kv_note"]
    assert "at most 11 of them" in over and "more KV cache than 1x rtx3090 holds" in over


def test_explain_shows_the_grouped_expert_gemm_rate():
    """The routed experts' grouped-GEMM rate is a row of explain (Hopper: 0.33 of the FP8
    peak, 0.33 x 1,979 = 653 TFLOPS) and a field of its JSON; a dense model has no row."""
    base = ("explain", "--gpu", "h100-sxm", "--model", "qwen3-30b-a3b", "--quant", "fp8")
    r = invoke(*base, "--prefill-chunk", "4096")
    assert r.exit_code == 0, r.output
    assert "routed experts' grouped GEMMs" in r.stdout and "653 TFLOPS" in r.stdout
    prefill = json.loads(invoke(*base, "--json").stdout)["prefill"]
    assert prefill["expert_gemm_flops_per_s"] == pytest.approx(0.33 * 1979e12, rel=1e-3)
    dense = invoke("explain", "--gpu", "h100-sxm", "--model", "qwen3-8b")
    assert dense.exit_code == 0 and "grouped GEMMs" not in dense.stdout


def test_explain_shows_the_gated_deltanet_prefill_rate():
    """A hybrid model's chunked Gated DeltaNet prefill rate and serial chunk walk are a
    row of explain (Hopper: 0.063 of the 989.5 BF16 TFLOPS = 62.3, and 18.2 ns a token and
    layer) and fields of its JSON, beside the state stream's rate (the H200's own measured
    0.62 of its 4,800 GB/s, over the class's 0.745); a decode step has no chunked tokens,
    and a model without GDN layers no row."""
    base = ("explain", "--gpu", "h200", "--model", "qwen3.6-35b-a3b", "--quant", "bf16")
    r = invoke(*base, "--prefill-chunk", "8192")
    assert r.exit_code == 0, r.output
    assert "Gated DeltaNet chunked prefill" in r.stdout and "62.3 TFLOPS" in r.stdout
    assert "18.2 ns/token/layer" in r.stdout and "at 2,976 GB/s" in r.stdout
    data = json.loads(invoke(*base, "--prefill-chunk", "8192", "--json").stdout)
    assert data["prefill"]["gdn_prefill_flops_per_s"] == pytest.approx(0.063 * 989.5e12)
    assert data["prefill"]["gdn_prefill_token_seconds"] == pytest.approx(18.2e-9)
    assert data["decode"]["state_bytes_per_s"] == pytest.approx(0.62 * 4800e9)
    assert data["prefill"]["gdn_chunked_tokens"] == 8191
    assert data["decode"]["gdn_chunked_tokens"] == 0
    dense = invoke("explain", "--gpu", "h200", "--model", "qwen3-8b", "--prefill-chunk", "8192")
    assert dense.exit_code == 0 and "Gated DeltaNet" not in dense.stdout


def test_explain_shows_the_elementwise_kernels_bytes_and_time():
    """The elementwise kernels' activation traffic and time are a row of explain and fields
    of its JSON: llama-3.1-8b at TP=1 moves 5,636,096 bytes a token (tests/test_elementwise.py),
    so a 4,096-token prefill chunk moves 23.09 GB at 0.45 of an H100's 3,350 GB/s."""
    base = ("explain", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--quant", "bf16")
    r = invoke(*base, "--prefill-chunk", "4096")
    assert r.exit_code == 0, r.output
    assert "elementwise kernels (norms, activation)" in r.stdout
    prefill = json.loads(invoke(*base, "--prefill-chunk", "4096", "--json").stdout)["prefill"]
    assert prefill["activation_bytes"] == pytest.approx(4096 * 5_636_096)
    assert prefill["t_elementwise"] == pytest.approx(4096 * 5_636_096 / (3350e9 * 0.45))


def test_explain_picks_the_format_predict_would_and_warns_when_nothing_fits():
    """Without --quant, explain runs the format predict would pick (AWQ for a 32B dense
    model on one 24 GB card); an explicit format that does not fit is explained anyway,
    with a warning saying what it needs and what the GPU has."""
    base = ("explain", "--gpu", "rtx3090", "--model", "qwen2.5-coder-32b")
    data = json.loads(invoke(*base, "--json").stdout)
    assert data["quant"] == "awq-int4" and data["fits"] and data["fit_note"] is None
    assert "bf16) does not fit" in data["quant_reason"]
    r = invoke(*base, "--quant", "bf16", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["quant"] == "bf16" and not data["fits"]
    assert "65.5 GB" in data["fit_note"] and "24 GiB" in data["fit_note"]
    r = invoke(*base, "--quant", "bf16")
    assert r.exit_code == 0 and "warning: does not fit" in " ".join(r.stdout.split())


def test_explain_with_speculation_and_power():
    r = invoke(
        "explain",
        "--gpu",
        "rtx3090",
        "--model",
        "qwen3.5-27b",
        "--quant",
        "awq-int4",
        "--tp",
        "4",
        "--kv-dtype",
        "fp8",
        "--spec",
        "mtp:2",
        "--spec-acceptance",
        "0.8,0.6",
        "--power-limit",
        "250",
        "--json",
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["decode"]["tokens_per_sequence"] == pytest.approx(2.4)
    assert data["decode"]["t_draft"] > 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--spec", "mtp:x"), "cannot read --spec"),
        (("--spec", "mtp:2", "--spec-acceptance", "high"), "--spec-acceptance"),
        (("--spec", "mtp:2", "--spec-acceptance", "0.5,0.6,0.7"), "per-position"),
        (("--interconnect", "nvlink", "--tp", "2", "--gpu", "rtx4090"), "no nvlink"),
        (("--batch", "0"), "--batch"),
    ],
)
def test_explain_errors(args, expected):
    base = {"--gpu": "rtx3090", "--model": "qwen3.5-27b", "--quant": "awq-int4"}
    given = dict(zip(args[::2], args[1::2], strict=True))
    merged = {**base, **given}
    flat = [x for kv in merged.items() for x in kv]
    r = invoke("explain", *flat)
    assert r.exit_code == 2, r.output
    assert expected in r.stderr


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("layer_overhed_eager_us=400", "did you mean: layer_overhead_eager_us"),
        ("bandwidth_efficiency", "NAME=VALUE"),
        ("bandwidth_efficiency=fast", "needs a number"),
        ("bandwidth_efficiency=1.5", "less than or equal to 1"),
        ("step_overhead_us=-1", "greater than or equal to 0"),
    ],
)
def test_set_errors_exit_2(value, expected):
    for command in (
        ("predict", "--gpu", "rtx3090", "--model", "qwen3-8b", "-c", "1"),
        ("explain", "--gpu", "rtx3090", "--model", "qwen3-8b"),
        ("validate",),
    ):
        r = invoke(*command, "--set", value)
        assert r.exit_code == 2, r.output
        assert expected in r.stderr and "Traceback" not in r.stderr + r.stdout


def test_set_overrides_reach_explain_predict_and_validate():
    """--set lays one efficiency parameter over the defaults (and any profile): a dense
    32B model in eager mode on one 3090 at batch 1 is launch-bound at the prior (64 layers
    x 525 us), and at 200 us a layer it is bound by its weight reads instead."""
    from capsim.calibration.profiles import find_profile

    eager = ("--gpu", "rtx3090", "--model", "qwen2.5-coder-32b", "--quant", "awq-int4")
    explain = [*eager, "--enforce-eager", "--json", "--profile", "none"]
    prior = json.loads(invoke("explain", *explain).stdout)["decode"]
    r = invoke("explain", *explain, "--set", "layer_overhead_eager_us=200")
    cheap = json.loads(r.stdout)["decode"]
    assert prior["bound"] == "CPU launches" and cheap["bound"] == "memory"
    assert prior["t_dispatch"] == pytest.approx(64 * 525e-6)
    assert cheap["t_dispatch"] == pytest.approx(64 * 200e-6)
    assert cheap["t_total"] < prior["t_total"]
    # like predict, explain applies the hardware class's profile unless told otherwise
    fitted = find_profile("auto", "consumer-ampere").parameters["layer_overhead_eager_us"].value
    r = invoke("explain", *explain[:-2])
    data = json.loads(r.stdout)
    assert data["profile"] == "consumer-ampere-vllm"
    assert data["decode"]["t_dispatch"] == pytest.approx(64 * fitted * 1e-6)

    def tok_s(*extra):
        r = invoke("predict", *eager, "--enforce-eager", "-c", "1", "--json", *extra)
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["results"][0]["points"][0]["output_tok_s"]

    base = tok_s("--profile", "none")
    assert tok_s("--profile", "none", "--set", "layer_overhead_eager_us=200") > 1.1 * base
    # laid over the profile too: the fitted 385 us becomes 600
    assert tok_s("--set", "layer_overhead_eager_us=600") < tok_s()

    seed = "calibration/published/seed002-rtx3090-moe-vs-dense.yaml"

    def dense_tp1_c1(*extra):
        r = invoke("validate", seed, "--json", *extra)
        assert r.exit_code == 0, r.output
        (p,) = [
            p
            for p in json.loads(r.stdout)["points"]
            if p["scenario"] == "dense-tp1" and p["concurrency"] == 1
        ]
        return p["predicted"]

    assert dense_tp1_c1("--set", "layer_overhead_eager_us=400") > 1.1 * dense_tp1_c1()
    r = invoke("validate", seed, "--calibrated", "--set", "bandwidth_efficiency=0.7")
    assert r.exit_code == 2 and "--calibrated" in r.stderr


def test_prior_weight_needs_a_fit():
    r = invoke("validate", "--prior-weight", "1")
    assert r.exit_code == 2 and "--calibrated" in r.stderr
    r = invoke("calibrate", "--prior-weight", "-1")
    assert r.exit_code == 2 and "Traceback" not in r.stderr + r.stdout


def test_one_name_for_several_profiles_is_refused(tmp_path):
    """calibrate writes one profile a hardware class and engine: --name (or a .yaml
    --out) for data spanning several would write them all to one file."""
    data = [
        "calibration/published/seed002-rtx3090-moe-vs-dense.yaml",
        "calibration/published/corpus-client-rtx3090-llamacpp-vulkan.yaml",
    ]
    for extra in (["--name", "mine", "--out", str(tmp_path)], ["--out", str(tmp_path / "p.yaml")]):
        r = invoke("calibrate", *data, *extra)
        assert r.exit_code == 2, r.output
        assert "consumer-ampere-vllm, consumer-ampere-llama.cpp" in r.stderr
    assert not list(tmp_path.iterdir())


def test_parity_plot_tick_labels():
    from capsim.cli.parity_plot import minor_tick_label, tick_label

    assert tick_label(1000.0) == "1,000" and tick_label(0.5) == "0.5"
    assert [minor_tick_label(v) for v in (200.0, 300.0, 5000.0, 0.02, 0.0)] == [
        "200",
        "",
        "5,000",
        "0.02",
        "",
    ]


def test_parity_panels_hold_one_quantity_each_and_mark_reference_points():
    """Issue 48: the uncalibrated parity plot mixed tok/s and seconds on one axis."""
    from types import SimpleNamespace

    from capsim.cli.parity_plot import metric_panels

    def point(metric, gpu, scored):
        return SimpleNamespace(metric=metric, gpu=gpu, measured=1.0, predicted=2.0, scored=scored)

    panels = metric_panels(
        [
            point("output_tok_s", "h200", True),
            point("total_tok_s", "b200", False),
            point("tpot_s", "h200", True),
            point("decode_tok_s", "gb10", True),
            point("ttft_s", "h200", False),
        ]
    )
    assert panels == {
        "throughput (tok/s)": [("h200", 1.0, 2.0, True), ("b200", 1.0, 2.0, False)],
        "TPOT and ITL (s)": [("h200", 1.0, 2.0, True)],
        "decode rate (tok/s)": [("gb10", 1.0, 2.0, True)],
        "TTFT (s)": [("h200", 1.0, 2.0, False)],
    }


def test_validate_parity_plot(tmp_path):
    seed = "calibration/published/seed002-rtx3090-moe-vs-dense.yaml"
    png = tmp_path / "parity.png"
    r = invoke("validate", seed, "--plot", str(png), "--markdown")
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a folder that does not exist is refused before any work, not after it
    r = invoke("validate", seed, "--plot", str(tmp_path / "missing" / "parity.png"))
    assert r.exit_code == 2 and "does not exist" in r.stderr


HEADLINE_SETS = [
    f"calibration/published/{name}.yaml"
    for name in (
        "corpus-accelmark-mixtral-8x7b-tp8-sharegpt",  # reference-only, offline V0 runs
        "seed002-rtx3090-moe-vs-dense",  # counted, closed and batch workloads
        "corpus-client-rtx4090-vllm-mistral7b",
        "corpus-llmd-mi355x-llama33-70b-fp8-4kin-4kout",  # a prior in view: LOSO runs
    )
]
"""A few sets of each kind for the validate test: the whole corpus took 90-136 s of the
suite beside its other tests. Every scenario of it still builds its deployment
(test_every_corpus_scenario_builds_its_deployment); the figures over all of it are
``capsim validate``'s, written up in docs/validation.md."""


def test_every_corpus_scenario_builds_its_deployment():
    """Each scenario of calibration/published resolves its GPU, model, format, engine
    release and flags into a deployment that fits (under a second for all of them), so a
    catalog or dataset edit that breaks one fails here, not in a user's validate run."""
    from capsim.calibration.applied import calibrated_setup
    from capsim.calibration.compare import output_mean_for, scenario_config
    from capsim.calibration.published import load_published
    from capsim.catalog.loader import load_catalog

    cat = load_catalog()
    datasets = load_published(None)
    assert len(datasets) >= 30
    built = 0
    for ds in datasets:
        for sc in ds.scenarios:
            levels = sorted({p.concurrency for p in sc.points})
            config = scenario_config(ds, sc, levels, output_mean_for(sc, levels[0]))
            setup = calibrated_setup(config, cat)
            assert setup.num_blocks > 0 and setup.fit.fits, (ds.name, sc.name)
            built += 1
    assert built == sum(len(ds.scenarios) for ds in datasets) >= 150


def test_validate_reports_every_published_point():
    r = invoke("validate", *HEADLINE_SETS, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert len(data["points"]) >= 24
    assert all(p["predicted"] > 0 for p in data["points"])
    assert 0 < data["mape_percent"] < 100
    # the headline counts every point, the reference-only sets included; by metric family
    # it is the median of |predicted / measured - 1| over them, with its sign
    headline = {row["group"]: row for row in data["every_point"]}
    errors = [p["error"] for p in data["points"] if p["metric"] == "tpot_s"]
    assert sum(row["points"] for row in headline.values()) == len(data["points"])
    assert any(not p["scored"] for p in data["points"] if p["metric"] == "tpot_s")
    assert headline["TPOT"]["points"] >= len(errors)
    assert headline["TPOT"]["median_abs_error_percent"] > 0
    assert r.stdout.count('"median_optimism_percent"') >= len(headline)
    r = invoke("validate", "nowhere.yaml")
    assert r.exit_code == 2 and "does not exist" in r.stderr


def test_validate_calibrated_reports_both_cross_validations(tmp_path):
    import yaml

    from tests.test_calibration import synthetic

    ds = synthetic({"step_overhead_us": 1200.0})
    path = tmp_path / "synthetic.yaml"
    path.write_text(yaml.safe_dump(ds.model_dump(mode="json")))
    png = tmp_path / "parity.png"
    args = ("validate", str(path), "--calibrated", "--fit", "step_overhead_us", "--plot", str(png))
    r = invoke(*args, "--json")
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(r.stdout)
    assert len(data["points"]) == 8
    for p in data["points"]:  # the truth is recoverable: every column but uncalibrated is near 0
        for col in ("in_sample", "cross_validated", "cross_validated_point"):
            assert abs(p[col]) < 0.05, (col, p)
    (summary,) = data["datasets"]
    assert set(summary["by_metric"]) == {"output_tok_s"}
    assert summary["cross_validated_point_mape"] < 5
    r = invoke("validate", str(path), "--calibrated", "--fit", "step_overhed_us")
    assert r.exit_code == 2 and "cannot fit" in r.stderr
    assert "did you mean: step_overhead_us" in r.stderr
    r = invoke("validate", str(path), "--point-cv", "refit")
    assert r.exit_code == 2 and "--point-cv applies to fits" in r.stderr
    r = invoke("validate", str(path), "--calibrated", "--point-cv", "exact")
    assert r.exit_code == 2 and "linearised" in r.stderr
    for flag in ("--level-cv", "--point-cv"):  # either value, the default's too
        for value in ("refit", "linearised"):
            r = invoke("validate", str(path), flag, value)
            assert r.exit_code == 2 and f"{flag} applies to fits" in r.stderr, r.output
    # each level refitted (calibrate's choice of parameters a fold) recovers the truth too
    r = invoke(*args[:-2], "--level-cv", "refit", "--json")
    assert r.exit_code == 0, r.output
    refitted = json.loads(r.stdout)["points"]
    assert all(abs(p["cross_validated"]) < 0.05 for p in refitted), refitted


def test_validate_calibrated_leaves_out_what_it_cannot_simulate(tmp_path):
    # a scenario capsim cannot simulate is reported and left out of the fits, as the
    # uncalibrated comparison skips it (it used to end the whole run with exit 2)
    import yaml

    from tests.test_calibration import synthetic

    ds = synthetic({"step_overhead_us": 1200.0})
    long = ds.scenarios[0].model_copy(update={"name": "too-long", "input_tokens": "999999"})
    ds = ds.model_copy(update={"scenarios": [*ds.scenarios, long]})
    path = tmp_path / "synthetic.yaml"
    path.write_text(yaml.safe_dump(ds.model_dump(mode="json")))
    r = invoke("validate", str(path), "--calibrated", "--fit", "step_overhead_us", "--json")
    assert r.exit_code == 0, r.output
    assert "not simulated:" in r.stderr and "too-long" in r.stderr
    assert len(json.loads(r.stdout)["points"]) == 8


def test_version_prints_the_installed_version():
    from importlib.metadata import version

    r = invoke("--version")
    assert r.exit_code == 0
    assert r.stdout.strip() == f"capsim {version('capsim')}"


PREDICT = ("predict", "--gpu", "rtx3090", "--model", "qwen3-8b", "-c", "1", "--requests", "4")


def predict_with(*args: str) -> tuple[str, ...]:
    """PREDICT with ``args``; an open loop's load is its --rate, so -c goes (it is refused
    there, as a flag the workload ignores)."""
    given = {a for a in args if a.startswith("-")}
    drop = {"-c"} if "open" in args else set()
    drop |= given  # each option once: a second value is refused, not taken
    base, i = [PREDICT[0]], 1
    while i < len(PREDICT):
        if PREDICT[i] in drop:
            i += 2
            continue
        base.append(PREDICT[i])
        i += 1
    return (*base, *args)


GAMMA = ("--workload", "open", "--rate", "1", "--arrival", "gamma")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--turns", "3"), "--turns applies to --workload agents, not closed"),
        (("--think-time", "2"), "--think-time applies to --workload agents"),
        (("--rate", "2"), "--rate applies to --workload open, not closed"),
        (("--rounds", "2"), "--rounds applies to --workload batch"),
        (("--workload", "open", "--rate", "1", "--gamma-cv", "3"), "applies to --arrival gamma"),
        (("--workload", "agents", "--rate", "1"), "--rate applies to --workload open, not agents"),
        (("--workload", "open", "--rate", "1", "-c", "4"), "--concurrency applies to"),
        (("--tp", "1,,2"), "--tp '1,,2' has an empty item"),
        (("--gpu", "rtx3090,"), "--gpu 'rtx3090,' has an empty item"),
        (("--set", "layer_overhead_eager_us=inf"), "needs a finite number"),
        (
            ("--workload", "open", "--rate", "nan"),
            "positive, at most 1,000,000 requests per second",
        ),
        ((*GAMMA, "--gamma-cv", "0"), "0.1 to 10"),
        ((*GAMMA, "--gamma-cv", "nan"), "0.1 to 10"),
        # ran for hours / a NaN reached the simulator's integer conversion
        (("--requests", "99999999999999999999"), "less than or equal to 10000000"),
        (("--spec", "ngram:4", "--spec-acceptance", "nan"), "rates from 0 to 1"),
        (("--spec", "ngram:4", "--spec-acceptance", "0.9,1.5"), "rates from 0 to 1"),
        # changed nothing, without a word (issue 47's fourth audit)
        (("--router", "prefix_aware"), "chooses among replicas, and this deployment has one"),
        (("--offline", "--router", "least_outstanding"), "not to --offline runs"),
    ],
)
def test_flags_that_do_not_apply_or_cannot_be_read_are_refused(args, words):
    """Issue 47: a flag the workload ignores is an error (it used to run as if absent), and
    values that divided by zero or ran on NaN are refused with exit 2."""
    r = invoke(*predict_with(*args))
    assert r.exit_code == 2, r.output
    assert words in r.stderr and "Traceback" not in r.output


def test_flags_that_apply_run():
    agents = [a for a in PREDICT if a not in ("--requests", "4")]  # agents run --turns each
    r = invoke(*agents, "--workload", "agents", "--turns", "2", "--think-time", "1")
    assert r.exit_code == 0, r.output
    r = invoke(*PREDICT, "--gpus", "2", "--router", "least_outstanding")
    assert r.exit_code == 0, r.output
    r = invoke(*predict_with(*GAMMA, "--gamma-cv", "3"))
    assert r.exit_code == 0, r.output


def test_a_token_budget_below_the_sequence_limit_is_refused_as_vllm_refuses_it():
    """vLLM's SchedulerConfig refuses max_num_batched_tokens < max_num_seqs (every running
    sequence takes a token a step); its default sequence limit counts when none is given.
    SGLang and llama.cpp have no such rule."""
    base = ["predict", "--gpu", "rtx3090", "--model", "qwen3-8b", "-c", "2", "--requests", "4"]
    r = invoke(*base, "--max-num-batched-tokens", "100")
    assert r.exit_code == 2 and "below --max-num-seqs 256 (vLLM's default" in r.stderr
    r = invoke(*base, "--max-num-batched-tokens", "100", "--max-num-seqs", "128")
    assert r.exit_code == 2 and "lower --max-num-seqs to 100 or less" in r.stderr
    for ok in (["--max-num-seqs", "100"], ["--engine", "sglang"]):
        r = invoke(*base, "--output-tokens", "8", "--max-num-batched-tokens", "100", *ok)
        assert r.exit_code == 0, r.stderr
    r = invoke("fit", "--gpu", "h200", "--model", "qwen3-8b", "--max-num-batched-tokens", "512")
    assert r.exit_code == 2 and "1,024 (vLLM's default" in r.stderr


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--max-num-seqs", "0", "greater than or equal to 1"),
        ("--max-num-seqs", "99999999999999999999", "less than or equal to 2147483648"),
        ("--max-num-batched-tokens", "4294967296", "less than or equal to 2147483648"),
        ("--max-model-len", "0", "greater than or equal to 1"),
        ("--tp", "99999", "--tp 99999: input should be less than or equal to 16384"),
    ],
)
def test_engine_counts_are_refused_out_of_range_by_their_flag(flag, value, words):
    """An engine count beyond 32 bits was taken and reported as a hint to raise another
    flag to a 20-digit number; fit's --tp past the GPU ceiling was named --gpus."""
    r = invoke("fit", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", flag, value)
    assert r.exit_code == 2 and words in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--input-tokens", "٣"], "'٣' has a digit that is not 0-9"),
        (["--spec", "ngram:٣"], "'ngram:٣' has a digit that is not 0-9"),
        (["--set", "bandwidth_efficiency=٠.5"], "has a digit that is not 0-9 ('٠')"),
        (["--output-tokens", "normal:1e300,1"], "draws reach past 1e30; at most 10,000,000"),
        (["--input-tokens", "20000000"], "draws reach 20,000,000; at most 10,000,000 tokens"),
    ],
)
def test_numbers_in_text_flags_are_ascii_and_lengths_have_a_ceiling(args, words):
    """Text flags that hold numbers read any script's digits (whole-number flags refused
    them), and a length distribution reaching 1e300 tokens ran, or became max_tokens
    -2**63 in the probe (issue 47)."""
    r = invoke("predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "-c", "1", *args)
    assert r.exit_code == 2 and words in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--output-tokens", "normal:1e300,1"], "draws reach past 1e30"),
        (["--seed", "-1"], "greater than or equal to 0"),
        (["--engine-flag", "tensor-parallel-size=-4"], "takes a whole number of 1 or more"),
        (["-c", "1000000"], "--concurrency above 100,000"),
    ],
)
def test_the_probe_checks_what_predict_checks(args, words):
    r = invoke("probe", "--url", "http://127.0.0.1:9", "--model", "m", "--requests", "2", *args)
    assert r.exit_code == 2 and words in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--engine", "llama.cpp", "--gpu-memory-utilization", "0.5"], "not llama.cpp's"),
        (["--engine", "llama.cpp", "--kv-dtype", "fp8"], "has no FP8 KV cache"),
        (["--engine", "llama.cpp", "--async-scheduling"], "not llama.cpp's"),
        (["--engine", "llama.cpp", "--disable-custom-all-reduce"], "not llama.cpp's"),
        (["--ubatch-size", "64"], "--ubatch-size is llama.cpp's"),
    ],
)
def test_another_engines_flag_is_refused(args, words):
    """Issue 47: these ran and changed the result (--ubatch-size 64 with vLLM took a
    prefill step from 108 to 447 ms; --gpu-memory-utilization 0.5 halved llama.cpp's KV)."""
    r = invoke("predict", "--gpu", "rtx4090", "--model", "llama-3.1-8b", "-c", "1", *args)
    assert r.exit_code == 2 and words in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            [
                *("explain", "--gpu", "h100-sxm", "--model", "llama-3.1-8b"),
                *("--prefill-chunk", "2147483648"),
            ],
            "--prefill-chunk 2,147,483,648 is longer than llama-3.1-8b's 131,072-token",
        ),
        (
            [
                *("plan", "--model", "qwen3-8b", "--agents", "8", "--gpus", "rtx4090"),
                *("--min-agent-tok-s", "1e308"),
            ],
            "--min-agent-tok-s 1e+308",
        ),
        (
            [
                *("predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "-c", "1"),
                *("--gpu-memory-utilization", "0_9"),
            ],
            "'0_9' is not a number (an '_' in it)",
        ),
    ],
)
def test_messages_name_the_flag_the_user_typed(args, words):
    """Issue 47's third audit: the chunk's limit was said of --prefill-context ('0 to 0'),
    --min-agent-tok-s was called --min-agent-tok, and '0_9' was read as 9.0."""
    r = invoke(*args)
    assert r.exit_code == 2 and words in r.stderr, r.stderr


def test_calibrate_refuses_an_out_that_is_no_folder_before_fitting(tmp_path):
    """--out naming a FIFO (or any file without .yaml) ran the whole fit, then failed."""
    import os

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    seed = "calibration/published/seed002-rtx3090-moe-vs-dense.yaml"
    r = invoke("calibrate", seed, "--out", str(fifo))
    assert r.exit_code == 2 and "exists and is not a folder" in r.stderr, r.stderr


def test_a_trace_draws_nothing_so_a_seed_is_refused(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_time": 0.0, "input_tokens": 64, "output_tokens": 8}\n')
    args = ("predict", "--gpu", "rtx3090", "--model", "qwen3-8b", "--workload", "trace")
    r = invoke(*args, "--trace", str(trace), "--seed", "5")
    assert r.exit_code == 2 and "--seed applies to --workload" in r.stderr, r.output
    assert invoke(*args, "--trace", str(trace)).exit_code == 0


def test_a_repeated_model_is_refused():
    r = invoke(*predict_with("--model", "qwen3-8b,qwen3-8b", "--json"))
    assert r.exit_code == 2 and "--model lists qwen3-8b twice" in r.stderr, r.output


def test_links_at_tp_1_are_refused_and_a_tp_1_row_is_not_repeated_per_link():
    """At --tp 1 no GPU talks to another: --interconnect and --disable-custom-all-reduce
    changed nothing ('pcie,nvlink' gave two identical rows; issue 47's fourth audit)."""
    r = invoke(*PREDICT, "--interconnect", "pcie,nvlink")
    assert r.exit_code == 2 and "at --tp 1 there are none" in r.stderr, r.output
    explain = ("explain", "--gpu", "h100-sxm", "--model", "llama-3.1-8b")
    r = invoke(*explain, "--disable-custom-all-reduce")
    assert r.exit_code == 2 and "at --tp 1 there are none" in r.stderr, r.output
    args = ("predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "-c", "1")
    r = invoke(*args, "--requests", "4", "--tp", "1,2", "--interconnect", "pcie,nvlink", "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["results"]
    assert sorted(row["tp"] for row in rows) == [1, 2, 2]
    assert [row["label"] for row in rows if row["tp"] == 1] == ["llama-3.1-8b bf16 1xh100-sxm"]
