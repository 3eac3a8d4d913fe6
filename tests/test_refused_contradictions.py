"""Input that contradicts itself or repeats itself is refused with a clear error (exit 2),
never taken silently (issue 47, the fuzzing round of 2026-12-02): a dataset name given
twice, a list value given twice, a folder that does not exist, files whose totals
contradict their records, engine releases written in another engine's form, flags a
release or a combination does not have."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from capsim.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
DATASET = ROOT / "calibration" / "published" / "corpus-llamacpp-cuda-pr26767-rtx5090-qwen3.yaml"
HF = ROOT / "tests" / "data" / "hf_configs" / "gemma-4-31b-it" / "config.json"
runner = CliRunner()
PREDICT = ["predict", "--gpu", "rtx3090", "--model", "llama-3.1-8b", "--requests", "4"]


def refused(args: list[str], says: str) -> None:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert says in " ".join(r.output.split()), r.output


def test_a_dataset_copied_under_another_file_name_is_refused(tmp_path):
    """Two files of one dataset name ended in a StopIteration traceback in the
    leave-one-source-out pass, and calibrate fitted the points twice."""
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    shutil.copy(DATASET, a)
    shutil.copy(DATASET, b)
    refused(["validate", str(a), str(b)], "has the name")
    refused(["calibrate", str(a), str(b), "--out", str(tmp_path / "p.yaml")], "has the name")


@pytest.mark.parametrize(
    "extra, says",
    [
        (["-c", "1,1"], "lists the level 1 twice"),
        (["-c", "1..4,2"], "lists the level 2 twice"),
        (["-c", "1", "--kv-dtype", "auto,auto"], "--kv-dtype lists auto twice"),
        (["-c", "1", "--tp", "1,01"], "--tp lists 1 twice"),
        (["--workload", "open", "--rate", "1,1.0"], "--rate lists the rate 1 twice"),
    ],
)
def test_a_list_value_given_twice_is_refused(extra, says):
    refused([*PREDICT, *extra], says)


def test_two_names_of_one_model_are_one_model_given_twice():
    args = ["predict", "--gpu", "rtx3090", "-c", "1", "--requests", "4", "--model"]
    refused([*args, "llama-3.1-8b,meta-llama/Llama-3.1-8B-Instruct"], "the model 'llama-3.1-8b'")
    refused(
        ["predict", "--gpu", "rtx3090,RTX3090", "--model", "llama-3.1-8b", "-c", "1"],
        "--gpu lists RTX3090 twice",
    )


def test_writers_refuse_a_folder_that_does_not_exist(tmp_path):
    """--write-bands, calibrate --out, import --out and models import-hf --out created
    missing folders where --plot refused them."""
    missing = tmp_path / "no" / "such"
    refused(["validate", str(DATASET), "--write-bands", str(missing / "b.yaml")], "does not exist")
    refused(["calibrate", str(DATASET), "--out", str(missing / "p.yaml")], "does not exist")
    refused(
        ["models", "import-hf", str(HF), "--name", "x1", "--out", str(missing / "db")],
        "does not exist",
    )
    assert not (tmp_path / "no").exists()


def test_a_byte_order_mark_is_read_past(tmp_path):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\ufeff100\n200\n", encoding="utf-8")
    r = runner.invoke(app, [*PREDICT, "-c", "1", "--input-tokens", f"file:{lengths}"])
    assert r.exit_code == 0, r.output


def test_a_key_given_twice_in_a_config_is_refused(tmp_path):
    text = HF.read_text()
    config = tmp_path / "config.json"
    config.write_text(
        text.replace('"num_hidden_layers"', '"num_hidden_layers": 3, "num_hidden_layers"', 1)
    )
    assert json.loads(config.read_text())  # json itself takes it: the last one wins
    refused(["models", "import-hf", str(config), "--name", "x2", "--out", str(tmp_path)], "twice")


@pytest.mark.parametrize(
    "change, says",
    [
        ({"num_key_value_heads": 0}, "num_key_value_heads is 0"),
        ({"max_position_embeddings": 0}, "max_position_embeddings is 0"),
        ({"model_type": 5}, "model_type is 5"),
        ({"layer_types": ["full_attention"] * 5}, "layer_types lists 5 layers"),
    ],
)
def test_config_values_that_mean_nothing_are_refused(tmp_path, change, says):
    config = json.loads(HF.read_text())
    target = config.get("text_config", config)
    target.update(change)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    refused(["models", "import-hf", str(path), "--name", "x3", "--out", str(tmp_path)], says)


def test_flags_that_would_be_ignored_are_refused():
    refused([*PREDICT, "--workload", "agents", "-c", "2"], "--requests applies to")
    plan = ["plan", "--model", "qwen3-0.6b", "--agents", "2", "--counts", "1"]
    refused(
        [*plan, "--min-agent-tok-s", "5", "--cloud-hourly", "2", "--kwh-price", "0.3"],
        "--kwh-price prices the energy",
    )


@pytest.mark.parametrize(
    "engine, extra, says",
    [
        ("vllm@b6918", [], "not written as vllm's releases are"),
        ("llama.cpp@0.7.3", [], "not written as llama.cpp's releases are"),
        ("vllm@0.7.3", ["--async-scheduling"], "has no async scheduling; it came in 0.10.0"),
    ],
)
def test_a_release_in_another_form_or_without_the_flag_is_refused(engine, extra, says):
    refused([*PREDICT, "-c", "1", "--engine", engine, *extra], says)


def test_a_format_or_kernel_the_engine_or_gpu_lacks_is_refused():
    refused([*PREDICT, "-c", "1", "--quant", "mlx-4bit"], "vllm does not load mlx-4bit")
    refused(
        [*PREDICT, "-c", "1", "--engine", "sglang", "--attention-backend", "intel_amx"],
        "not on the nvidia rtx3090",
    )


def test_speculation_that_describes_no_server_is_refused():
    refused([*PREDICT, "-c", "1", "--spec", "draft:llama-3.1-8b:3"], "the draft model is")
    config = {
        "method": "ngram",
        "num_speculative_tokens": 2,
        "prompt_lookup_min": 5,
        "prompt_lookup_max": 2,
    }
    refused([*PREDICT, "-c", "1", "--spec", json.dumps(config)], "is above prompt_lookup_max")


@pytest.mark.parametrize("name, says", [("none", "could never be chosen"), ("auto", "could never")])
def test_calibrate_refuses_a_name_profile_lookup_reads_otherwise(tmp_path, name, says):
    refused(["calibrate", str(DATASET), "--name", name, "--out", str(tmp_path)], says)


def test_calibrate_refuses_another_class_profile_name(tmp_path):
    """A profile of Blackwell data named consumer-ampere-vllm was then found by --profile
    auto for every RTX 3090 and refused there: every default prediction broke."""
    refused(
        ["calibrate", str(DATASET), "--name", "consumer-ampere-vllm", "--out", str(tmp_path)],
        "is the name --profile auto looks up",
    )
    refused(["calibrate", str(DATASET), "--name", "my profile", "--out", str(tmp_path)], "--name")


def test_a_scenario_without_points_is_refused(tmp_path):
    text = DATASET.read_text()
    head, _, _ = text.partition("  points:")
    path = tmp_path / "empty.yaml"
    path.write_text(head + "  points: []\n")
    refused(["validate", str(path)], "at least 1 item")


def vllm_bench(tmp_path: Path, **change) -> Path:
    """tests/test_importers.py's vllm bench result, with ``change`` laid over."""
    from tests.test_importers import VLLM_BENCH

    path = tmp_path / "result.json"
    path.write_text(json.dumps({**VLLM_BENCH, **change}))
    return path


