"""``capsim predict``: simulate concurrency sweeps and print, save or plot them."""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box

from capsim.cli.common import (
    AsyncSchedulingOption,
    ConservativenessOption,
    DbOption,
    DisableCustomAllReduceOption,
    EngineOption,
    GpuMemoryUtilizationOption,
    JsonOption,
    MaxModelLenOption,
    MaxNumBatchedTokensOption,
    MaxNumSeqsOption,
    MixedChunkOption,
    ProfileOption,
    RecvIntervalOption,
    SetOption,
    UbatchOption,
    catalog,
    console,
    err_console,
    exclusive_outputs,
    fitted_table,
    fmt_sig,
    parse_overrides,
    predict_config,
    progress_bar,
    resolve_models,
    save_figure,
    spec_config,
)
from capsim.errors import CapsimUserError

if TYPE_CHECKING:
    from capsim.engine.simulate import PredictResult

MAX_LEVEL = 100_000


def parse_levels(text: str, what: str = "--concurrency") -> list[int]:
    """'1..8', '1,2,4,8', '1..64:x2' (doubling), '4..32:4' (step 4), or a mix with commas."""
    levels: list[int] = []
    hint = "use forms like 1..8, 1,2,4,8, 1..64:x2 or 8..64:8"
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)\.\.(\d+)(?::(x?)(\d+))?", part)
        if m:
            lo, hi = int(m[1]), int(m[2])
            step = int(m[4]) if m[4] else 1
            if lo < 1 or hi < lo or step < 1 or (m[3] and step < 2):
                raise CapsimUserError(f"malformed {what} range '{part}'", hint=hint)
            if m[3]:
                value = lo
                while value <= hi:
                    levels.append(value)
                    value *= step
            else:
                levels.extend(range(lo, hi + 1, step))
        elif re.fullmatch(r"\d+", part) and int(part) >= 1:
            levels.append(int(part))
        else:
            raise CapsimUserError(f"malformed {what} '{text}' (at '{part}')", hint=hint)
    if max(levels) > MAX_LEVEL:
        raise CapsimUserError(f"{what} above {MAX_LEVEL:,} is not supported")
    return sorted(set(levels))


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(v) for v in text.split(",")]
    except ValueError:
        raise CapsimUserError(f"malformed --rate '{text}'", hint="e.g. --rate 0.5,1,2") from None
    if any(r <= 0 for r in rates):
        raise CapsimUserError("--rate values must be positive (requests per second)")
    return rates


