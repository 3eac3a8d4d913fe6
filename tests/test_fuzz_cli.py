"""Every flag of every command, given random values (zero, negative, huge, malformed):
capsim answers with its output or a one-line error (exit 2), never a Python traceback."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from capsim.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "calibration" / "runs" / "cpu-vllm-tiny-qwen3.json"
KERNELS = ROOT / "calibration" / "kernels" / "h100-sxm-decode-layers.json"
CLOSED_PORT = "http://127.0.0.1:9"

BASE: dict[str, list[str]] = {
    "gpus": [],
    "gpus show": ["rtx3090"],
    "models": [],
    "models show": ["qwen3-8b"],
    "models import-hf": ["no-such-config.json"],
    "quants": [],
    "engines": [],
    "fit": ["--gpu", "rtx3090", "--model", "qwen3-8b"],
    "explain": ["--gpu", "rtx3090", "--model", "qwen3-8b"],
    "predict": [
        "--gpu",
        "rtx3090",
        "--model",
        "qwen3-8b",
        "--concurrency",
        "1,2",
        "--requests",
        "8",
        "--output-tokens",
        "32",
    ],
    "capacity": [
        "--gpu",
        "rtx3090",
        "--model",
        "qwen3-8b",
        "--min-agent-tok-s",
        "30",  # binds at tens of agents (at 5 tok/s, 477: a search of seconds a value)
        "--output-tokens",
        "32",
    ],
    "plan": [
        "--model",
        "qwen3-8b",
        "--agents",
        "2",
        "--gpus",
        "rtx3090",
        "--counts",
        "1",
        "--output-tokens",
        "32",
    ],
    "validate": [str(RUN)],
    "calibrate": [str(RUN), "--fit", "step_overhead_us"],
    "calibrate-kernels": [str(KERNELS)],
    "probe": [
        "--url",
        CLOSED_PORT,
        "--model",
        "m",
        "--concurrency",
        "1",
        "--requests",
        "1",
        "--no-warmup",
        "--timeout",
        "2",
    ],
    "probe summarize": [str(RUN)],
    "serve": ["--gpu", "rtx3090", "--model", "qwen3-8b"],
    "import vllm-bench": ["no-such-result.json"],
    "import guidellm": ["no-such-result.json"],
    "import aiperf": ["no-such-result.json"],
}
"""Arguments that make each command quick, laid under the fuzzed flag."""

SIZE_FLAGS = {
    "--requests",
    "--concurrency",
    "--agents",
    "--rounds",
    "--turns",
    "--runs",
    "--counts",
    "--input-tokens",
    "--output-tokens",
    "--rate",
    "--tool-tokens",
}
"""Flags whose large valid values are real work (a billion requests runs, slowly): fuzzed
with bad values only."""

SLOW_COMMANDS = {"calibrate", "validate", "plan", "capacity", "calibrate-kernels"}

BAD_VALUES = [
    "0",
    "-1",
    "-5",
    "-1e9",
    "1e999",
    "nan",
    "inf",
    "-inf",
    "",
    " ",
    "abc",
    "1..",
    "..5",
    "5..1",
    "1,,2",
    "x=y",
    "=",
    ":",
    "%",
    "1.5",
    "0.0",
    "-0",
    "99999999999999999999",
    "1e-300",
    "☃",
    "--",
    "../../etc/passwd",
]
HUGE_VALUES = ["1e12", "123456789", "1000000"]


COMMAND_LINE = typer.main.get_command(app)
"""capsim's click command, built once (typer takes about 0.2 s to build it)."""


def command_params(path: str) -> list:
    command = COMMAND_LINE
    for part in path.split():
        command = command.commands[part]
    return [
        p
        for p in command.params
        if getattr(p, "opts", None)
        and p.opts[0].startswith("--")
        and not getattr(p, "is_flag", False)
        and p.opts[0] not in ("--db", "--plot", "--out", "--help")
    ]


def values(flag: str):
    bad = st.sampled_from(BAD_VALUES) | st.text(
        alphabet=string.printable + "é☃", min_size=0, max_size=12
    ).filter(lambda s: not s.startswith("-"))
    if flag in SIZE_FLAGS:
        return bad
    return bad | st.sampled_from(HUGE_VALUES) | st.integers(-(10**15), 10**15).map(str)


