"""Issue 47, seventh audit: a path written with a trailing '/', an empty --db, a --set that
no step of the configuration reads (checked by computing steps), engine flags capsim only
records, quoted level keys and oversized dataset and kernel files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from capsim.calibration.kernels import MAX_KERNEL_FILE_BYTES
from capsim.calibration.published import MAX_DATASET_REQUESTS
from capsim.cli.main import app
from tests.test_audit6_flags import assert_refused

runner = CliRunner()
REPO = Path(__file__).resolve().parent.parent
SEED002 = REPO / "calibration" / "published" / "seed002-rtx3090-moe-vs-dense.yaml"
PREDICT = ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "-c", "2", "--requests", "8"]


def test_a_plot_named_as_a_folder_is_refused_and_nothing_is_written(tmp_path):
    target = tmp_path / "plots"
    assert_refused([*PREDICT, "--plot", f"{target}/"], "ends in '/', naming a folder")
    assert list(tmp_path.iterdir()) == []  # plots.png was written beside it before


def test_an_existing_file_named_with_a_trailing_slash_is_refused():
    assert_refused(["validate", f"{SEED002}/"], "ends in '/', but")


def test_a_folder_with_a_trailing_slash_is_still_a_folder():
    r = runner.invoke(app, ["validate", f"{SEED002.parent}/", "--json"])
    assert r.exit_code == 0, r.output[-2000:]


def test_models_import_hf_out_is_a_folder_and_may_end_in_a_slash(tmp_path):
    config = REPO / "tests" / "data" / "hf_configs" / "gemma-4-31b-it" / "config.json"
    r = runner.invoke(
        app, ["models", "import-hf", str(config), "--name", "probe-x", "--out", f"{tmp_path}/"]
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "models" / "probe-x.yaml").is_file() or list(tmp_path.rglob("*.yaml"))


@pytest.mark.parametrize("where", ["command", "global"])
def test_an_empty_db_is_refused(where):
    args = [*PREDICT, "--db", ""] if where == "command" else ["--db", "", *PREDICT]
    assert_refused(args, "'' is empty")


@pytest.mark.parametrize(
    "extra, name",
    [
        ([], "layer_overhead_eager_us=400"),  # no --enforce-eager
        ([], "linear_attention_compute_efficiency=0.2"),  # no linear-attention layer
        ([], "weight_only_int8_gemm_efficiency=0.3"),  # bf16 on vLLM: no MMQ path
    ],
)
def test_a_step_parameter_no_step_reads_is_refused(extra, name):
    assert_refused([*PREDICT, *extra, "--set", name], "changes no step of this configuration")


@pytest.mark.parametrize(
    "args",
    [
        [*PREDICT, "--enforce-eager", "--set", "layer_overhead_eager_us=300"],
        [
            "predict",
            "--gpu",
            "rtx3090",
            "--model",
            "qwen3.5-27b",
            "--quant",
            "awq-int4",
            "-c",
            "1",
            "--requests",
            "4",
            "--set",
            "linear_attention_compute_efficiency=0.2",
        ],
        [
            "predict",
            "--gpu",
            "rtx3090",
            "--model",
            "llama-3.1-8b",
            "--quant",
            "gguf-q4_k_m",
            "--engine",
            "llama.cpp",
            "-c",
            "1",
            "--requests",
            "4",
            "--set",
            "weight_only_int8_gemm_efficiency=0.2",
        ],
        [*PREDICT, "--set", "bandwidth_efficiency=0.8"],  # the default value: still read
        # a launch cost counts only once it outgrows the GPU's work: at the value given
        [*PREDICT, "--set", "layer_overhead_compiled_us=5000"],
    ],
)
def test_a_step_parameter_the_configuration_reads_is_taken(args):
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output[-2000:]


def test_a_misspelt_engine_flag_that_capsim_reads_is_refused_with_the_name():
    line = "probe --url http://127.0.0.1:9 --model x --gpu h100-sxm -c 1 --requests 1"
    assert_refused([*line.split(), "--engine-flag", "max-num-seq=4"], "did you mean: max-num-seqs")


def test_an_engine_flag_capsim_only_records_is_named_as_such(tmp_path):
    line = "probe --url http://127.0.0.1:9 --model x --gpu h100-sxm -c 1 --requests 1"
    args = [*line.split(), "--engine-flag", "enable-prefix-caching=1", "--out", str(tmp_path / "r")]
    r = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert r.exit_code == 2  # nothing listens on port 9
    text = " ".join(r.output.split())
    assert "--engine-flag enable-prefix-caching: recorded in the run file" in text


def _dataset(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load(SEED002.read_text())
    edit(data)
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_quoted_level_key_is_refused(tmp_path):
    def edit(data):
        data["scenarios"][0]["output_mean_tokens_by_level"] = {1: 2384, "1": 100}

    assert_refused(["validate", str(_dataset(tmp_path, edit))], "level '1' is not a whole number")


def test_a_dataset_asking_for_more_requests_than_validate_simulates_is_refused(tmp_path):
    def edit(data):
        data["workload"]["requests_per_level"] = MAX_DATASET_REQUESTS + 1

    assert_refused(["validate", str(_dataset(tmp_path, edit))], "requests_per_level")


def test_a_kernel_file_over_its_size_is_refused_before_parsing(tmp_path):
    path = tmp_path / "k.json"
    row = json.dumps({"note": "x" * 1000}) + ","
    path.write_text('{"rows": [' + row * (MAX_KERNEL_FILE_BYTES // len(row) + 1) + "{}]}")
    assert_refused(["calibrate-kernels", str(path)], "more than the 8 MB capsim reads")
