"""Hostile files (issue 47): every file capsim reads goes through one reader (capsim.files)
that refuses devices, pipes, folders, oversized and binary files with exit 2 and a message
naming the file, and YAML that expands past a bound; nothing is overwritten without
--force."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from capsim.cli.main import app
from capsim.files import MAX_INPUT_BYTES

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
PREDICT = ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--concurrency", "1"]
LAUGHS = "a: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh", strict=True)
)


def hostile_files(folder: Path) -> dict[str, Path]:
    """One file of each hostile kind, named by kind."""
    files = {}
    files["binary"] = folder / "binary.yaml"
    files["binary"].write_bytes(bytes(range(256)) * 8)
    files["nul"] = folder / "nul.yaml"
    files["nul"].write_bytes(b"name: x\n\x00\x00")
    files["folder"] = folder / "folder.yaml"
    files["folder"].mkdir()
    files["device"] = folder / "zero.json"
    files["device"].symlink_to("/dev/zero")
    files["pipe"] = folder / "pipe.json"
    os.mkfifo(files["pipe"])
    files["oversize"] = folder / "big.yaml"
    with open(files["oversize"], "wb") as f:  # sparse: no disk is spent
        f.truncate(MAX_INPUT_BYTES + 1)
    files["laughs"] = folder / "laughs.yaml"
    files["laughs"].write_text(LAUGHS)
    files["deep"] = folder / "deep.json"  # json.loads: RecursionError; libyaml: its own limit
    files["deep"].write_text("[" * 100_000 + "]" * 100_000)
    files["missing"] = folder / "missing.yaml"
    return files


REASONS = {
    "binary": "not UTF-8 text",
    "nul": "NUL bytes",
    "folder": "folder",
    "device": "not a regular file",
    "pipe": "not a regular file",
    "oversize": "more than the 64 MB",
    "laughs": "expands to more than",
    "missing": "does not exist",
    # json.loads, pydantic's JSON parser, libyaml and the lengths reader each say it their way
    "deep": ("nested too deeply", "recursion limit", "nesting depth", "other than numbers"),
}

COMMANDS = {
    "profile": lambda f: [*PREDICT, "--profile", str(f)],
    "lengths": lambda f: [*PREDICT, "--output-tokens", f"file:{f}"],
    "validate": lambda f: ["validate", str(f)],
    "calibrate": lambda f: ["calibrate", str(f), "--out", str(f.parent / "out.yaml")],
    "import": lambda f: ["import", "vllm-bench", str(f), "--out", str(f.parent / "r.json")],
    "import-hf": lambda f: ["models", "import-hf", str(f), "--name", "x", "--out", str(f.parent)],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_reader_refuses_hostile_files_with_exit_2(command, tmp_path):
    files = hostile_files(tmp_path)
    for kind, path in files.items():
        if kind == "laughs" and command in ("import", "import-hf", "lengths"):
            continue  # JSON readers: YAML aliases mean nothing there
        args = COMMANDS[command](path)
        if kind in ("device", "pipe"):
            # a subprocess, so a reader that blocked on the pipe or read /dev/zero forever
            # fails the test on its timeout instead of hanging the suite
            r = subprocess.run(
                [sys.executable, "-m", "capsim", *args],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=tmp_path,
            )
            code, out = r.returncode, r.stdout + r.stderr
        else:
            result = runner.invoke(app, args)
            code, out = result.exit_code, result.output
        assert code == 2, (command, kind, out)
        assert "Traceback" not in out, (command, kind, out)
        # --profile also takes a name: a path that is not there is an unknown profile
        reason = "unknown profile" if (command, kind) == ("profile", "missing") else REASONS[kind]
        if (command, kind) == ("lengths", "oversize"):
            reason = "more than the 8 MB"  # a lengths file has a lower bound of its own
        reasons = reason if isinstance(reason, tuple) else (reason,)
        assert any(r in out for r in reasons), (command, kind, out)


def test_a_catalog_overlay_file_that_is_hostile_is_named(tmp_path):
    for kind, content in (("binary", bytes(range(256))), ("laughs", LAUGHS.encode())):
        db = tmp_path / kind / "gpus"
        db.mkdir(parents=True)
        (db / "x.yaml").write_bytes(content)
        r = runner.invoke(app, ["--db", str(db.parent), "gpus"])
        assert r.exit_code == 2, r.output
        assert "x.yaml" in r.output and REASONS[kind] in r.output


def test_nothing_is_overwritten_without_force(tmp_path):
    plot = tmp_path / "chart.png"
    plot.write_bytes(b"mine")
    r = runner.invoke(app, [*PREDICT, "--plot", str(tmp_path / "chart")])
    assert r.exit_code == 2 and "--force" in r.output
    assert plot.read_bytes() == b"mine"
    r = runner.invoke(app, [*PREDICT, "--plot", str(plot), "--force"])
    assert r.exit_code == 0, r.output
    assert plot.read_bytes().startswith(b"\x89PNG")
    run = tmp_path / "run.json"
    run.write_text("{}")
    # refused before any connection is tried (nothing listens on port 9)
    r = runner.invoke(
        app,
        [
            "probe",
            "--url",
            "http://127.0.0.1:9",
            "--model",
            "m",
            "--concurrency",
            "1",
            "--out",
            str(run),
        ],
    )
    assert r.exit_code == 2 and "exists" in r.output and run.read_text() == "{}"
    r = runner.invoke(app, ["validate", "--write-bands", str(run)])
    assert r.exit_code == 2 and run.read_text() == "{}"
    profile = tmp_path / "p.yaml"
    profile.write_text("mine")
    seed = (
        Path(__file__).resolve().parent.parent
        / "calibration/published/seed002-rtx3090-moe-vs-dense.yaml"
    )
    r = runner.invoke(app, ["calibrate", str(seed), "--out", str(profile)])
    assert r.exit_code == 2 and profile.read_text() == "mine"


def test_a_bad_url_or_address_is_exit_2():
    for url in ("http://[::1", "ftp://host", "http://", "not a url"):
        r = runner.invoke(app, ["probe", "--url", url, "--model", "m", "--concurrency", "1"])
        assert r.exit_code == 2 and "Traceback" not in r.output, (url, r.output)
    r = runner.invoke(
        app, ["serve", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--host", "999.1.1.1"]
    )
    assert r.exit_code == 2 and "--host" in r.output, r.output
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = runner.invoke(
            app, ["serve", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--port", str(port)]
        )
    assert r.exit_code == 2 and "cannot listen" in r.output, r.output


def test_no_name_writes_outside_the_folder_named(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    config = tmp_path / "config.json"
    config.write_text(
        '{"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 2, '
        '"num_attention_heads": 8, "vocab_size": 1000, "intermediate_size": 2048, '
        '"max_position_embeddings": 4096}'
    )
    seed = Path(__file__).resolve().parent.parent / "calibration/published"
    for name in ("../escape", "..", "a/b", ".hidden", "x\\y", "tab\tname"):
        for args in (
            ["models", "import-hf", str(config), "--name", name, "--out", str(folder)],
            [
                "calibrate",
                str(seed / "seed002-rtx3090-moe-vs-dense.yaml"),
                "--name",
                name,
                "--out",
                str(folder),
            ],
        ):
            r = runner.invoke(app, args)
            assert r.exit_code == 2 and "--name" in r.output, (name, r.output)
    assert not list(tmp_path.glob("*.yaml")) and not list(folder.rglob("*.yaml"))


def test_a_hostile_run_log_is_refused_line_by_line_with_exit_2(tmp_path):
    """The run log is read a line at a time (a 119 MB log took 1.2 GB when read whole and
    kept as events, 0.6 GB now); the reader's checks hold there too."""
    from capsim.files import MAX_LOG_BYTES

    logs = {
        "not UTF-8 text": b'{"type": "header"}\n' + bytes(range(128, 256)) + b"\n",
        "NUL bytes (line 2)": b'{"type": "header"}\n{"a": 1}\x00\n',
    }
    for reason, content in logs.items():
        path = tmp_path / f"{len(content)}.jsonl"
        path.write_bytes(content)
        r = runner.invoke(app, ["probe", "summarize", str(path)])
        assert r.exit_code == 2 and reason in r.output, r.output
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:  # sparse: no disk is spent
        f.truncate(MAX_LOG_BYTES + 1)
    r = runner.invoke(app, ["probe", "summarize", str(big)])
    assert r.exit_code == 2 and f"more than the {MAX_LOG_BYTES >> 20} MB" in r.output, r.output