def check(path: str, args: list[str]) -> None:
    path, base = WORKLOAD_BASES[path][:2] if path in WORKLOAD_BASES else (path, BASE[path])
    result = CliRunner().invoke(app, [*path.split(), *base, *args])
    where = f"capsim {path} {' '.join(base + args)}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{where}: {result.exception!r}"
    )
    assert "Traceback" not in result.output, where
    assert result.exit_code in (0, 1, 2, 130), f"{where}: exit {result.exit_code}"
    if result.exit_code == 2:
        assert result.stderr.strip(), f"{where}: exit 2 without a message"


ONE_GPU = ["--gpu", "rtx3090", "--model", "qwen3-8b"]
WORKLOAD_BASES: dict[str, tuple[str, list[str], list[str]]] = {
    "predict@open": (
        "predict",
        [*ONE_GPU, "--workload", "open", "--rate", "2", "--arrival", "gamma", "--requests", "8"],
        ["--rate", "--gamma-cv", "--arrival", "--requests"],
    ),
    "predict@agents": (
        "predict",
        [*ONE_GPU, "--workload", "agents", "--concurrency", "2", "--turns", "2"],
        ["--turns", "--think-time", "--tool-tokens", "--concurrency"],
    ),
}
"""The flags that only a workload other than the default reads, fuzzed under that workload
(issue 47: --gamma-cv 0 with gamma arrivals divided by zero; the default closed workload
never read it). Name: (command, quick arguments, the flags fuzzed)."""

CASES = [(path, param.opts[0]) for path in sorted(BASE) for param in command_params(path)] + [
    (path, None) for path in sorted(BASE) if not command_params(path)
]
CASES += [(name, flag) for name, (_, _, flags) in WORKLOAD_BASES.items() for flag in flags]


@pytest.mark.parametrize(("path", "flag"), CASES, ids=[f"{p}:{f}" for p, f in CASES])
def test_every_flag_of_every_command_takes_any_value_without_a_traceback(
    path, flag, tmp_path, monkeypatch
):
    # a flag that names a file (validate --write-bands 0) writes it here, not in the checkout
    monkeypatch.chdir(tmp_path)
    # serve checks its flags and builds the deployment, then would listen forever
    monkeypatch.setattr("capsim.cli.serve.run_server", lambda *args, **kwargs: None)
    if flag is None:
        check(path, [])
        return
    extra = ["--out", str(tmp_path / "p.yaml")] if path == "calibrate" else []

    @settings(
        max_examples=3 if path in SLOW_COMMANDS else 6,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(value=values(flag))
    def fuzz(value):
        check(path, [f"{flag}={value}", *extra])

    fuzz()


def test_every_command_has_quick_arguments_for_the_fuzz():
    command = COMMAND_LINE
    paths = []
    for name, sub in command.commands.items():
        if getattr(sub, "commands", None):
            if sub.callback is not None and name != "import":
                paths.append(name)
            paths += [f"{name} {n}" for n in sub.commands]
        else:
            paths.append(name)
    assert set(paths) <= set(BASE), set(paths) - set(BASE)


@pytest.mark.parametrize("text", ["[/x]", "[red]x", "[bold]", "a[/]b"])
def test_user_text_is_never_read_as_rich_markup(text):
    """Issue 47's battery: a name that looks like rich markup is quoted as typed in the
    error (it was a MarkupError traceback, or lost its brackets)."""
    r = CliRunner().invoke(app, ["predict", "--gpu", text, "--model", "llama-3.1-8b"])
    assert r.exit_code == 2 and text in r.stderr and "Traceback" not in r.output


@pytest.mark.parametrize(
    ("target", "words"),
    [("", "is empty"), ("/dev/full", "device"), ("a" * 300 + ".png", "longer than")],
)
def test_plot_targets_that_cannot_be_files_are_refused_before_work(tmp_path, target, words):
    path = target if target.startswith("/") or not target else str(tmp_path / target)
    args = ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "-c", "1"]
    r = CliRunner().invoke(app, [*args, "--plot", path, "--force"])
    assert r.exit_code == 2 and words in r.stderr, r.output
    r = CliRunner().invoke(app, [*args, "--plot", str(tmp_path)])  # a folder
    assert r.exit_code == 2 and "is a folder" in r.stderr


