"""``capsim probe``: measure a real OpenAI-compatible server; ``capsim probe summarize``."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from capsim.cli.common import (
    PLAIN_HELP,
    ForceOption,
    JsonOption,
    console,
    err_console,
    fitted_table,
    print_json,
    user_errors,
)
from capsim.cli.predict import parse_levels
from capsim.engine.limits import MAX_GPUS, MAX_SEED, MAX_TIMEOUT_S, MAX_TP, MIN_TIMEOUT_S
from capsim.errors import CapsimUserError

if TYPE_CHECKING:
    from capsim.probe.runfile import LevelSummary, RunSummary

probe_app = typer.Typer(
    help="Measure a real server (vLLM, SGLang, llama.cpp, any OpenAI-compatible one).",
    invoke_without_command=True,
    **PLAIN_HELP,
)


def check_server_url(url: str) -> None:
    """--url as an http(s) URL with a host and a port in range (a port of 99999 was an
    OverflowError traceback from the socket layer)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise CapsimUserError(f"--url {url!r} is not a server URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CapsimUserError(
            f"--url {url!r} is not a server URL", hint="e.g. http://127.0.0.1:8000"
        )
    if port == 0:
        raise CapsimUserError(f"--url {url!r}: port 0 is no server's port")


def server_tokens(level: LevelSummary) -> float | None:
    """Output tokens the server's counters gained over the level (vLLM, SGLang or
    llama.cpp), or None when /metrics gave none or no number (NaN)."""
    from capsim.probe.prometheus import GENERATION_COUNTERS

    for name in GENERATION_COUNTERS:
        value = level.server_deltas.get(name)
        if value is not None and math.isfinite(value):
            return value
    return None


def number(value: float | None, spec: str) -> str:
    """``value`` formatted by ``spec`` (",.1f"), or "—" where there is none (None, NaN)."""
    return "—" if value is None or not math.isfinite(value) else format(value, spec)


def print_run(summary: RunSummary, path: Path) -> None:
    """The run as a table: one row per level, counting only ok requests in the metrics;
    failures by outcome in their row; footnotes for what /metrics could not give."""
    from capsim.probe.prometheus import GENERATION_COUNTERS
    from capsim.probe.runfile import failure_text, level_outcomes, run_outcomes

    columns = [
        ("C", "right", False),
        ("run", "right", False),
        ("ok", "right", False),
        ("failed", "right", False),
        ("out tok/s", "right", False),
        ("per req\ntok/s", "right", True),
        ("TTFT\np50 ms", "right", False),
        ("TPOT\nms", "right", False),
        ("server gen\ntokens", "right", True),
    ]
    rows = []
    totals = run_outcomes(summary)
    missing: dict[str, list[str]] = {}  # why the server's token count is missing: levels
    notes = []
    for lv in summary.levels:
        m = lv.metrics
        label = f"C={lv.concurrency} run {lv.run}"
        outcomes = level_outcomes(lv)
        tokens = server_tokens(lv)
        if tokens is None:
            why = lv.metrics_note or (
                "the server's generation-token counter was not a number"
                if any(n in lv.server_deltas for n in GENERATION_COUNTERS)
                else "no generation-token counter recorded from /metrics"
            )
            missing.setdefault(why, []).append(label)
        elif lv.metrics_note:
            notes.append(f"{label}: {lv.metrics_note}")
        failures = failure_text(outcomes)
        if failures:
            notes.append(f"{label}: {m.failed / m.requests:.0%} failed: {failures}")
        rows.append(
            [
                str(lv.concurrency),
                str(lv.run),
                str(m.completed),
                str(m.failed),
                number(m.output_tok_s, ",.1f"),
                number(m.per_request_output_tok_s.mean, ",.1f"),
                number(m.ttft_ms.p50, ",.0f"),
                number(m.tpot_ms.mean, ",.2f"),
                "—¹" if tokens is None else f"{tokens:,.0f}",
            ]
        )
    title = f"{summary.header.model} at {summary.header.url} ({summary.header.workload}); {path}"
    table = fitted_table(title, columns, rows, box=box.SIMPLE_HEAD)
    console.print(table)
    if totals:
        console.print(
            "outcomes: "
            + ", ".join(f"{k} {n}" for k, n in totals.items())
            + " (the metrics count ok requests only)",
            highlight=False,
        )
    for why, levels in missing.items():
        where = "" if len(levels) == len(summary.levels) else f" ({', '.join(levels)})"
        console.print(f"¹ no server token count{where}: {why}", highlight=False)
    for note in notes:
        console.print(note, highlight=False)
    if not summary.complete:
        console.print(
            "[yellow]the run did not complete; the file holds what was measured[/]", markup=True
        )