def split_list(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def point_dict(result: PredictResult, level) -> dict[str, Any]:
    m = level.metrics
    dist = lambda d: d.model_dump(exclude={"count"})  # noqa: E731
    return {
        "concurrency": m.concurrency,
        "rate": level.level if result.config.workload == "open" else None,
        "workload": m.workload,
        "requests": m.requests,
        "completed": m.completed,
        "failed": m.failed,
        "wall_s": m.wall_s,
        "output_tok_s": m.output_tok_s,
        "total_tok_s": m.total_tok_s,
        "prefill_tok_s": m.prefill_tok_s,
        "request_throughput": m.request_throughput,
        "per_request_output_tok_s": m.per_request_output_tok_s.mean,
        "per_request_output_tok_s_dist": dist(m.per_request_output_tok_s),
        "ttft_ms": dist(m.ttft_ms),
        "tpot_ms": dist(m.tpot_ms),
        "itl_ms": dist(m.itl_ms),
        "e2e_s": dist(m.e2e_s),
        "queueing_ms": dist(m.queueing_ms),
        "peak_kv_usage": level.peak_kv_usage,
        "preemptions": level.preemptions,
        "prefix_cache_hit_rate": level.prefix_cache_hit_rate,
        "contention": level.contention,
        "speedup_vs_serial": level.speedup_vs_serial,
        "band_80": {k: {"low": lo, "high": hi} for k, (lo, hi) in (level.band_80 or {}).items()},
        "band_50": {k: {"low": lo, "high": hi} for k, (lo, hi) in (level.band_50 or {}).items()},
        "band_source": level.band_source,
        "service_of": level.service_of,
    }


def result_dict(result: PredictResult) -> dict[str, Any]:
    return {
        "label": label(result),
        "gpu": result.gpu,
        "model": result.model,
        "quant": result.quant,
        "quant_reason": result.quant_reason,
        "profile": result.profile,
        "profile_path": result.profile_path,
        "tp": result.config.tp,
        "replicas": result.replicas,
        "kv_dtype": result.config.kv_dtype,
        "workload": result.config.workload,
        "kv_capacity_tokens": result.kv_capacity_tokens,
        "max_model_len": result.max_model_len,
        "notes": result.notes,
        "config": result.config.model_dump(mode="json"),
        "points": [point_dict(result, lv) for lv in result.levels],
    }


def label(result: PredictResult) -> str:
    c = result.config
    text = f"{result.model} {result.quant} {c.tp}x{result.gpu}"
    if result.replicas > 1:
        text += f" x{result.replicas}"
    if c.kv_dtype != "auto":
        text += f" kv={c.kv_dtype}"
    if c.spec:
        text += f" {c.spec.method}:{c.spec.num_tokens}"
    if c.engine != "vllm":
        text += f" ({c.engine})"
    return text


def fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def profile_origin(path: str | None) -> str:
    """Where an applied profile came from, for the table's title: shipped with capsim, or
    the file (one of the user's)."""
    from capsim.calibration.profiles import profiles_dir

    if path is None:
        return "in memory"
    if Path(path).parent.resolve() == profiles_dir().resolve():
        return "shipped"
    return path


def print_table(console, results: list[PredictResult]) -> None:
    many = len(results) > 1
    first = results[0]
    closed_like = first.config.workload in ("batch", "closed")
    title = f"capsim predict: {first.config.workload} workload"
    if not many:
        title += f"\n{label(first)}, KV cache {first.kv_capacity_tokens:,} tokens"
        title += (
            f", profile {first.profile} ({profile_origin(first.profile_path)})"
            if first.profile
            else ", uncalibrated"
        )
    banded = any(lv.band_80 and "output_tok_s" in lv.band_80 for r in results for lv in r.levels)
    level_name = "rate\nreq/s" if first.config.workload == "open" else "C"
    # (header, optional): optional columns give way first on a narrow terminal
    headers = [(level_name, False), ("out\ntok/s", False)]
    if banded:
        headers.append(("80%\nband", False))
    headers += [
        ("per req\ntok/s", False),
        ("TTFT\np50 ms", True),
        ("TTFT\np90 ms", False),
        ("TPOT\nms", False),
        ("E2E\np50 s", True),
        ("KV\npeak", True),
        ("pre-\nempt", True),
    ]
    if closed_like:
        headers += [("cont-\nention", True), ("vs\nserial", True)]
    columns = [(name, "right", optional) for name, optional in headers]
    if many:
        columns.insert(0, ("configuration", "left", False))
    rows = []
    for result in results:
        for lv in result.levels:
            m = lv.metrics
            row = [label(result)] if many else []
            row += [
                fmt(lv.level, 2 if first.config.workload == "open" else 0),
                fmt(m.output_tok_s, 0),
                *(
                    [
                        f"{lv.band_80['output_tok_s'][0]:,.0f}-{lv.band_80['output_tok_s'][1]:,.0f}"
                        if lv.band_80
                        else "—"
                    ]
                    if banded
                    else []
                ),
                fmt(m.per_request_output_tok_s.mean, 1),
                fmt(m.ttft_ms.p50, 0),
                fmt(m.ttft_ms.p90, 0),
                fmt(m.tpot_ms.mean, 1),
                fmt_sig(m.e2e_s.p50),
                f"{lv.peak_kv_usage:.0%}",
                str(lv.preemptions),
            ]
            if closed_like:
                row += [
                    "—" if lv.contention is None else f"{lv.contention:.0%}",
                    "—" if lv.speedup_vs_serial is None else f"{lv.speedup_vs_serial:.1f}x",
                ]
            rows.append(row)
    table = fitted_table(
        title,
        columns,
        rows,
        caption="total tok/s, ITL, queueing and p99s: --json or --csv",
        cell_padding=2,  # SIMPLE_HEAD with collapsed padding: two spaces between columns
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    console.print(table)
    for result in results:
        if result.config.quant in (None, "auto"):
            console.print(f"{label(result)}: weight format {result.quant_reason}", highlight=False)
        for note in result.notes:
            console.print(f"{label(result)}: {note}", highlight=False)


CSV_SKIP = {"per_request_output_tok_s"}
"""point_dict keys the CSV leaves out: the per-request mean, which the CSV has as
per_request_output_tok_s_mean beside its percentiles (as ttft_ms_mean, ...)."""

CSV_RENAME = {"per_request_output_tok_s_dist": "per_request_output_tok_s"}
"""point_dict keys the CSV names differently (the prefix of their flattened columns)."""


def flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    """``value`` as CSV cells: a dict (a distribution, a band table, a band's low and high
    edges) spreads into one column per entry, ``prefix_entry``; anything else is a cell."""
    if isinstance(value, dict):
        for key, sub in value.items():
            flatten(f"{prefix}_{key}", sub, out)
    else:
        out[prefix] = value


def write_csv(results: list[PredictResult]) -> str:
    """One row per configuration and level; every figure in one column of its own (a
    distribution's mean and percentiles, a band's low and high edge), no nested values."""
    rows = []
    for result in results:
        for lv in result.levels:
            flat: dict[str, Any] = {"configuration": label(result)}
            for key, value in point_dict(result, lv).items():
                if key not in CSV_SKIP:
                    flatten(CSV_RENAME.get(key, key), value, flat)
            rows.append(flat)
    # every column any row has (a configuration without bands leaves theirs empty)
    fields = list(dict.fromkeys(k for row in rows for k in row))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, restval="")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def plot(results: list[PredictResult], path: Path) -> None:
    """Aggregate and per-request throughput against the level, and TTFT below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 8), sharex=True)
    xlabel = "arrival rate (req/s)" if results[0].config.workload == "open" else "concurrency"
    for result in results:
        x = [lv.level for lv in result.levels]
        name = label(result)
        (line,) = top.plot(
            x, [lv.metrics.output_tok_s for lv in result.levels], "o-", label=f"{name}: aggregate"
        )
        top.plot(
            x,
            [lv.metrics.per_request_output_tok_s.mean for lv in result.levels],
            "s--",
            color=line.get_color(),
            label=f"{name}: per request",
        )
        bottom.plot(
            x,
            [lv.metrics.ttft_ms.p50 for lv in result.levels],
            "o-",
            color=line.get_color(),
            label=f"{name}: p50",
        )
        bottom.plot(
            x,
            [lv.metrics.ttft_ms.p90 for lv in result.levels],
            "^:",
            color=line.get_color(),
            label=f"{name}: p90",
        )
    top.set_ylabel("output tokens/s")
    top.set_title(f"capsim predict ({results[0].config.workload} workload)")
    top.grid(alpha=0.3)
    top.legend(fontsize=7)
    bottom.set_ylabel("time to first token (ms)")
    bottom.set_xlabel(xlabel)
    bottom.grid(alpha=0.3)
    bottom.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def predict_with_progress(config, cat) -> PredictResult:
    """capsim.api.predict with a bar on stderr, when it is a terminal: requests
    simulated of all the levels'."""
    from capsim.api import predict

    if not err_console.is_terminal:
        return predict(config, catalog=cat)
    with progress_bar() as bar:
        task = bar.add_task(f"{config.gpu} {config.model}", total=None)

        def show(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return predict(config, catalog=cat, progress=show)


def predict_cmd(
    gpu: Annotated[str, typer.Option("--gpu", help="GPU name(s), comma-separated")],
    model: Annotated[str, typer.Option("--model", help="Model name(s), comma-separated")],
    quant: Annotated[str | None, typer.Option("--quant", help="Weight format(s)")] = None,
    concurrency: Annotated[
        str, typer.Option("--concurrency", "-c", help="Levels: 1..8, 1,2,4,8, 1..64:x2")
    ] = "1..8",
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs in total")] = None,
    tp: Annotated[str, typer.Option("--tp", help="Tensor-parallel size(s)")] = "1",
    dp: Annotated[int | None, typer.Option("--dp", help="Data-parallel replicas")] = None,
    interconnect: Annotated[str, typer.Option("--interconnect")] = "auto",
    kv_dtype: Annotated[str, typer.Option("--kv-dtype", help="auto, fp8 (list ok)")] = "auto",
    workload: Annotated[
        str, typer.Option("--workload", help="closed, batch, agents, open, trace")
    ] = "closed",
    requests: Annotated[int | None, typer.Option("--requests", help="Requests per level")] = None,
    rounds: Annotated[
        int, typer.Option("--rounds", help="Batch workload: rounds per level (default 4)")
    ] = 4,
    input_tokens: Annotated[
        str, typer.Option("--input-tokens", help="N or uniform:A,B / normal: / lognormal:")
    ] = "1024",
    output_tokens: Annotated[str, typer.Option("--output-tokens")] = "512",
    rate: Annotated[
        str | None, typer.Option("--rate", help="Open-loop arrivals per second (list ok)")
    ] = None,
    arrival: Annotated[str, typer.Option("--arrival", help="poisson or gamma")] = "poisson",
    gamma_cv: Annotated[float, typer.Option("--gamma-cv")] = 2.0,
    turns: Annotated[int, typer.Option("--turns", help="Agent turns")] = 4,
    think_time: Annotated[str, typer.Option("--think-time", help="Seconds")] = "0",
    tool_tokens: Annotated[str, typer.Option("--tool-tokens")] = "256",
    orchestrator: Annotated[bool, typer.Option("--orchestrator")] = False,
    trace: Annotated[Path | None, typer.Option("--trace", help="JSONL trace")] = None,
    max_num_seqs: MaxNumSeqsOption = None,
    max_num_batched_tokens: MaxNumBatchedTokensOption = None,
    max_model_len: MaxModelLenOption = None,
    gpu_memory_utilization: GpuMemoryUtilizationOption = None,
    spec: Annotated[str | None, typer.Option("--spec", help="e.g. mtp:2, ngram:4")] = None,
    spec_acceptance: Annotated[
        str | None, typer.Option("--spec-acceptance", help="Rate, or one per position")
    ] = None,
    prefix_caching: Annotated[bool, typer.Option("--prefix-caching/--no-prefix-caching")] = True,
    power_limit: Annotated[float | None, typer.Option("--power-limit", help="W")] = None,
    enforce_eager: Annotated[bool, typer.Option("--enforce-eager")] = False,
    async_scheduling: AsyncSchedulingOption = None,
    disable_custom_all_reduce: DisableCustomAllReduceOption = False,
    engine: EngineOption = "vllm",
    ubatch_size: UbatchOption = None,
    scheduler_recv_interval: RecvIntervalOption = 1,
    mixed_chunk: MixedChunkOption = False,
    schedule_conservativeness: ConservativenessOption = None,
    offline: Annotated[
        bool,
        typer.Option(
            "--offline",
            help="No API server in the loop (vllm bench throughput, llama-bench): no "
            "HTTP, tokenisation or streaming time",
        ),
    ] = False,
    router: Annotated[
        str, typer.Option("--router", help="round_robin, least_outstanding, prefix_aware")
    ] = "round_robin",
    seed: Annotated[int, typer.Option("--seed")] = 0,
    profile: ProfileOption = "auto",
    set_values: SetOption = None,
    json_out: JsonOption = False,
    csv_out: Annotated[bool, typer.Option("--csv", help="Print CSV on stdout")] = False,
    plot_path: Annotated[Path | None, typer.Option("--plot", help="Write a PNG chart")] = None,
    db: DbOption = None,
) -> None:
    """Simulate N concurrent clients against a vLLM, SGLang or llama.cpp server and report
    throughput and latency per level."""
    from capsim.engine.router import ROUTER_POLICIES

    exclusive_outputs(json=json_out, csv=csv_out)
    cat = catalog(db)
    cat.engine(engine)  # an unknown engine is a user error before anything runs
    if workload not in ("closed", "batch", "agents", "open", "trace"):
        raise CapsimUserError(
            f"unknown workload '{workload}'",
            hint="use closed, batch, agents, open or trace",
        )
    if router not in ROUTER_POLICIES:
        raise CapsimUserError(
            f"unknown router '{router}'",
            hint="use " + ", ".join(ROUTER_POLICIES),
        )
    if arrival not in ("poisson", "gamma"):
        raise CapsimUserError(f"unknown arrival process '{arrival}'", hint="poisson or gamma")
    levels = parse_levels(concurrency) if workload != "open" else [1]
    rates = parse_rates(rate) if rate else []
    spec_cfg = spec_config(spec, spec_acceptance)
    overrides = parse_overrides(set_values)
    try:
        tps = [int(v) for v in split_list(tp)]
    except ValueError:
        raise CapsimUserError(f"malformed --tp '{tp}'", hint="e.g. --tp 1,2") from None
    cat, models = resolve_models(cat, split_list(model))
    combos = itertools.product(
        split_list(gpu),
        models,
        split_list(quant) if quant else [None],
        tps,
        split_list(kv_dtype),
    )
    results = []
    for g, m, q, t, kv in combos:
        config = predict_config(
            gpu=g,
            model=m.name,
            quant=q or m.quant,
            gpus=gpus,
            tp=t,
            dp=dp,
            interconnect=interconnect,
            kv_dtype=kv,
            workload=workload,
            concurrency=levels,
            rates=rates,
            requests=requests,
            batch_rounds=rounds,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            turns=turns,
            think_time=think_time,
            tool_tokens=tool_tokens,
            orchestrator=orchestrator,
            arrival=arrival,
            gamma_cv=gamma_cv,
            trace=str(trace) if trace else None,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            spec=spec_cfg,
            prefix_caching=prefix_caching,
            power_limit_w=power_limit,
            enforce_eager=enforce_eager,
            async_scheduling=async_scheduling,
            custom_allreduce=False if disable_custom_all_reduce else None,
            engine=engine,
            ubatch_tokens=ubatch_size,
            scheduler_recv_interval=scheduler_recv_interval,
            mixed_chunk=mixed_chunk,
            schedule_conservativeness=schedule_conservativeness,
            offline=offline,
            router=router,
            seed=seed,
            profile=profile,
            efficiency_overrides=overrides,
        )
        results.append(predict_with_progress(config, cat))
    if json_out:
        sys.stdout.write(
            json.dumps({"results": [result_dict(r) for r in results]}, indent=2) + "\n"
        )
    elif csv_out:
        sys.stdout.write(write_csv(results))
    else:
        print_table(console, results)
    if plot_path is not None:
        plot(results, plot_path)