TRACE_OK = '{"arrival_time": 0, "input_tokens": 100, "output_tokens": 20}\n'


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('{"arrival_time": Infinity, "input_tokens": 100, "output_tokens": 20}', "between"),
        ('{"arrival_time": -100, "input_tokens": 100, "output_tokens": 20}', "between"),
        ('{"arrival_time": 1, "input_tokens": ' + "9" * 400 + ', "output_tokens": 20}', "between"),
        ('{"arrival_time": 1, "input_tokens": -5, "output_tokens": 20}', "between"),
        ('{"arrival_time": 1, "input_tokens": "55", "output_tokens": 20}', "a number"),
        ('{"arrival_time": 1, "input_tokens": 1.9, "output_tokens": 20}', "whole number"),
        ('{"arrival_time": 1, "input_tokens": 9, "output_tokens": 2, "session_id": {}}', "session"),
        ("[1, 2, 3]", "not a JSON object"),
    ],
)
def test_bad_trace_records_are_exit_2_naming_the_line(tmp_path, line, words):
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE_OK + line + "\n")
    args = ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--workload", "trace"]
    r = CliRunner().invoke(app, [*args, "--trace", str(trace)])
    assert r.exit_code == 2 and ":2:" in r.stderr and words in r.stderr, r.output


def test_files_with_values_no_reader_takes_are_exit_2(tmp_path):
    """Issue 47's battery: a 5,000-digit integer in a YAML dataset, a measured value of
    infinity, a kernel row of negative batch, a profile naming a parameter capsim lacks."""
    runner = CliRunner()
    huge = tmp_path / "huge.yaml"
    huge.write_text("x: " + "9" * 5000 + "\n")
    r = runner.invoke(app, ["validate", str(huge)])
    assert r.exit_code == 2 and "digits" in r.stderr
    source = "calibration/published/corpus-inferencex-h100-gptoss120b-vllm-1k1k.yaml"
    seed = Path(source).read_text()
    import re

    first = re.search(r"(?m)^(\s+)value: .*$", seed)
    inf = tmp_path / "inf.yaml"
    inf.write_text(seed[: first.start()] + first.group(1) + "value: .inf" + seed[first.end() :])
    r = runner.invoke(app, ["validate", str(inf)])
    assert r.exit_code == 2 and "finite" in r.stderr
    import json

    kernels = json.loads(Path("calibration/kernels/h200-decode-layers.json").read_text())
    kernels["rows"][0]["batch"] = -1
    bad = tmp_path / "k.json"
    bad.write_text(json.dumps(kernels))
    r = runner.invoke(app, ["calibrate-kernels", str(bad)])
    assert r.exit_code == 2 and "rows.0.batch" in r.stderr
    profile = Path("calibration/profiles/consumer-ampere-vllm.yaml").read_text()
    odd = tmp_path / "p.yaml"
    odd.write_text(
        profile.replace(
            "parameters:\n",
            "parameters:\n  no_such_knob:\n    value: 1\n    prior: 1\n"
            "    identifiable: true\n    bounds: [0, 2]\n",
            1,
        )
    )
    r = runner.invoke(
        app,
        [
            "predict",
            "--gpu",
            "rtx3090",
            "--model",
            "llama-3.1-8b",
            "-c",
            "1",
            "--profile",
            str(odd),
        ],
    )
    assert r.exit_code == 2 and "no_such_knob" in r.stderr