def probe_config(**fields):
    """A ProbeConfig, with a value its schema refuses reported as the flag it came from
    (exit 2), not a traceback."""
    from pydantic import ValidationError

    from capsim.probe.runner import ProbeConfig

    try:
        return ProbeConfig(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        flag = "--" + name.removesuffix("_s").replace("_", "-") + ": " if name else ""
        message = first["msg"].removeprefix("Value error, ")
        raise CapsimUserError(f"{flag}{message[0].lower()}{message[1:]}") from None


PARALLEL_SIZE_FLAGS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "tp_size",
    "dp_size",
    "tp",
    "dp",
)
"""Engine flags (vLLM's and SGLang's spellings) that count GPUs: whole numbers of 1 or more."""


def parse_flags(values: list[str] | None) -> dict[str, str]:
    flags = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CapsimUserError(f"malformed --engine-flag '{item}'", hint="use KEY=VALUE")
        from capsim.probe.runfile import COUNTED_ENGINE_FLAGS, engine_count

        name = key.replace("-", "_")
        counted = name in COUNTED_ENGINE_FLAGS or name in PARALLEL_SIZE_FLAGS
        if counted and engine_count(value) is None:
            # calibration simulates the server with these: a value it cannot read fails now,
            # not when the run is calibrated
            raise CapsimUserError(
                f"--engine-flag {key}={value!r}: {key} takes a whole number of 1 or more"
            )
        if key in flags or any(k.replace("-", "_") == name for k in flags):
            raise CapsimUserError(
                f"--engine-flag {key} is given twice ({flags.get(key, '...')!r} and {value!r})",
                hint="give each engine flag once, with the value the server ran",
            )
        flags[key] = value
    note_unread_flags(flags)
    return flags


def note_unread_flags(flags: dict[str, str]) -> None:
    """Say which ``--engine-flag`` names are recorded only: every flag the server was
    started with belongs in the run file, but only the ones calibration and validate read
    (the parallel sizes, runfile.COUNTED_ENGINE_FLAGS and the 16-bit ``dtype``) change a
    simulation. A name one typo away from one of those ('max_num_seq') is refused with the
    name it resembles: recorded as given, it would be read as absent."""
    import difflib

    from capsim.notices import notice
    from capsim.probe.runfile import COUNTED_ENGINE_FLAGS

    simulated = (*COUNTED_ENGINE_FLAGS, "dtype")
    read = (*PARALLEL_SIZE_FLAGS, *simulated)
    unread = []
    for key in flags:
        name = key.lstrip("-").replace("-", "_").lower()
        if name in read:
            continue
        close = difflib.get_close_matches(name, read, n=1, cutoff=0.85)
        if close:
            raise CapsimUserError(
                f"--engine-flag {key}: not a flag capsim reads",
                suggestions=[close[0].replace("_", "-")],
            )
        unread.append(key)
    if unread:
        notice(
            f"--engine-flag {', '.join(unread)}: recorded in the run file as the server's "
            "launch flags; calibration simulates only "
            + ", ".join(n.replace("_", "-") for n in simulated)
            + " and the parallel sizes"
        )


