"""Issue 47, sixth audit: a --set that no model of the command reads, a plan flag that no
searched deployment can take, and capacity's advice for a vLLM DP+EP group."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from capsim.cli.main import app
from tests.test_importers import AIPERF

runner = CliRunner()


def assert_refused(args: list[str], says: str) -> None:
    """``capsim ARGS`` exits 2 with ``says`` in its message (wrapping ignored)."""
    r = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert r.exit_code == 2, r.output
    assert says in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize(
    "line, says",
    [
        (
            "predict --gpu h100-sxm --model llama-3.1-8b -c 1 --set moe_routing_skew=0.5",
            "--set moe_routing_skew applies to models with routed experts",
        ),
        (
            "explain --gpu h100-sxm --model llama-3.1-8b --set moe_layer_overhead_us=30",
            "--set moe_layer_overhead_us applies to models with routed experts",
        ),
        (
            "explain --gpu h100-sxm --model qwen3-30b-a3b --set mla_layer_floor_share=1",
            "--set mla_layer_floor_share applies to models with multi-head latent attention",
        ),
        (
            "plan --model qwen3-8b --agents 8 --gpus rtx3090 --counts 1 --disaggregation",
            "no deployment searched here has two replicas",
        ),
        (  # unified memory: no link in the catalog to move KV between instances over
            "plan --model qwen3-8b --agents 8 --gpus gb10 --counts 1,2 --disaggregation",
            "no deployment searched here has two replicas",
        ),
    ],
)
def test_a_flag_that_changes_nothing_is_refused(line, says):
    assert_refused(line.split(), says)


def test_a_moe_parameter_with_one_moe_model_among_several_is_taken():
    line = (
        "predict --gpu h100-sxm --model llama-3.1-8b,qwen3-30b-a3b -c 1 --requests 8 "
        "--set moe_routing_skew=0.5 --json"
    )
    r = runner.invoke(app, line.split())
    assert r.exit_code == 0, r.output


def test_capacity_doubles_a_vllm_dp_ep_group_not_one_gpu():
    """vLLM --dp 8 --enable-expert-parallel is one group of 8 GPUs: the replica capacity
    suggests is another such group (simulated), not '--gpus 2'."""
    line = (
        "capacity --gpu h200 --model deepseek-r1 --dp 8 --enable-expert-parallel "
        "--min-agent-tok-s 30 --max-ttft-p90-s 0.5 --input-tokens 3200 --output-tokens 800"
    )
    r = runner.invoke(app, line.split(), env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "--gpus 2)" not in text
    assert "another DP+EP group of 8 GPUs behind a router" in text
    # the TTFT change was simulated, not refused
    assert "DP+EP group of 8 GPUs behind a router (a server each): TTFT p90" in text


def test_a_command_with_its_output_closed_exits_cleanly():
    """`capsim gpus >&-` (standard output closed) failed with an AttributeError traceback on
    its first write; what it prints is dropped instead."""
    import subprocess
    import sys

    for args in ("gpus", "fit --gpu rtx3090 --model llama-3.1-8b"):
        done = subprocess.run(
            ["bash", "-c", f"{sys.executable} -m capsim {args} >&-"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr


def small_dataset(tmp_path, edit) -> str:
    """A copy of a small corpus dataset with ``edit(data)`` applied, as a YAML path."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1] / "calibration" / "published"
    data = yaml.safe_load((root / "corpus-client-rtx4090-vllm-mistral7b.yaml").read_text())
    edit(data)
    path = tmp_path / "ds.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


