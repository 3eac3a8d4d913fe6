"""What ``capsim predict`` shows and writes: a level as a flat dict (JSON), the table, the
CSV (one column per figure) and the plot."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich import box

from capsim.cli.common import fitted_table, fmt_sig, save_figure

if TYPE_CHECKING:
    from capsim.engine.simulate import PredictResult


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
        "disaggregation": result.disaggregation,
        "admission_lag_steps": result.admission_lag_steps,
        "notes": result.notes,
        "config": result.config.model_dump(mode="json"),
        "points": [point_dict(result, lv) for lv in result.levels],
    }


def label(result: PredictResult) -> str:
    c = result.config
    text = f"{result.model} {result.quant} {c.tp}x{result.gpu}"
    if c.pp > 1:
        text += f" PP{c.pp}"
    if c.prefill_replicas:  # disaggregated: prefill instances, then decode replicas
        text += f" decode x{result.replicas}, prefill {c.prefill_tp or c.tp}x{result.gpu}"
        text += f" x{c.prefill_replicas}" if c.prefill_replicas > 1 else ""
    elif result.replicas > 1:
        text += f" x{result.replicas}"
    if c.kv_dtype != "auto":
        text += f" kv={c.kv_dtype}"
    if c.interconnect != "auto":
        text += f" over {c.interconnect}"
    if c.spec:
        text += f" {c.spec.method}:{c.spec.num_tokens}"
    if c.dp_attention > 1:
        text += f" dp-attention {c.dp_attention}"
    if c.expert_parallel:
        text += " EP"
    if c.kv_offloading_gb:
        text += f" +{c.kv_offloading_gb:g} GiB KV in RAM"
    if c.cpu_offload_gb:
        text += f" +{c.cpu_offload_gb:g} GiB weights in RAM"
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


def workload_words(config) -> str:
    """The workload a plot's title names: its kind and the request lengths it draws."""
    words = f"{config.workload} workload"
    if config.workload == "trace":
        return words
    return f"{words}, {config.input_tokens} in / {config.output_tokens} out tokens"


def _banded_line(axis, x, levels, value, band_key, style, color, name):
    """One figure against the level, its 80% band shaded where the levels carry one."""
    (line,) = axis.plot(x, [value(lv) for lv in levels], style, color=color, label=name)
    edges = [(lv.band_80 or {}).get(band_key) for lv in levels]
    if all(edges):
        axis.fill_between(
            x, [e[0] for e in edges], [e[1] for e in edges], color=line.get_color(), alpha=0.15
        )
    return line


def plot(
    results: list[PredictResult],
    path: Path,
    min_agent_tok_s: float | None = None,
    max_ttft_p90_s: float | None = None,
) -> None:
    """Aggregate and per-request throughput against the level, TTFT p50 and p90 below on a
    log axis, each with its 80% band shaded; the SLOs given as dashed lines; the deployment
    and workload in the title."""
    from capsim.cli.common import file_matplotlib

    file_matplotlib()
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 9), sharex=True)
    config = results[0].config
    xlabel = "arrival rate (req/s)" if config.workload == "open" else "concurrent clients"
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, result in enumerate(results):
        color = colors[i % len(colors)]
        x = [lv.level for lv in result.levels]
        levels = result.levels
        name = label(result) if len(results) > 1 else ""
        sep = ": " if name else ""
        _banded_line(
            top,
            x,
            levels,
            lambda lv: lv.metrics.output_tok_s,
            "output_tok_s",
            "o-",
            color,
            f"{name}{sep}all clients",
        )
        _banded_line(
            top,
            x,
            levels,
            lambda lv: lv.metrics.per_request_output_tok_s.mean,
            "per_request_output_tok_s",
            "s--",
            color,
            f"{name}{sep}each client (mean)",
        )
        _banded_line(
            bottom,
            x,
            levels,
            lambda lv: lv.metrics.ttft_ms.p50,
            "ttft_p50_ms",
            "o-",
            color,
            f"{name}{sep}p50",
        )
        _banded_line(
            bottom,
            x,
            levels,
            lambda lv: lv.metrics.ttft_ms.p90,
            "ttft_p90_ms",
            "^:",
            color,
            f"{name}{sep}p90",
        )
    if min_agent_tok_s is not None:
        top.axhline(min_agent_tok_s, color="tab:red", ls="--", lw=1, label="SLO: each client")
    if max_ttft_p90_s is not None:
        bottom.axhline(max_ttft_p90_s * 1000, color="tab:red", ls="--", lw=1, label="SLO: TTFT p90")
    heading = label(results[0]) if len(results) == 1 else f"{len(results)} deployments"
    top.set_title(f"capsim predict: {heading}\n{workload_words(config)}", fontsize=10)
    top.set_ylabel("output tokens/s")
    top.set_ylim(bottom=0)
    bottom.set_yscale("log")
    # plain milliseconds at 1, 2 and 5 of each decade, not 2x10^3
    bottom.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    bottom.yaxis.set_major_formatter(
        FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}")
    )
    bottom.yaxis.set_minor_formatter(NullFormatter())
    bottom.set_ylabel("time to first token (ms, log scale)")
    bottom.set_xlabel(xlabel)
    for axis in (top, bottom):
        axis.grid(alpha=0.3, which="both")
        axis.legend(fontsize=8, loc="best", framealpha=0.8)
    fig.text(0.01, 0.005, "shaded: 80% prediction band", fontsize=8, color="0.35")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    save_figure(fig, path)