@pytest.mark.parametrize(
    "args",
    [
        [
            "plan",
            "--model",
            "llama-3.1-8b",
            "--gpus",
            "h100-sxm",
            "--agents",
            "4",
            "--router-latency-ms",
            "nan",
        ],
        ["capacity", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--max-ttft-p90", "inf"],
        ["probe", "--url", "http://127.0.0.1:99999", "--model", "m"],
        ["probe", "--url", "ftp://x", "--model", "m"],
        ["models", "show", "x" * 300 + ".json"],
        ["explain", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--batch", "9" * 20],
    ],
)
def test_values_out_of_any_range_are_exit_2_up_front(args):
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("value", ["2.0", "1e3", "0x10", "2.", "two"])
def test_integer_flags_take_whole_numbers_only(value):
    """Issue 47: '--requests 2.0' ran as 2 (typer reads integers through pydantic's lax
    mode); every integer flag now refuses what is not written as a whole number."""
    base = ["--gpu", "h100-sxm", "--model", "llama-3.1-8b"]
    for args in (
        ["predict", *base, "-c", "1", "--requests", value],
        ["explain", *base, "--batch", value],
        ["capacity", *base, "--min-agent-tok-s", "5", "--gpus", value],
    ):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2 and "is not a whole number" in r.output, (args, r.output)
    r = CliRunner().invoke(app, ["explain", *base, "--batch", "+2", "--json"])
    assert r.exit_code == 0, r.output


HOST = ("--host-memory-bandwidth",)


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e400"])
def test_float_flags_refuse_what_is_not_a_finite_number_by_name(value):
    """A float flag's range check read 'nan' as out of range and said only "input should
    be less than or equal to 1"; it now says what the value is, and every float flag
    refuses nan and the infinities with exit 2, naming itself."""
    base = ["--gpu", "h100-sxm", "--model", "llama-3.1-8b"]
    for args, flag in (
        (["predict", *base, "-c", "1", "--power-limit", value], "--power-limit"),
        (["predict", *base, "-c", "1", "--gpu-memory-utilization", value], "--gpu-memory-utiliz"),
        (["capacity", *base, "--min-agent-tok-s", value], "--min-agent-tok-s"),
        (["validate", str(RUN), "--calibrated", "--prior-weight", value], "--prior-weight"),
        (
            ["capacity", *base, "--min-agent-tok-s", "5", *("--n-cpu-moe", "2"), *HOST, value],
            "--host-memory-bandwidth",
        ),
    ):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2 and "Traceback" not in r.output, (args, r.output)
        assert flag in r.output, (args, r.output)
    for args in (
        ["predict", *base, "-c", "1", "--gpu-memory-utilization", "nan"],
        ["capacity", *base, "--min-agent-tok-s", "5", "--host-memory-bandwidth", "nan"],
    ):
        r = CliRunner().invoke(app, args)
        assert "not a finite number" in r.output, (args, r.output)


@pytest.mark.parametrize(
    "args",
    [
        ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--quant", ""],
        ["plan", "--model", "llama-3.1-8b", "--gpus", "", "--agents", "2"],
        ["calibrate", "calibration/published/seed002-rtx3090-moe-vs-dense.yaml", "--out", ""],
        ["serve", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--served-model-name", " "],
        ["explain", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--quant", ""],
    ],
)
def test_an_empty_value_is_refused_not_read_as_none(args, tmp_path, monkeypatch):
    """Issue 47's battery: '--quant ""' ran as no --quant, '--gpus ""' searched every GPU,
    'calibrate --out ""' wrote a profile into the current folder."""
    monkeypatch.chdir(tmp_path)
    root = Path(__file__).resolve().parent.parent
    args = [str(root / a) if a.startswith("calibration/") else a for a in args]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and "is empty" in r.stderr, r.output
    assert not list(tmp_path.iterdir())


def test_an_integer_flag_takes_ascii_digits_only():
    """'--requests ٣٢' (Arabic-Indic digits) is refused as -c ٣ is: digits as typed."""
    r = CliRunner().invoke(
        app, ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--requests", "٣٢"]
    )
    assert r.exit_code == 2 and "not a whole number" in r.stderr


def test_control_characters_in_an_error_are_shown_as_escapes():
    """'--gpu $'\\e[2J'' cleared the user's terminal: the error quotes it as \\x1b[2J."""
    r = CliRunner().invoke(
        app, ["predict", "--gpu", "\x1b[2J\x1b]0;t\x07x", "--model", "llama-3.1-8b"]
    )
    assert r.exit_code == 2 and "\x1b" not in r.stderr and "\x07" not in r.stderr
    assert "\\x1b[2J" in r.stderr, r.stderr


def test_a_password_in_the_probe_url_is_never_printed(tmp_path):
    r = CliRunner().invoke(
        app,
        [
            "probe",
            "--url",
            "http://user:s3cret@127.0.0.1:9",
            "--model",
            "m",
            "-c",
            "1",
            "--no-warmup",
            "--out",
            str(tmp_path / "r.json"),
        ],
    )
    assert r.exit_code == 2 and "s3cret" not in r.output, r.output
    assert "http://user:***@127.0.0.1:9" in r.stderr


@pytest.mark.parametrize("target", ["/dev/capsim-test-plot", "/proc/capsim-test.png"])
def test_a_plot_is_never_written_into_a_system_folder(target):
    """'--plot /dev/stdout' with stdout on a file wrote /dev/stdout.png (the name has no
    image suffix, so .png was added and the device check saw a new name)."""
    args = ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "-c", "1"]
    r = CliRunner().invoke(app, [*args, "--plot", target])
    assert r.exit_code == 2 and "not of files" in r.stderr, r.output
    assert not Path(target + ".png").exists() and not Path(target).exists()


SMALL_PLAN = ["plan", "--model", "llama-3.1-8b", "--gpus", "h100-sxm", "--agents", "2"]
"""A plan of one model on one GPU for two agents, for flags checked before any search."""

SMALL_PREDICT = ["predict", "--gpu", "h100-sxm", "--model", "llama-3.2-1b"]
"""A prediction of a small model, for flags checked before any simulation."""


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            [
                "predict",
                "--gpu",
                "h100-sxm",
                "--model",
                "llama-3.1-8b",
                "--interconnect",
                "ethernet",
            ],
            "not a kind of GPU link",
        ),
        (["validate", "--fit", "bogus"], "--fit applies to fits"),
        (
            ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--output-tokens", "1.5"],
            "a number of tokens is a whole number",
        ),
        (
            [*SMALL_PLAN, "--top", "0"],
            "greater than or equal to 1",
        ),
        (
            [*SMALL_PLAN, "--kwh-price", "1e308"],
            "must be 0 to 100 USD",
        ),
    ],
)
def test_values_that_ran_silently_are_refused(args, words):
    """Issue 47's battery: each of these exited 0 (an 'ethernet' TP=1 link in the title, a
    --fit ignored without --calibrated, 1.5 tokens as 2, --top 0, infinite costs)."""
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and words in r.stderr, r.output