@pytest.mark.parametrize(
    "edit, says",
    [
        (
            lambda d: d["scenarios"][0].setdefault("flags", {}).update(max_num_seqs=float("inf")),
            "flag max_num_seqs is a whole number",
        ),
        (
            lambda d: d["scenarios"][0]["points"][0].update(concurrency=True),
            "a boolean where a number goes",
        ),
        # pydantic reads true as 1: a measurement of 1.0, TP 1 (issue 47's fuzzing)
        (lambda d: d["scenarios"][0]["points"][0].update(value=True), "a boolean where a number"),
        (lambda d: d["scenarios"][0].update(tp=True), "a boolean where a number goes"),
        (lambda d: d["scenarios"][0].update(dp=False), "a boolean where a number goes"),
        (lambda d: d["workload"].update(requests_per_level=True), "a boolean where a number"),
        (
            lambda d: d["scenarios"][0]["points"][0].update(metric="output_tok_s", statistic="p99"),
            "applies to a latency",
        ),
        (
            lambda d: d["scenarios"][0].update(output_mean_tokens_by_level={-4: 100}),
            "that no point measures",
        ),
        (lambda d: d.update(name=""), "at least 1 character"),
        (lambda d: d["workload"].update(decode_context_tokens=True), "a boolean where a number"),
        (lambda d: d["workload"].update(decode_context_tokens=0), "greater than or equal to 1"),
    ],
)
def test_a_dataset_that_would_mislead_is_refused(tmp_path, edit, says):
    assert_refused(["validate", small_dataset(tmp_path, edit)], says)


def test_yaml_with_a_key_twice_or_binary_data_is_refused():
    import yaml

    from capsim.catalog.loader import load_yaml_text

    with pytest.raises(yaml.YAMLError, match="given twice"):
        load_yaml_text("name: a\nname: b\n")
    with pytest.raises(yaml.YAMLError, match="binary"):
        load_yaml_text("v: !!binary aGVsbG8=\n")
    assert load_yaml_text("a: &x [1]\nb: *x\n") == {"a": [1], "b": [1]}


def test_validate_counts_a_file_once(tmp_path):
    path = small_dataset(tmp_path, lambda d: None)
    r = runner.invoke(app, ["validate", path, path])
    assert r.exit_code == 2 and "given twice" in r.output


@pytest.mark.parametrize(
    "line, says",
    [
        (
            "predict --gpu rtx3090 --model llama-3.1-8b -c 1 --set bandwidth_efficiency=0.5 "
            "--set bandwidth_efficiency=0.6",
            "given more than once",
        ),
        (
            "predict --gpu rtx3090,rtx4090,a100-80g,h100-sxm,h200,l40s --model "
            "llama-3.1-8b,qwen3-8b,mistral-7b,gemma-3-4b --tp 1,2,4 -c 1..256 --requests 8",
            "simulations; at most 4,096",
        ),
        (
            "predict --gpu rtx3090 --model llama-3.1-8b --workload open --requests 8 --rate "
            + ",".join(str(i) for i in range(1, 4200)),
            "rates; at most 4,096",
        ),
        (
            "validate calibration/published/corpus-client-rtx4090-vllm-mistral7b.yaml "
            "--write-bands /etc/hostname/b.yaml",
            "is a file, not a folder",
        ),
    ],
)
def test_work_that_cannot_end_well_is_refused_before_it_starts(line, says):
    assert_refused(line.split(), says)


def test_a_forced_plot_replaces_a_link_not_the_file_it_points_to(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("orig")
    link = tmp_path / "plot.png"
    link.symlink_to(victim)
    line = f"predict --gpu rtx3090 --model llama-3.1-8b -c 1 --requests 8 --plot {link} --force"
    r = runner.invoke(app, line.split())
    assert r.exit_code == 0, r.output
    assert victim.read_text() == "orig"
    assert not link.is_symlink() and link.read_bytes()[:4] == b"\x89PNG"


def test_a_misspelt_trace_key_is_refused(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"arrival_time": 0, "input_tokens": 100, "output_tokens": 10, "sesion_id": "a"}\n'
    )
    line = f"predict --gpu rtx3090 --model llama-3.1-8b --workload trace --trace {trace}"
    r = runner.invoke(app, line.split())
    assert r.exit_code == 2 and "did you mean 'session_id'" in r.output


