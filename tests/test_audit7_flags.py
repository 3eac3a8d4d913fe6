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


def test_a_folder_with_a_trailing_slash_is_still_a_folder(tmp_path):
    (tmp_path / SEED002.name).write_bytes(SEED002.read_bytes())
    r = runner.invoke(app, ["validate", f"{tmp_path}/", "--json"])
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


# ---------------------------------------------------------------- the seventh audit's run


def test_an_output_that_is_one_of_the_inputs_is_refused_even_with_force(tmp_path):
    data = tmp_path / "d.yaml"
    data.write_bytes(SEED002.read_bytes())
    before = data.read_bytes()
    assert_refused(
        ["validate", str(data), "--write-bands", str(data), "--force"], "one of the files"
    )
    assert_refused(["validate", str(tmp_path), "--write-bands", str(data), "--force"], "reads")
    assert_refused(["calibrate", str(data), "--out", str(data), "--force"], "one of the files")
    assert data.read_bytes() == before


@pytest.mark.parametrize(
    "env, args, says",
    [
        (
            {"OPENAI_API_KEY": "\u4e2d"},
            "probe --url http://127.0.0.1:1 --model x -c 1 --gpu h100-sxm",
            "holds a character an HTTP header cannot carry",
        ),
        (
            {"HF_TOKEN": "\u4e2d"},
            "predict --gpu rtx3090 --model org/unknown-model-x -c 1",
            "HF_TOKEN holds a character",
        ),
        (
            {"HF_ENDPOINT": "::::"},
            "predict --gpu rtx3090 --model org/unknown-model-x -c 1",
            "is not a URL capsim can fetch from",
        ),
        (
            {"HF_ENDPOINT": "http://[::1"},
            "predict --gpu rtx3090 --model org/unknown-model-x -c 1",
            "is not a URL capsim can fetch from",
        ),
    ],
)
def test_a_key_or_endpoint_an_http_request_cannot_carry_is_refused(env, args, says, tmp_path):
    env = {**env, "CAPSIM_CACHE_DIR": str(tmp_path)}  # no cached config answers first
    r = runner.invoke(app, args.split(), env={"COLUMNS": "200", **env})
    assert r.exit_code == 2, r.output
    assert says in " ".join(r.output.split())
    assert "Traceback" not in r.output


def test_a_terminal_that_cannot_show_a_character_gets_a_replacement_not_a_traceback():
    import subprocess
    import sys

    for args in (["gpus"], ["gpus", "show", "h200"]):
        r = subprocess.run(
            [sys.executable, "-m", "capsim", *args],
            capture_output=True,
            env={**__import__("os").environ, "PYTHONIOENCODING": "ascii"},
            timeout=60,
        )
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        assert b"Traceback" not in r.stderr


@pytest.mark.parametrize(
    "line, says",
    [
        (
            "predict --gpu rtx3090 --model qwen3-8b -c 1 --engine llama.cpp --quant awq-int4",
            "llama.cpp does not load awq-int4 checkpoints",
        ),
        (
            "fit --gpu rtx3090 --model qwen3-8b --engine llama.cpp --quant fp8",
            "llama.cpp does not load fp8 checkpoints",
        ),
        (
            "explain --gpu rtx3090 --model qwen3-8b --engine llama.cpp --quant nvfp4",
            "llama.cpp does not load nvfp4 checkpoints",
        ),
        (
            "predict --gpu rtx3090 --model qwen3-coder-30b-a3b -c 1 --engine llama.cpp "
            "--enable-expert-parallel --tp 2 --gpus 2",
            "--enable-expert-parallel is not llama.cpp's",
        ),
        (
            "explain --gpu rtx3090 --model qwen3-0.6b --engine llama.cpp --async-scheduling",
            "is not llama.cpp's",
        ),
        (
            "explain --gpu rtx3090 --model qwen3-0.6b --engine llama.cpp "
            "--disable-custom-all-reduce --tp 2",
            "--disable-custom-all-reduce is not llama.cpp's",
        ),
        (
            "fit --gpu rtx3090 --model qwen3-0.6b --engine llama.cpp --gpu-memory-utilization 0.5",
            "--gpu-memory-utilization is not llama.cpp's",
        ),
    ],
)
def test_what_llama_cpp_lacks_is_refused_in_every_command(line, says):
    assert_refused(line.split(), says)


