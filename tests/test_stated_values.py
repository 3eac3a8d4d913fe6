"""Values that used to pass unchecked (issue 47's batteries): a probe's stated deployment,
a calibration profile named like another kind of file, a model import that shadows a
built-in one, request times out of order and negative figures in an imported result."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from capsim.cli.main import app
from capsim.metrics import RequestRecord

ROOT = Path(__file__).resolve().parent.parent
RUNNER = CliRunner()
HF_CONFIGS = ROOT / "tests" / "data" / "hf_configs"


def run(*args: str):
    return RUNNER.invoke(app, list(args))


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--gpu", "rtx309"], "rtx3090"),  # did-you-mean
        (["--quant", "int3"], "unknown"),
        (["--kv-dtype", "int3"], "fp8"),
        (["--tp", "0"], "--tp"),
        (["--gpus", "-2"], "--gpus"),
    ],
)
def test_a_stated_deployment_the_catalog_does_not_know_fails_before_the_run(flags, words, tmp_path):
    result = run(
        "probe",
        "--url",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--out",
        str(tmp_path / "r.json"),
        *flags,
    )
    assert result.exit_code == 2 and words in result.output, result.output
    assert "Traceback" not in result.output and not list(tmp_path.iterdir())


def test_a_calibration_profile_must_be_yaml_or_a_folder(tmp_path):
    dataset = ROOT / "calibration" / "published" / "seed002-rtx3090-moe-vs-dense.yaml"
    result = run("calibrate", str(dataset), "--out", str(tmp_path / "x.txt"))
    assert result.exit_code == 2 and "x.yaml" in result.output, result.output
    assert not (tmp_path / "x.txt").exists()


def test_an_import_named_like_a_built_in_model_says_it_replaces_it(tmp_path):
    config = HF_CONFIGS / "gemma-4-e2b-it" / "config.json"
    result = run(
        "models",
        "import-hf",
        str(config),
        "--name",
        "llama-3.1-8b",
        "--out",
        str(tmp_path),
        "--json",
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["replaces_built_in"] == "llama-3.1-8b"
    result = run("models", "import-hf", str(config), "--name", "my-own", "--out", str(tmp_path))
    assert result.exit_code == 0 and "replaces" not in result.output


@pytest.mark.parametrize(
    ("times", "words"),
    [
        ({"send": 1.0, "first_token": 0.5, "finish": 2.0}, "first_token (0.5) comes before send"),
        ({"send": 0.0, "first_token": 1.0, "finish": 0.5}, "finish (0.5) comes before"),
        ({"send": 0.0, "first_token": float("nan"), "finish": 1.0}, "finite"),
        ({"send": 0.0, "first_token": 1.0, "finish": 2.0, "output_tokens": -3}, "must be 0 to"),
        ({"send": -5.0, "first_token": 1.0, "finish": 2.0}, "0 or later"),
        ({"send": 0.0, "first_token": 1.0, "finish": 2.0, "output_tokens": 10**30}, "must be 0 to"),
    ],
)
def test_a_record_with_times_out_of_order_is_refused(times, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        RequestRecord(request_id="r", outcome="ok", **times)


def test_times_within_a_microsecond_of_order_are_rounding():
    record = RequestRecord(request_id="r", send=1.0, first_token=1.0 - 5e-7, finish=2.0)
    assert record.ttft == pytest.approx(0.0, abs=1e-6)


def vllm_bench(path: Path, **changes) -> Path:
    result = {
        "duration": 10.0,
        "completed": 2,
        "total_output_tokens": 20,
        "output_throughput": 2.0,
        "max_concurrency": 2,
        "mean_ttft_ms": 100.0,  # the ttfts' mean (an import cross-checks them)
        "ttfts": [0.1, 0.1],
        "output_lens": [10, 10],
        "itls": [[0.01] * 9, [0.01] * 9],
    }
    path.write_text(json.dumps({**result, **changes}), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"ttfts": [0.1, -0.5]}, "first_token (-0.5) comes before send"),
        ({"duration": -3}, "duration must be"),
        ({"mean_ttft_ms": -5}, "ttft_ms figure must be"),
        ({"completed": -1}, "completed must be"),
    ],
)
def test_an_import_with_negative_figures_fails_and_leaves_nothing(changes, words, tmp_path):
    source = vllm_bench(tmp_path / "bench.json", **changes)
    result = run("import", "vllm-bench", str(source), "--out", str(tmp_path / "run.json"))
    assert result.exit_code == 2 and words in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json"]
    good = vllm_bench(tmp_path / "good.json")
    assert run("import", "vllm-bench", str(good), "--out", str(tmp_path / "g.json")).exit_code == 0


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--workload", "open", "--rate", "1e-300"], "below 0.0001"),
        (["--workload", "agents", "--concurrency", "2", "--think-time", "1e300"], "28 hours"),
        (["--workload", "agents", "--concurrency", "2", "--think-time", "uniform:1,1e9"], "1e+09"),
    ],
)
def test_times_beyond_a_steps_resolution_are_refused(flags, words):
    """A rate of 1e-300 put arrivals at 1e300 s, where adding a step changes nothing; it
    answered 0 tok/s with exit 0."""
    count = [] if "agents" in flags else ["--requests", "4"]  # agents run --turns each
    result = run("predict", "--gpu", "rtx3090", "--model", "qwen3-8b", *count, *flags)
    assert result.exit_code == 2 and words in result.output, result.output


def test_a_catalog_gpu_with_an_implausible_figure_is_refused(tmp_path):
    """1e30 GB/s of DRAM bandwidth (a unit slip) was simulated and answered nonsense."""
    entry = (ROOT / "hardware_db" / "gpus" / "rtx3090.yaml").read_text(encoding="utf-8")
    entry = entry.replace("name: rtx3090\n", "name: rtx3090x\n", 1)
    lines = [
        "memory_bandwidth_gb_s: 1e30" if line.startswith("memory_bandwidth_gb_s:") else line
        for line in entry.splitlines()
    ]
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "x.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run("predict", "--db", str(tmp_path), "--gpu", "rtx3090x", "--model", "qwen3-8b")
    assert result.exit_code == 2, result.output
    assert "memory_bandwidth_gb_s" in result.output and "1000000" in result.output


@pytest.mark.parametrize("value", [3.5, True, "36", 0])
def test_a_config_whose_counts_are_not_whole_numbers_is_refused(value, tmp_path):
    """num_hidden_layers 3.5 was rounded down to 3 without a word."""
    config = json.loads((HF_CONFIGS / "gemma-4-e2b-it" / "config.json").read_text("utf-8"))
    config["text_config"]["num_hidden_layers"] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    result = run("models", "import-hf", str(path), "--name", "g", "--out", str(tmp_path / "db"))
    assert result.exit_code == 2 and "num_hidden_layers" in result.output, result.output
    assert not (tmp_path / "db").exists()