def test_errors_in_a_file_name_its_line(tmp_path):
    """Issue 47: 'file:line: field: problem', one line, instead of the parser's five lines
    about '<unicode string>' or a field path with no line to look at."""
    source = ROOT / "calibration/published/corpus-inferencex-h100-gptoss120b-vllm-1k1k.yaml"
    lines = source.read_text().splitlines(keepends=True)
    target = next(i for i, line in enumerate(lines) if line.strip().startswith("- concurrency:"))
    lines[target] = lines[target].split(":")[0] + ": -3\n"
    bad = tmp_path / "bad.yaml"
    bad.write_text("".join(lines))
    r = runner.invoke(app, ["validate", str(bad)])
    first = r.stderr.splitlines()[0]
    assert r.exit_code == 2 and f"{bad}:{target + 1}: invalid entry: scenarios.0.points.0" in first
    assert "concurrency: Input should be greater than or equal to 1" in first
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nscenarios: [1, 2\nmore: 3\n")
    r = runner.invoke(app, ["validate", str(broken)])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "line 3, column 5" in r.stderr and "<unicode string>" not in r.stderr


def test_a_path_no_file_can_have_is_exit_2():
    """A name longer than the file system takes (--profile 'aaa...') was an OSError
    traceback from Path.exists()."""
    r = runner.invoke(app, [*PREDICT, "--profile", "a" * 300])
    assert r.exit_code == 2 and "unknown profile" in r.stderr and "Traceback" not in r.output


@pytest.mark.parametrize(
    "command",
    [
        ["validate", "{path}"],
        ["import", "vllm-bench", "{path}", "--out", "{out}"],
        ["calibrate-kernels", "{path}"],
    ],
)
def test_a_json_document_of_too_many_objects_is_refused_before_it_is_parsed(tmp_path, command):
    """Parsed, each object or array costs 60-250 bytes and a schema's report on it more: a
    60 MB '[{},{},...]' under the size limit took validate to 3.2 GB. Over
    MAX_JSON_CONTAINERS they are refused, by count, before any parse."""
    from capsim.files import MAX_JSON_CONTAINERS

    path = tmp_path / "many.json"
    path.write_text("[" + ",".join(["{}"] * (MAX_JSON_CONTAINERS + 1)) + "]")
    args = [a.format(path=path, out=tmp_path / "out.json") for a in command]
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "objects and arrays" in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "out.json").exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
@pytest.mark.parametrize("args", [["gpus", "--json"], ["gpus"], ["models", "--json"]])
def test_output_that_cannot_be_written_is_one_line_and_exit_2(args):
    """stdout on a full disk (/dev/full answers every write with ENOSPC): the command says
    it could not write, exit 2; it was an OSError traceback, or an exception ignored at
    the interpreter's exit."""
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-m", "capsim", *args],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
    assert r.returncode == 2, r.stderr
    assert "cannot write the output: No space left on device" in r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr


def test_a_reader_that_leaves_early_is_no_error():
    """`capsim gpus --json | head -1`: the reader closing the pipe is what it wanted."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "capsim", "gpus", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err and b"cannot write" not in err, err


@pytest.mark.parametrize("speedup", ["1e-300", "0.0009", "1001", "0", "nan"])
def test_serve_speedup_outside_its_range_is_refused(speedup):
    """--speedup 1e-300 was accepted and every request then waited forever."""
    r = runner.invoke(
        app, ["serve", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--speedup", speedup]
    )
    assert r.exit_code == 2 and "--speedup" in r.output, r.output
    assert "0.001" in r.output or "finite" in r.output, r.output


def test_a_catalog_overlay_of_more_yaml_than_a_catalog_holds_is_refused(tmp_path):
    """300 overlay files of 0.9 MB each (each under the per-file limit) took a start-up to
    2.2 GB and wrote a 278 MB cache it would never read back."""
    from capsim.catalog.loader import MAX_CATALOG_BYTES

    (tmp_path / "gpus").mkdir()
    with open(tmp_path / "gpus" / "big.yaml", "wb") as f:  # sparse: no disk is spent
        f.truncate(MAX_CATALOG_BYTES + 1)
    cache = tmp_path / "cache"
    r = subprocess.run(
        [sys.executable, "-m", "capsim", "--db", str(tmp_path), "gpus"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "CAPSIM_CACHE_DIR": str(cache)},
    )
    assert r.returncode == 2 and "MB of YAML, more than the 16 MB" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (
            ("memory_bandwidth_gb_s: 936", "memory_bandwidth_gb_s: 1e-300"),
            "greater than or equal to 1",
        ),
    ],
)
def test_an_overlay_gpu_of_impossible_figures_is_refused(tmp_path, edit, words):
    """A bandwidth of 1e-300 GB/s was simulated: 5e-302 tok/s in a broken table."""
    src = (ROOT / "hardware_db" / "gpus" / "rtx3090.yaml").read_text()
    assert edit[0] in src
    (tmp_path / "gpus").mkdir()
    text = src.replace(edit[0], edit[1]).replace("name: rtx3090", "name: odd3090")
    text = text.replace('aliases: ["3090", rtx-3090, geforce-rtx-3090]', "aliases: []")
    (tmp_path / "gpus" / "odd.yaml").write_text(text)
    r = runner.invoke(app, ["--db", str(tmp_path), "gpus"], env={"CAPSIM_NO_CACHE": "1"})
    assert r.exit_code == 2 and words in r.output, r.output


def test_a_model_whose_query_heads_do_not_group_over_its_kv_heads_is_refused():
    """num_attention_heads 7 with num_kv_heads 8 was accepted and simulated."""
    import yaml
    from pydantic import ValidationError

    from capsim.catalog.model_schema import Model

    data = yaml.safe_load((ROOT / "hardware_db" / "models" / "llama-3.1-8b.yaml").read_text())
    Model.model_validate(data)
    data |= {"num_attention_heads": 7, "num_kv_heads": 8}
    with pytest.raises(ValidationError, match="must be a multiple of num_kv_heads"):
        Model.model_validate(data)


def test_a_kernel_fit_of_no_more_rows_than_parameters_is_refused(tmp_path):
    """One row fitted four parameters and reported standard errors of 1e-17 and 'MAPE 0.0%'."""
    import json

    data = json.loads((ROOT / "calibration/kernels/h100-sxm-decode-layers.json").read_text())
    data["rows"] = data["rows"][:1]
    path = tmp_path / "one-row.json"
    path.write_text(json.dumps(data))
    r = runner.invoke(app, ["calibrate-kernels", str(path)])
    assert r.exit_code == 2 and "1 usable row cannot pin 4 parameters" in r.output, r.output


def test_an_output_in_a_system_folder_is_refused_before_any_work(tmp_path):
    """'calibrate --out /proc/x.yaml' ran its fit (36 s) and then failed naming its
    temporary file."""
    dataset = ROOT / "calibration/published/seed002-rtx3090-moe-vs-dense.yaml"
    r = runner.invoke(app, ["calibrate", str(dataset), "--out", "/proc/capsim-test.yaml"])
    assert r.exit_code == 2 and "a folder of devices and system state" in r.output, r.output


def test_links_and_catalog_paths_are_described_as_what_they_are(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    r = runner.invoke(app, ["validate", str(tmp_path / "a")])
    assert r.exit_code == 2 and "loop of links" in r.output, r.output
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    r = runner.invoke(app, ["--db", str(plain), "gpus"])
    assert r.exit_code == 2 and "is not a directory" in r.output, r.output


def test_a_run_log_whose_chunks_come_before_their_send_is_refused(tmp_path):
    """Chunk times of 0.5 s, before the sends, were summarised into nonsense gaps."""
    import json

    src = ROOT / "calibration/runs/kv-read-2026-11-27/cpu-vllm-tiny-llama-r1-c1-n128.jsonl"
    lines = []
    for line in src.read_text().splitlines():
        event = json.loads(line)
        if event.get("type") == "request":
            event["chunk_times"] = [0.0] * len(event["chunk_times"])
        lines.append(json.dumps(event))
    log = tmp_path / "bad.jsonl"
    log.write_text("\n".join(lines) + "\n")
    r = runner.invoke(app, ["probe", "summarize", str(log)])
    assert r.exit_code == 2 and "comes before send" in r.output, r.output


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ({"engine_flags": {"max-model-len": "abc"}}, "the engine flag max-model-len is 'abc'"),
        ({"engine_flags": {"max-num-seqs": "-1"}}, "the engine flag max-num-seqs is '-1'"),
        ({"cache_config": {"num_gpu_blocks": "abc", "block_size": 16}}, "num_gpu_blocks is 'abc'"),
        ({"cache_config": {"num_gpu_blocks": 10, "block_size": "16.5"}}, "block_size is '16.5'"),
        ({"cache_config": "x"}, None),  # not vLLM's: no KV capacity, no error
        # the header's own fields, named as the run file has them (they were named as the
        # flags predict takes: '--tp -2', 'cannot read --spec')
        ({"deployment": {"tp": -2}}, "header.deployment.tp: input should be greater than"),
        ({"deployment": {"spec": "xx"}}, "header.deployment.spec: cannot read spec 'xx'"),
        ({"header": {"input_tokens": -5}}, "header.input_tokens: cannot read the workload's"),
        ({"header": {"output_tokens": "foo:1"}}, "header.output_tokens: cannot read"),
        ({"header": {"workload": "zigzag"}}, "header.workload: unknown workload kind 'zigzag'"),
    ],
)
def test_a_run_file_of_nonsense_engine_figures_is_refused_by_name(tmp_path, edit, words):
    """A hand-edited run summary with 'max-model-len: abc' or a cache_config that is not an
    object was a ValueError or AttributeError traceback in validate and calibrate."""
    import json

    data = json.loads((ROOT / "calibration/runs/cpu-vllm-tiny-qwen3.json").read_text())
    header = data["header"]
    if "engine_flags" in edit:
        header["deployment"]["engine_flags"] = edit["engine_flags"]
    if "cache_config" in edit:
        header["server"]["cache_config"] = edit["cache_config"]
    header["deployment"].update(edit.get("deployment", {}))
    header.update(edit.get("header", {}))
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    r = runner.invoke(app, ["validate", str(path)])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.output
    assert "Traceback" not in r.output
    if words is None:
        assert r.exit_code == 0, r.output
    else:
        assert r.exit_code == 2 and words in r.output, r.output


def test_validate_with_nothing_to_validate_is_exit_2(tmp_path):
    """It printed 'MAPE over 0 points: nan%' and exited 0."""
    import yaml

    data = yaml.safe_load(
        (ROOT / "calibration/published/seed002-rtx3090-moe-vs-dense.yaml").read_text()
    )
    for scenario in data["scenarios"]:
        scenario["points"] = []
    path = tmp_path / "empty.yaml"
    path.write_text(yaml.safe_dump(data))
    r = runner.invoke(app, ["validate", str(path)])
    # a scenario without points is refused where the file is read (naming its line)
    assert r.exit_code == 2 and "points: List should have at least 1 item" in r.output, r.output


def test_a_lengths_file_of_booleans_is_refused(tmp_path):
    path = tmp_path / "b.json"
    path.write_text("[true, true]")
    r = runner.invoke(app, [*PREDICT, "--input-tokens", f"file:{path}"])
    assert r.exit_code == 2 and "something other than numbers" in r.output, r.output


@pytest.mark.parametrize(
    ("line", "mended", "words"),
    [
        ("  tp: 8", "  tp: -8", ":67: invalid entry: scenarios.0.tp: Input should be greater"),
        (
            "  kind: closed",
            "  kind: zig",
            ":14: invalid entry: workload.kind: unknown",
        ),
        ("  input_tokens: '3200'", "  input_tokens: '-1'", "cannot read the workload's input"),
    ],
)
def test_a_dataset_field_predict_cannot_read_is_named_with_its_line(tmp_path, line, mended, words):
    """A published dataset's TP, workload kind and lengths are checked where it is read,
    named by file, line and field (they were refused at simulation as '--tp -8')."""
    source = ROOT / "calibration/published"
    text = (source / "corpus-dstack-dsr1-h200-sglang-dpattn-trtllm-3200in-800out.yaml").read_text()
    assert line + "\n" in text
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace(line + "\n", mended + "\n", 1))
    r = runner.invoke(app, ["validate", str(path)])
    assert r.exit_code == 2 and words in r.output, r.output


@pytest.mark.parametrize(
    ("section", "source", "edit", "words"),
    [
        ("models", "llama-3.1-8b", ("dtype: bf16", "dtype: int3"), "dtype 'int3' is not a"),
        (
            "efficiency",
            "datacenter-hopper",
            ("bandwidth_efficiency: 0.83", "bandwidth_efficiency: .nan"),
            "params.bandwidth_efficiency: Input should be a finite number",
        ),
        (
            "efficiency",
            "datacenter-hopper",
            ("layer_overhead_graph_us: 36", "layer_overhead_graph_us: 1.0e+12"),
            "is 1000000000000.0; an efficiency parameter is a finite number",
        ),
        (
            "efficiency",
            "datacenter-hopper",
            ("bandwidth_efficiency: 0.83", "bandwith_efficiency: 0.83"),
            "unknown efficiency parameter(s): ['bandwith_efficiency']",
        ),
        (
            "efficiency",
            "datacenter-hopper",
            ("bandwidth_efficiency: 0.83", "bandwidth_efficiency: -1"),
            "params: bandwidth_efficiency: input should be greater than or equal to 0.001",
        ),
        (  # a typo in an engine's weight_only_formats would change nothing without a word
            "engines",
            "vllm",
            ("weight_only_formats: [mxfp4]", "weight_only_formats: [mxpf4]"),
            "weight_only_formats: 'mxpf4' is not a weight format",
        ),
    ],
)
def test_an_overlay_entry_naming_what_does_not_exist_is_refused_by_file(
    tmp_path, section, source, edit, words
):
    """A model whose dtype is no weight format, and an efficiency file with an unknown,
    NaN, negative or absurd parameter, ended in a KeyError or ValueError traceback at
    predict (issue 47): now exit 2 naming the file."""
    text = (ROOT / "hardware_db" / section / f"{source}.yaml").read_text()
    old, new = edit
    assert old in text
    folder = tmp_path / "db" / section
    folder.mkdir(parents=True)
    (folder / f"{source}.yaml").write_text(text.replace(old, new, 1))
    r = runner.invoke(app, ["--db", str(tmp_path / "db"), *PREDICT, "--requests", "8"])
    assert r.exit_code == 2, r.output
    assert words in r.output and f"{source}.yaml" in r.output, r.output


def test_a_gpu_of_a_class_without_priors_is_refused_by_file(tmp_path):
    """A GPU whose hardware_class names no efficiency file (a typo) took the generic
    priors without a word (issue 47's third audit)."""
    text = (ROOT / "hardware_db" / "gpus" / "h100-sxm.yaml").read_text()
    assert "hardware_class: datacenter-hopper" in text
    folder = tmp_path / "db" / "gpus"
    folder.mkdir(parents=True)
    mended = text.replace("hardware_class: datacenter-hopper", "hardware_class: datacenter-hoper")
    (folder / "h100-sxm.yaml").write_text(mended)
    r = runner.invoke(app, ["--db", str(tmp_path / "db"), *PREDICT, "--requests", "8"])
    assert r.exit_code == 2, r.output
    assert "hardware_class 'datacenter-hoper' has no efficiency file" in r.output
    assert "did you mean: datacenter-hopper" in r.output


def test_a_boolean_where_the_catalog_wants_a_number_is_refused(tmp_path):
    """'num_layers: true' ran as a one-layer model (pydantic reads true as 1)."""
    text = (ROOT / "hardware_db" / "models" / "llama-3.1-8b.yaml").read_text()
    assert "num_layers: 32" in text
    folder = tmp_path / "db" / "models"
    folder.mkdir(parents=True)
    (folder / "llama-3.1-8b.yaml").write_text(text.replace("num_layers: 32", "num_layers: true"))
    r = runner.invoke(app, ["--db", str(tmp_path / "db"), *PREDICT, "--requests", "8"])
    assert r.exit_code == 2 and "num_layers: a number, not true" in r.output, r.output


def test_a_quoted_number_or_an_alias_that_another_name_shadows_is_refused(tmp_path):
    """An overlay GPU's 'memory_gb: "24"' was read as 24, and its alias 'h100-sxm' never
    reached it (the built-in entry of that name answers first): both were silent (issue
    47's fuzzing)."""
    import yaml

    text = (ROOT / "hardware_db" / "gpus" / "rtx3090.yaml").read_text()
    assert "memory_gb: 24" in text
    folder = tmp_path / "db" / "gpus"
    folder.mkdir(parents=True)
    mine = folder / "my-gpu.yaml"
    mine.write_text(text.replace("memory_gb: 24", 'memory_gb: "24"'))
    r = runner.invoke(app, ["--db", str(tmp_path / "db"), "gpus"])
    assert r.exit_code == 2 and "memory_gb: a number, not the text '24'" in r.output, r.output
    data = yaml.safe_load(text)
    data.update(name="my-gpu", aliases=["h100-sxm"])
    mine.write_text(yaml.safe_dump(data, sort_keys=False))
    r = runner.invoke(app, ["--db", str(tmp_path / "db"), "gpus"])
    assert r.exit_code == 2, r.output
    assert "alias 'h100-sxm' of my-gpu is the name of another entry" in " ".join(r.output.split())


def test_a_kernel_fit_of_a_term_no_row_depends_on_is_refused():
    """--fit frontend_request_ms on fused-MoE timings 'fitted' it to its prior with a
    standard error of 0 (issue 47's fourth audit)."""
    from capsim.calibration.paths import calibration_dir

    path = calibration_dir() / "kernels" / "ada-fused-moe-public.json"
    r = runner.invoke(app, ["calibrate-kernels", str(path), "--fit", "frontend_request_ms"])
    assert r.exit_code == 2 and "no kernel row depends on frontend_request_ms" in r.output
    r = runner.invoke(app, ["calibrate-kernels", str(path), "--fit", "moe_bandwidth_efficiency"])
    assert r.exit_code == 0, r.output