@pytest.mark.parametrize(
    "change, says",
    [
        ({"errors": ["boom"] * 4}, "4 of the 4 requests carry an error"),
        ({"output_lens": [0] * 4}, "every output length is 0"),
        ({"output_lens": [1.5] * 4}, "not a whole number of tokens"),
    ],
)
def test_a_bench_result_whose_records_contradict_its_totals_is_refused(tmp_path, change, says):
    path = vllm_bench(tmp_path, **change)
    refused(["import", "vllm-bench", str(path), "--out", str(tmp_path / "run")], says)


def test_the_same_bench_result_with_consistent_records_imports(tmp_path):
    path = vllm_bench(tmp_path)
    r = runner.invoke(app, ["import", "vllm-bench", str(path), "--out", str(tmp_path / "run")])
    assert r.exit_code == 0 and "ok 4" in r.output, r.output


def run_log(tmp_path: Path, header: dict, records: list[dict]) -> Path:
    base = {
        "type": "header",
        "format": "capsim-run/1",
        "url": "http://127.0.0.1:8000",
        "model": "m",
        "concurrency": [1],
        "requests_per_level": 2,
    }
    lines = [{**base, **header}]
    for r in records:
        lines.append({"type": "request", "concurrency": 1, "run": 0, **r})
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


OK = {"send": 0.0, "first_token": 0.1, "finish": 1.0, "output_tokens": 10, "outcome": "ok"}


@pytest.mark.parametrize(
    "header, records, says",
    [
        ({"format": "capsim-run/999"}, [{**OK, "request_id": "a"}], "capsim-run/999"),
        ({}, [{**OK, "request_id": "a"}, {**OK, "request_id": "a"}], "recorded twice"),
        ({}, [{**OK, "request_id": "a", "error": "HTTP 500"}], "the outcome is ok, yet"),
    ],
)
def test_a_run_log_that_contradicts_itself_is_refused(tmp_path, header, records, says):
    refused(["probe", "summarize", str(run_log(tmp_path, header, records))], says)


def test_a_kernel_row_given_twice_is_refused(tmp_path):
    kernels = ROOT / "calibration" / "kernels" / "h100-sxm-decode-layers.json"
    data = json.loads(kernels.read_text())
    data["rows"].append(data["rows"][0])
    path = tmp_path / "k.json"
    path.write_text(json.dumps(data))
    refused(["calibrate-kernels", str(path)], "the same measurement")


@pytest.mark.parametrize(
    "change, says",
    [
        ({"eager_elementwise_shares": {"x": 5.0}}, "names x unknown kernel"),
        ({"eager_extra_floor_us": {"bf16": -1e9}}, "microseconds from 0"),
    ],
)
def test_a_kernel_file_of_impossible_eager_terms_is_refused(tmp_path, change, says):
    """An unknown kernel's share was a KeyError; a negative or NaN floor SciPy's 'residuals
    are not finite' (the second fuzzing round)."""
    kernels = ROOT / "calibration" / "kernels" / "h100-sxm-decode-layers.json"
    data = {**json.loads(kernels.read_text()), **change}
    path = tmp_path / "k.json"
    path.write_text(json.dumps(data))
    refused(["calibrate-kernels", str(path)], says)


def test_a_kernel_row_of_a_run_the_file_does_not_list_is_refused(tmp_path):
    kernels = ROOT / "calibration" / "kernels" / "h100-sxm-decode-layers.json"
    data = json.loads(kernels.read_text())
    data["rows"][0]["run"] = len(data["runs"]) + 3
    path = tmp_path / "k.json"
    path.write_text(json.dumps(data))
    refused(["calibrate-kernels", str(path)], "the file lists")