@pytest.mark.parametrize(
    "line, says",
    [
        (
            "predict --gpu rtx3090 --model llama-3.1-8b -c 1 --set allreduce_efficiency=0.5",
            "is read only with GPUs that talk to each other",
        ),
        (
            "predict --gpu rtx3090 --model llama-3.1-8b -c 1 --set drafter_layer_cost=2",
            "is read only with --spec",
        ),
        (
            "predict --gpu rtx3090 --model llama-3.1-8b -c 1 --set compute_power_exponent=1",
            "is read only with --power-limit",
        ),
        (
            "predict --gpu rtx3090 --model llama-3.1-8b -c 1 --set kv_transfer_latency_ms=2",
            "is read only with --prefill-replicas",
        ),
        (
            "predict --gpu rtx3090 --model qwen3-coder-30b-a3b -c 2 --workload batch "
            "--requests 50 --rounds 3",
            "--rounds and --requests both set",
        ),
        ("predict --gpu rtx3090 --model qwen3-coder-30b-a3b -c 1 --force", "none is asked for"),
        (
            "validate calibration/published/corpus-client-rtx4090-vllm-mistral7b.yaml --force",
            "none is asked for",
        ),
    ],
)
def test_a_flag_this_run_never_reads_is_refused(line, says):
    assert_refused(line.split(), says)


def test_a_communication_parameter_with_a_tp_group_among_the_rows_is_taken():
    line = "predict --gpu rtx3090 --model llama-3.1-8b -c 1 --requests 8 --tp 1,2 --set"
    r = runner.invoke(app, [*line.split(), "allreduce_efficiency=0.5", "--json"])
    assert r.exit_code == 0, r.output


def aiperf_with(edit) -> dict:
    import copy

    data = copy.deepcopy(AIPERF)
    edit(data)
    return data


@pytest.mark.parametrize(
    "edit, says",
    [
        (
            lambda d: d["records"]["time_to_first_token"].update(unit="fortnights"),
            "not a time unit AIPerf writes",
        ),
        (lambda d: d["input_config"]["loadgen"].update(concurrency=0), "1 or more"),
        (lambda d: d["input_config"]["loadgen"].update(concurrency="8"), "must be a number"),
        (lambda d: d["records"]["benchmark_duration"].update(avg=0), "above 0 seconds"),
        (
            lambda d: d["input_config"]["endpoint"].update(model_names="abc"),
            "must be a list of names",
        ),
    ],
)
def test_an_aiperf_export_with_a_wrong_field_is_refused(tmp_path, edit, says):
    import json

    path = tmp_path / "export.json"
    path.write_text(json.dumps(aiperf_with(edit)))
    assert_refused(["import", "aiperf", str(path), "--out", str(tmp_path / "run")], says)


def test_an_aiperf_export_in_seconds_reads_as_milliseconds(tmp_path):
    import json

    from capsim.probe.importers import import_aiperf

    path = tmp_path / "export.json"
    in_ms = aiperf_with(lambda d: None)
    path.write_text(json.dumps(in_ms))
    _, (ms_level,), _ = import_aiperf(path)
    in_s = aiperf_with(
        lambda d: d["records"]["time_to_first_token"].update(unit="s", avg=0.095, p50=0.09)
    )
    path.write_text(json.dumps(in_s))
    _, (s_level,), _ = import_aiperf(path)
    assert s_level.metrics.ttft_ms.mean == pytest.approx(ms_level.metrics.ttft_ms.mean)