def test_every_link_kind_of_the_catalog_may_be_named():
    from typing import get_args

    from capsim.catalog.gpu_schema import Interconnect
    from capsim.physics.communication import INTERCONNECT_CHOICES

    kinds = set(get_args(Interconnect.model_fields["kind"].annotation)) - {"none"}
    assert set(INTERCONNECT_CHOICES) == kinds | {"auto"}


@pytest.mark.parametrize(("names", "words"), [(",", "has an empty item"), ("a,a", "lists a twice")])
def test_serve_names_are_each_given_once(names, words):
    """',' served the default names and 'a,a' served 'a, a'."""
    args = ["serve", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--port", "0"]
    r = CliRunner().invoke(app, [*args, "--served-model-name", names])
    assert r.exit_code == 2 and words in r.stderr, r.output


def test_an_objective_beyond_its_ceiling_names_the_ceiling():
    """'--min-agent-tok-s 1e9' said 'must be a positive number' of a positive number."""
    r = CliRunner().invoke(
        app,
        ["capacity", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--min-agent-tok-s", "1e9"],
    )
    assert r.exit_code == 2 and "less than or equal to 1000000" in r.stderr, r.output


@pytest.mark.parametrize("columns", ["0", "-5", "abc", "10"])
def test_a_nonsense_columns_setting_still_prints(columns):
    """COLUMNS=0 printed nothing at all, the error included."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    r = subprocess.run(
        [sys.executable, "-m", "capsim", "fit", "--gpu", "nope", "--model", "llama-3.1-8b"],
        capture_output=True,
        text=True,
        cwd=root,
        env={**__import__("os").environ, "COLUMNS": columns},
        timeout=60,
    )
    assert r.returncode == 2 and "unknown gpu 'nope'" in r.stderr, r.stderr


def test_user_text_is_never_read_as_an_emoji_code():
    r = CliRunner().invoke(app, ["predict", "--gpu", ":thumbs_up:", "--model", "llama-3.1-8b"])
    assert r.exit_code == 2 and "':thumbs_up:'" in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--workload", "batch", "-c", "100000", "--rounds", "10000"], "1,000,000,000, above"),
        (
            ["--input-tokens", "1000", "--output-tokens", "5000", "--max-model-len", "2048"],
            "do not fit max_model_len 2,048: vLLM refuses them",
        ),
        # 100,000 agents of 1,000 turns drew 10^8 requests up front: 3 GB and minutes
        (
            ["--workload", "agents", "-c", "100000", "--turns", "1000"],
            "100,000 x 1,000 = 100,000,000, above",
        ),
        # --rate 1e308 ran and printed a 300-digit rate in a table it broke
        (["--workload", "open", "--rate", "1e308"], "requests per second"),
        (["--workload", "open", "--rate", "1000001"], "requests per second"),
    ],
)
def test_levels_vllm_or_memory_would_refuse_are_refused(args, words):
    """Levels beyond the request ceiling, requests vLLM refuses, rates beyond any server:
    each ran (for minutes, in gigabytes, or into a broken table) with exit 0."""
    r = CliRunner().invoke(app, [*SMALL_PREDICT, *args])
    assert r.exit_code == 2 and words in r.stderr, r.output


def test_a_trace_of_more_requests_than_capsim_holds_is_refused(tmp_path):
    from capsim.engine.workloads import MAX_TRACE_RECORDS

    trace = tmp_path / "t.jsonl"
    line = '{"arrival_time": 0, "input_tokens": 1, "output_tokens": 1}\n'
    trace.write_text(line * (MAX_TRACE_RECORDS + 1))
    r = CliRunner().invoke(app, [*SMALL_PREDICT, "--workload", "trace", "--trace", str(trace)])
    assert r.exit_code == 2 and "more than the 250,000 requests" in r.stderr, r.output


def test_the_batch_rounds_error_names_the_flag_the_user_typed():
    """'--rounds 0' was reported as '--batch-rounds 0', a flag that does not exist."""
    r = CliRunner().invoke(app, [*SMALL_PREDICT, "--workload", "batch", "--rounds", "0"])
    assert r.exit_code == 2 and "--rounds 0:" in r.stderr and "--batch-rounds" not in r.stderr


PREDICT = "predict --gpu rtx3090 --model qwen3-8b --requests 4"


@pytest.mark.parametrize(
    ("args", "file_text", "words"),
    [
        ("--workload open --rate 1_0 --output-tokens 32", None, "malformed --rate '1_0'"),
        ("-c 2 --set step_overhead_us=1_0", None, "needs a number, not '1_0'"),
        ("--workload agents -c 2 --turns 2 --think-time 1_000", None, "an '_' in it"),
        ("-c 2 --input-tokens uniform:1_0,20", None, "an '_' in it"),
        ("-c 2 --output-tokens file:{f}", "1_000\n", "holds something other than numbers"),
        ("-c 2 --output-tokens file:{f}", "１０\n", "holds something other than numbers"),
        ("-c 2 --output-tokens file:{f}", '[10, "20"]', "holds the text '20', not a number"),
    ],
)
def test_numbers_written_with_underscores_other_digits_or_quotes_are_refused(
    args, file_text, words, tmp_path
):
    """Python's float() reads '1_000' as 1000 and '１０' as 10: every numeric flag refused
    them but --rate, --set, --think-time, a distribution's numbers and a lengths file took
    them (issue 47's fuzzing), and a JSON list's "20" was read as 20."""
    f = tmp_path / "lengths.txt"
    if file_text is not None:
        f.write_text(file_text, encoding="utf-8")
    base = PREDICT.split()
    if "agents" in args:  # agents run --turns each: --requests does not apply
        base = base[: base.index("--requests")]
    r = CliRunner().invoke(app, [*base, *args.format(f=f).split()])
    assert r.exit_code == 2, r.output
    assert words in r.stderr and "Traceback" not in r.output, r.stderr


def test_a_rate_given_twice_is_refused():
    """A rate given twice was one level without a word: most likely a typo for another
    (the fuzzing round of 2026-12-02; -c 1,1 and --model a,a alike)."""
    args = [*PREDICT.split(), "--output-tokens", "32", "--workload", "open", "--rate", "1,1"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and "--rate lists the rate 1 twice" in r.output, r.output


def test_levels_above_the_request_count_say_they_measure_that_many_clients():
    """-c 1..100000:x10 with --requests 8 printed five identical rows labelled C=10 to
    100,000 without a word (issue 47's fuzzing)."""
    import json

    base = "predict --gpu rtx3090 --model qwen3-8b --requests 8 --output-tokens 32 --json -c"
    r = CliRunner().invoke(app, [*base.split(), "2,8,10,100"])
    assert r.exit_code == 0, r.output
    (result,) = json.loads(r.stdout)["results"]
    (note,) = [n for n in result["notes"] if "--requests" in n]
    assert note.startswith("C=10, 100: above --requests 8") and "load of C=8" in note
    r = CliRunner().invoke(app, [*base.split(), "2,8"])
    assert not [n for n in json.loads(r.stdout)["results"][0]["notes"] if "--requests" in n]


@pytest.mark.parametrize("command", ["explain", "predict"])
def test_a_draft_model_of_another_tokenizer_is_refused(command):
    """--spec draft:llama-3.2-1b:3 on Qwen3-8B costed a drafter whose tokens the target
    cannot verify (issue 47's fuzzing); a drafter of the same family is taken."""
    base = [command, "--gpu", "h100-sxm", "--model", "qwen3-8b", "--spec"]
    extra = [] if command == "explain" else ["--requests", "4", "--output-tokens", "16"]
    r = CliRunner().invoke(app, [*base, "draft:llama-3.2-1b:3", *extra])
    assert r.exit_code == 2 and "a vocabulary of 128,256 tokens" in r.stderr, r.output
    assert CliRunner().invoke(app, [*base, "draft:qwen3-0.6b:3", *extra]).exit_code == 0


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (
            '{"arrival_time": 0, "input_tokens": 9, "output_tokens": 5, "session_id": NaN}',
            "session_id must be a string or a finite number",
        ),
        ('{"arrival_time": 0, "output_tokens": 5}', "the key 'input_tokens' is missing"),
        ('{"arrival_time": 0,', "not JSON: Expecting property name"),
    ],
)
def test_a_trace_line_says_what_is_wrong_in_words(line, words, tmp_path):
    """A NaN session_id was taken, and the errors named Python's exception classes
    ('TypeError: ...', issue 47's fuzzing)."""
    f = tmp_path / "t.jsonl"
    f.write_text(line + "\n")
    args = ["predict", "--gpu", "rtx3090", "--model", "qwen3-8b", "--workload", "trace"]
    r = CliRunner().invoke(app, [*args, "--trace", str(f)])
    assert r.exit_code == 2 and words in r.stderr, r.output
    assert "Error" not in r.stderr.split("error:", 1)[1]


def test_a_step_too_large_for_the_gpu_is_named_as_the_cause():
    """--max-num-batched-tokens 2147483648 needs 180,000 GiB of activations, and the hint
    said no weight format fits on one GPU (issue 47's fuzzing)."""
    args = ["fit", "--gpu", "rtx3090", "--model", "qwen3-8b", "--max-num-batched-tokens"]
    r = CliRunner().invoke(app, [*args, "2147483648"])
    assert r.exit_code == 2, r.output
    text = " ".join(r.stderr.split())
    assert "a 2,147,483,648-token step" in text and "lower --max-num-batched-tokens" in text
    assert "no weight format fits" not in text


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            [
                "explain",
                "--gpu",
                "h100-sxm",
                "--model",
                "qwen3-8b",
                "--spec",
                "eagle:3:topk=4:topk=5",
            ],
            "option 'topk' given twice",
        ),
        (
            [
                "serve",
                "--gpu",
                "rtx3090",
                "--model",
                "qwen3-8b",
                "--port",
                "9",
                "--override-generation-config",
                '{"temperature": NaN}',
            ],
            "temperature must be a finite number",
        ),
    ],
)
def test_a_repeated_spec_option_or_a_nan_sampling_setting_is_refused(args, words):
    """Both were taken without a word (issue 47's fuzzing): the last topk won, and serve
    started with a NaN temperature."""
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and words in r.stderr, r.output