def test_llama_cpp_picks_a_gguf_format_where_the_release_one_does_not_fit():
    line = "predict --gpu rtx3090 --model qwen3-coder-30b-a3b -c 1 --requests 4 --engine llama.cpp"
    r = runner.invoke(app, [*line.split(), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["results"][0]["quant"].startswith("gguf-")
    r = runner.invoke(
        app, ["fit", "--gpu", "rtx3090", "--model", "gpt-oss-20b", "--engine", "llama.cpp"]
    )
    assert r.exit_code == 0, r.output
    assert "gguf-mxfp4" in r.output  # the release format (MXFP4) as a GGUF file holds it


def test_workers_die_with_a_command_killed_outright(tmp_path):
    """A worker pool's processes exit when the process that started them is SIGKILLed
    (they held a pipeline's stdout open forever)."""
    import subprocess
    import sys
    import time

    script = tmp_path / "pool.py"
    script.write_text(
        "import os, signal\n"
        "from capsim.engine.pool import worker_pool\n"
        "def pid(_):\n"
        "    return os.getpid()\n"
        "if __name__ == '__main__':\n"
        "    with worker_pool(2) as pool:\n"
        "        pids = sorted(set(pool.map(pid, range(16))))\n"
        "        print(' '.join(map(str, pids)), flush=True)\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    r = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=60)
    pids = [int(p) for p in r.stdout.split()]
    assert pids
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if _running(p)]
        time.sleep(0.1)
    assert not alive, f"workers {alive} outlived their parent"


def _running(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for init to reap it has exited
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--served-model-name", "\x1b[31mx"], "holds a control character"),
        (["--max-model-len", "1"], "leaves no room for any request"),
    ],
)
def test_serve_refuses_a_server_nobody_could_use(extra, says):
    assert_refused(["serve", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", *extra], says)


def test_serve_names_the_address_a_client_can_use():
    from capsim.cli.serve import base_url, free_port

    assert base_url("::1", 8000) == "http://[::1]:8000"
    assert base_url("::", 8000) == "http://[::1]:8000"
    assert base_url("0.0.0.0", 8000) == "http://127.0.0.1:8000"
    assert 0 < free_port("127.0.0.1") < 65536


@pytest.mark.parametrize("folder", ["/", "/proc"])
def test_a_db_that_is_not_a_catalog_directory_is_refused(folder):
    assert_refused(["--db", folder, "gpus"], "is not a catalog directory")


def test_a_db_one_level_too_deep_names_the_folder_above(tmp_path):
    models = tmp_path / "mydb" / "models"
    models.mkdir(parents=True)
    (models / "m.yaml").write_text("name: m\n")
    assert_refused(
        ["--db", str(models), "gpus"], f"pass the folder above it, '{tmp_path / 'mydb'}'"
    )


def test_an_empty_db_folder_is_taken(tmp_path):
    r = runner.invoke(app, ["--db", str(tmp_path), "gpus", "--json"])
    assert r.exit_code == 0, r.output


def test_import_hf_checks_the_hub_id_and_names_out_for_a_bad_folder(tmp_path):
    config = REPO / "tests" / "data" / "hf_configs" / "gemma-4-31b-it" / "config.json"
    base = ["models", "import-hf", str(config), "--name", "x1"]
    assert_refused([*base, "--hf-id", "not an id", "--out", str(tmp_path)], "not a Hugging Face")
    assert_refused([*base, "--out", "/dev/full"], "--out '/dev/full/models/x1.yaml'")


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--gpus", "apple-m4-max", "--power-limits", "0.8"], "the catalog gives none for"),
        (["--gpus", "rtx3090", "--router", "prefix_aware"], "every deployment searched here"),
        (["--gpus", "rtx3090", "--router-latency-ms", "2"], "every deployment searched here"),
    ],
)
def test_plan_refuses_a_flag_no_searched_deployment_can_take(extra, says):
    line = "plan --model qwen3-0.6b --agents 2 --counts 1 --min-agent-tok-s 5"
    assert_refused([*line.split(), *extra], says)