@pytest.mark.parametrize(
    "line, says",
    [
        (
            "predict --gpu rtx3090 --model qwen3-coder-30b-a3b -c 1 --power-limit 1e30",
            "above 2x rtx3090's TDP",
        ),
        (
            "predict --gpu rtx3090 --model qwen3-coder-30b-a3b -c 1 --engine llama.cpp "
            "--ubatch-size 1000000000000",
            "less than or equal to 1048576",
        ),
        (
            "predict --gpu rtx3090 --model qwen3-coder-30b-a3b -c 1 "
            # 1e-5, a readable number below the range (1e-320 is refused before the range
            # is read, as too small to read: tests/test_refused_round7.py)
            "--gpu-memory-utilization 1e-5",
            "greater than or equal to 0.001",
        ),
        (
            "fit --gpu rtx3090 --model llama-3.1-8b --context 100000 --max-model-len 1000",
            "is longer than --max-model-len",
        ),
    ],
)
def test_values_past_what_a_server_takes_are_refused(line, says):
    assert_refused(line.split(), says)


@pytest.mark.parametrize("name", ["", "../../x", "a,b", "with space", "vllm@1"])
def test_a_catalog_name_a_command_line_cannot_carry_is_refused(tmp_path, name):
    from pathlib import Path

    import yaml

    from capsim.catalog.loader import load_catalog

    src = Path(__file__).resolve().parents[1] / "hardware_db" / "gpus" / "rtx3090.yaml"
    data = yaml.safe_load(src.read_text())
    data["name"] = name
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "x.yaml").write_text(yaml.safe_dump(data))
    from capsim.errors import CapsimUserError

    with pytest.raises(CapsimUserError):
        load_catalog([tmp_path])


def test_an_import_never_writes_over_its_own_input(tmp_path):
    import json

    path = tmp_path / "export.json"
    path.write_text(json.dumps(AIPERF))
    r = runner.invoke(app, ["import", "aiperf", str(path), "--out", str(path), "--force"])
    assert r.exit_code == 2 and "is one of the files this command reads" in r.output
    assert json.loads(path.read_text()) == AIPERF


@pytest.mark.parametrize(
    "args, says",
    [
        (["--write-bands", "b.txt"], "is not a .yaml file"),
        (["--plot", "a\nb.png"], "holds a control character"),
    ],
)
def test_output_names_that_would_mislead_are_refused(tmp_path, monkeypatch, args, says):
    monkeypatch.chdir(tmp_path)
    from pathlib import Path

    ds = Path(__file__).resolve().parents[1] / "calibration" / "published"
    r = runner.invoke(
        app, ["validate", str(ds / "corpus-client-rtx4090-vllm-mistral7b.yaml"), *args]
    )
    assert r.exit_code == 2 and says in r.output
    assert list(tmp_path.iterdir()) == []


def test_a_profile_from_a_pipe_is_named_as_given(tmp_path):
    """--profile /dev/stdin was resolved to '/proc/N/fd/pipe:[M]' and called missing."""
    import subprocess
    import sys

    done = subprocess.run(
        [
            *[sys.executable, "-m", "capsim", "predict", "--gpu", "rtx3090", "--model"],
            *["qwen3-coder-30b-a3b", "-c", "1", "--profile", "/dev/stdin"],
        ],
        input="x\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "'/dev/stdin' is not a regular file" in done.stderr


def test_a_name_too_long_in_bytes_is_blamed_on_the_name(tmp_path):
    line = [
        "calibrate",
        "calibration/published/corpus-client-rtx4090-vllm-mistral7b.yaml",
        "--out",
        str(tmp_path / "cal"),
        "--name",
        "é" * 150,  # 150 characters, 300 bytes
    ]
    r = runner.invoke(app, line)
    assert r.exit_code == 2 and "--name" in r.output and "200 bytes" in r.output


@pytest.mark.parametrize("flag", ["--requests", "--seed", "--max-num-batched-tokens"])
def test_a_whole_number_with_an_underscore_is_refused_as_a_float_is(flag):
    """'--port 1_000' bound port 1000 while '--rate 1_000' was refused: one reading."""
    line = ["predict", "--gpu", "rtx3090", "--model", "qwen3-coder-30b-a3b", "-c", "1"]
    r = runner.invoke(app, [*line, flag, "1_000"])
    assert r.exit_code == 2 and "an '_' in it" in r.output