@probe_app.callback()
@user_errors
def probe_cmd(
    ctx: typer.Context,
    url: Annotated[str | None, typer.Option("--url", help="Server base URL")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Served model id")] = None,
    concurrency: Annotated[
        str, typer.Option("--concurrency", "-c", help="Levels: 1..8, 1,2,4,8, 1..64:x2")
    ] = "1..8",
    input_tokens: Annotated[
        int,
        typer.Option(
            "--input-tokens",
            help="Prompt tokens per request (exact where the server has /tokenize)",
        ),
    ] = 1024,
    output_tokens: Annotated[
        str, typer.Option("--output-tokens", help="N or a distribution (uniform:A,B, ...)")
    ] = "512",
    seed: Annotated[
        int, typer.Option("--seed", help="Seed of the output-length draws", min=0, max=MAX_SEED)
    ] = 0,
    runs: Annotated[int, typer.Option("--runs", help="Measurement runs per level")] = 1,
    workload: Annotated[str, typer.Option("--workload", help="closed or batch")] = "closed",
    requests: Annotated[int | None, typer.Option("--requests", help="Requests per level")] = None,
    rounds: Annotated[int, typer.Option("--rounds", help="Batch rounds per level")] = 2,
    endpoint: Annotated[str, typer.Option("--endpoint", help="completions or chat")] = (
        "completions"
    ),
    out: Annotated[Path | None, typer.Option("--out", help="Run file (.json + .jsonl)")] = None,
    api_key_env: Annotated[
        str, typer.Option("--api-key-env", help="Environment variable holding the API key")
    ] = "OPENAI_API_KEY",
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos/--natural-stop")] = True,
    warmup: Annotated[
        bool,
        typer.Option(
            "--warmup/--no-warmup",
            help="A warm-up round before the levels, not measured (CUDA graphs and kernels "
            "compiled first)",
        ),
    ] = True,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Longest a request may take in all, seconds")
    ] = 600.0,
    connect_timeout: Annotated[
        float | None,
        typer.Option(
            "--connect-timeout",
            help="Longest to open a connection, seconds [default: 10, at most --timeout]",
            show_default=False,
        ),
    ] = None,
    first_byte_timeout: Annotated[
        float | None,
        typer.Option(
            "--first-byte-timeout",
            help="Longest from sending to the first streamed event (queueing and prefill), "
            "seconds [default: 300, at most --timeout]",
            show_default=False,
        ),
    ] = None,
    chunk_timeout: Annotated[
        float | None,
        typer.Option(
            "--chunk-timeout",
            help="Longest silence between two streamed events, seconds [default: 60, at most "
            "--timeout]",
            show_default=False,
        ),
    ] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="Stated hardware")] = None,
    gpus: Annotated[
        int | None, typer.Option("--gpus", min=1, max=MAX_GPUS, help="Stated GPUs in total")
    ] = None,
    tp: Annotated[
        int | None, typer.Option("--tp", min=1, max=MAX_TP, help="Stated tensor-parallel size")
    ] = None,
    quant: Annotated[str | None, typer.Option("--quant", help="Stated weight format")] = None,
    kv_dtype: Annotated[
        str | None, typer.Option("--kv-dtype", help="Stated KV-cache dtype (auto or fp8)")
    ] = None,
    spec: Annotated[
        str | None,
        typer.Option(
            "--spec",
            help="Speculative decoding the server runs (mtp:2, eagle:3, ngram:4); calibration "
            "simulates it with the acceptance the server's counters report",
        ),
    ] = None,
    engine_flag: Annotated[
        list[str] | None, typer.Option("--engine-flag", help="KEY=VALUE, repeatable")
    ] = None,
    json_out: JsonOption = False,
    force: ForceOption = False,
) -> None:
    """Probe a server at several concurrency levels and write a run file."""
    from capsim.physics.speculative import parse_spec
    from capsim.probe.runfile import Deployment

    if ctx.invoked_subcommand:
        return
    from capsim.probe.runner import run_probe

    if not url or not model:
        raise CapsimUserError(
            "capsim probe needs --url and --model",
            hint="e.g. capsim probe --url http://127.0.0.1:8000 --model NAME",
        )
    if spec is not None:
        parse_spec(spec)  # a malformed value fails now, not at calibration
    check_stated_deployment(gpu, quant, kv_dtype)
    if gpus is not None and tp is not None and gpus % tp:
        # calibration simulates what the header states: a TP group larger than the GPUs
        raise CapsimUserError(
            f"--gpus {gpus} is not a whole number of --tp {tp} groups",
            hint="state the server's GPUs in total and its tensor-parallel size as it ran",
        )
    check_server_url(url)
    from capsim.engine.lengths import parse_length

    # by name: typer carries its own copy of click's ParameterSource
    source = getattr(ctx.get_parameter_source("api_key_env"), "name", None)
    if source == "COMMANDLINE" and not os.environ.get(api_key_env):
        raise CapsimUserError(
            f"--api-key-env {api_key_env}: that environment variable is not set (or empty)",
            hint=f"export {api_key_env}=... first, or leave the flag out to send no key "
            "where OPENAI_API_KEY is unset",
        )
    key = os.environ.get(api_key_env or "", "") if api_key_env else ""
    if key and not (key.isascii() and key.isprintable()):
        # an HTTP header carries ASCII: httpx ended in UnicodeEncodeError
        raise CapsimUserError(
            f"the API key in {api_key_env} holds a character an HTTP header cannot carry "
            "(only printable ASCII)",
            hint=f"check {api_key_env}, or unset it to send no key",
        )
    # a bad distribution fails before the run file exists, not after it was created
    parse_length(str(output_tokens), "--output-tokens", minimum=1)
    if workload not in ("closed", "batch"):
        raise CapsimUserError(f"unknown workload '{workload}'", hint="use closed or batch")
    rounds_typed = getattr(ctx.get_parameter_source("rounds"), "name", None) in (
        "COMMANDLINE",
        "ENVIRONMENT",
    )
    if rounds_typed and workload != "batch":
        raise CapsimUserError(
            f"--rounds applies to --workload batch, not {workload}",
            hint="drop --rounds, or use --workload batch (--requests sets a closed level's count)",
        )
    if rounds_typed and requests is not None:
        raise CapsimUserError(
            "--rounds and --requests both set how many requests a batch level sends",
            hint="give one: --rounds R (R x C requests) or --requests N",
        )
    if endpoint not in ("completions", "chat"):
        raise CapsimUserError(f"unknown endpoint '{endpoint}'", hint="use completions or chat")
    for flag, value in (
        ("--timeout", timeout),
        ("--connect-timeout", connect_timeout),
        ("--first-byte-timeout", first_byte_timeout),
        ("--chunk-timeout", chunk_timeout),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise CapsimUserError(f"{flag} needs a positive number of seconds, not {value:g}")
        if value is not None and not MIN_TIMEOUT_S <= value <= MAX_TIMEOUT_S:
            # 1e-320 s timed every request out, 1e308 s was taken
            raise CapsimUserError(
                f"{flag} {value!r}: seconds from {MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S:,}",
                hint="leave it out for the default",
            )
    config = probe_config(
        url=url,
        model=model,
        endpoint=endpoint,
        workload=workload,
        concurrency=parse_levels(concurrency),
        requests=requests,
        rounds=rounds,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        runs=runs,
        ignore_eos=ignore_eos,
        warmup=warmup,
        api_key_env=api_key_env,
        timeout_s=timeout,
        connect_timeout_s=connect_timeout,
        first_byte_timeout_s=first_byte_timeout,
        chunk_timeout_s=chunk_timeout,
        deployment=Deployment(
            gpu=gpu,
            gpus=gpus,
            tp=tp,
            quant=quant,
            kv_dtype=kv_dtype,
            spec=spec,
            engine_flags=parse_flags(engine_flag),
        ),
    )
    path = out or Path("calibration/runs") / f"{model.replace('/', '_')}.json"
    from capsim.files import refuse_overwrite

    refuse_overwrite([path], "--out", True)  # no name, a folder, a device: never
    from capsim.probe.runfile import run_file_paths

    summary_path, log = run_file_paths(path)
    refuse_overwrite([summary_path, log], "--out", force)
    if out is not None:  # calibration/runs under the current folder is created
        from capsim.files import refuse_missing_folder

        refuse_missing_folder(path.parent, "--out", path)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("failed {task.fields[failed]}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=False,
        disable=json_out,
    )
    state: dict = {}

    def on_event(event: str, **info) -> None:
        if event == "level":
            state["task"] = progress.add_task(
                f"C={info['concurrency']} run {info['run']}", total=info["total"], failed=0
            )
            state["failed"] = 0
        elif event == "request" and "task" in state:
            if not info["record"].ok:
                state["failed"] += 1
            progress.update(state["task"], advance=1, failed=state["failed"])
        elif event == "warning":
            progress.console.print(
                f"[yellow]warning:[/] {escape(info['message'])}", markup=True, highlight=False
            )

    try:
        with progress:
            summary = run_probe(config, path, on_event)
    except KeyboardInterrupt:
        kept = f"what was measured is in {log}" if log.exists() else "nothing was measured yet"
        err_console.print(f"interrupted: {kept}")
        raise typer.Exit(130) from None
    if json_out:
        print_json(summary.model_dump(mode="json"))
    else:
        print_run(summary, path)
    refuse_run_without_answers(summary, path)
    if not summary.complete:  # the server went away: what was measured is kept
        raise CapsimUserError(
            f"{summary.stopped or 'the run did not complete'}; the {len(summary.levels)} "
            f"level(s) measured before it are in {path} (the requests in "
            f"{path.with_suffix('.jsonl')})",
            hint="check the server's log; probe again once it answers",
        )


def refuse_run_without_answers(summary, path: Path) -> None:
    """A run whose every request failed measured nothing but the failures: say so, with
    what failed most, and exit 2 (it was exit 0; the failures stay in the run file)."""
    from capsim.probe.runfile import run_outcomes

    outcomes = run_outcomes(summary)
    if not summary.levels or outcomes.get("ok") or not outcomes:
        return
    errors: dict[str, int] = {}
    for level in summary.levels:
        for reason, n in level.errors.items():
            errors[reason] = errors.get(reason, 0) + n
    worst = max(errors, key=errors.get) if errors else max(outcomes, key=outcomes.get)
    raise CapsimUserError(
        f"every one of the {sum(outcomes.values()):,} requests failed (most: {worst}); "
        f"nothing was measured (the failures are in {path.with_suffix('.jsonl')})",
        hint="check --model, --input-tokens and --output-tokens against what the server "
        "takes, and its log",
    )


@probe_app.command("summarize")
@user_errors
def summarize_cmd(
    run: Annotated[Path, typer.Argument(help="A run's .jsonl (or .json) file")],
    json_out: JsonOption = False,
) -> None:
    """Rebuild a run's summary from its JSONL log (e.g. after an interrupted run)."""
    from capsim.probe.runfile import summarize_log

    summary = summarize_log(run)
    if json_out:
        print_json(summary.model_dump(mode="json"))
    else:
        print_run(summary, run)


def check_stated_deployment(gpu: str | None, quant: str | None, kv_dtype: str | None) -> None:
    """The hardware, weight format and KV dtype a user states are recorded in the run file
    and simulated at calibration: a name the catalog does not know fails now (with its
    did-you-mean), not after the run."""
    if gpu is None and quant is None and kv_dtype is None:
        return
    from capsim.cli.common import catalog
    from capsim.physics.dtypes import check_kv_dtype

    cat = catalog(None)
    if gpu is not None:
        cat.gpu(gpu)
    if quant is not None:
        cat.quant(quant)
    if kv_dtype is not None:
        check_kv_dtype(kv_dtype, "--kv-dtype")
