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
