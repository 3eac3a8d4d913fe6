"""``capsim validate``: predicted vs measured for published datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich import box
from rich.table import Table

from capsim.calibration.compare import ComparedPoint, compare_dataset, mape
from capsim.calibration.fit import cross_validate, fit_profile
from capsim.calibration.published import load_published
from capsim.cli.common import DbOption, JsonOption, catalog, console, print_json


def markdown(points: list[ComparedPoint]) -> str:
    lines = [
        "| dataset | scenario | C | metric | measured | predicted | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(
            f"| {p.dataset} | {p.scenario} | {p.concurrency} | {p.metric} | "
            f"{p.measured:,.0f} | {p.predicted:,.1f} | {100 * p.error:+.1f}% |"
        )
    lines.append(f"\nMAPE over {len(points)} points: {mape(points):.1f}%")
    return "\n".join(lines)


def calibrated_errors(datasets, cat) -> list[dict]:
    """Per dataset: uncalibrated, in-sample (fitted on the dataset) and cross-validated
    (leave one concurrency level out) predictions of every point."""
    rows = []
    for ds in datasets:
        raw = compare_dataset(ds, cat)
        fitted = fit_profile([ds], cat, f"{ds.name}-fit")
        gpu = ds.scenarios[0].gpu
        inside = compare_dataset(ds, cat, fitted.params(cat, gpu))
        cv = {(p.scenario, p.concurrency, p.metric): p for p in cross_validate([ds], cat)}
        for r, i in zip(raw, inside, strict=True):
            c = cv.get((r.scenario, r.concurrency, r.metric))
            rows.append(
                {
                    "dataset": ds.name,
                    "scenario": r.scenario,
                    "concurrency": r.concurrency,
                    "metric": r.metric,
                    "measured": r.measured,
                    "uncalibrated": r.error,
                    "in_sample": i.error,
                    "cross_validated": None if c is None else c.error,
                }
            )
    return rows


def summarize_errors(rows: list[dict]) -> list[dict]:
    out = []
    for name in dict.fromkeys(r["dataset"] for r in rows):
        sub = [r for r in rows if r["dataset"] == name]
        cv = [abs(r["cross_validated"]) for r in sub if r["cross_validated"] is not None]
        out.append(
            {
                "dataset": name,
                "points": len(sub),
                "uncalibrated_mape": 100 * float(np.mean([abs(r["uncalibrated"]) for r in sub])),
                "in_sample_mape": 100 * float(np.mean([abs(r["in_sample"]) for r in sub])),
                "cross_validated_mape": 100 * float(np.mean(cv)) if cv else None,
            }
        )
    return out


def validate_cmd(
    datasets: Annotated[
        list[Path] | None,
        typer.Argument(help="Dataset YAML files or folders (default: calibration/published)"),
    ] = None,
    calibrated: Annotated[
        bool,
        typer.Option("--calibrated", help="Also fit each dataset: in-sample and cross-validated"),
    ] = False,
    md: Annotated[bool, typer.Option("--markdown", help="Print a Markdown table")] = False,
    json_out: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Predict every published measurement and report the error."""
    cat = catalog(db)
    loaded = load_published(datasets)
    if calibrated:
        rows = calibrated_errors(loaded, cat)
        summary = summarize_errors(rows)
        if json_out:
            print_json({"points": rows, "datasets": summary})
            return

        def pct(v):
            return "—" if v is None else f"{100 * v:+.1f}%"

        def mape_text(v):
            return "—" if v is None else f"{v:.1f}%"

        lines = [
            "| dataset | points | MAPE uncalibrated | MAPE in-sample | MAPE cross-validated |",
            "|---|---|---|---|---|",
        ]
        for d in summary:
            lines.append(
                f"| {d['dataset']} | {d['points']} | {mape_text(d['uncalibrated_mape'])} "
                f"| {mape_text(d['in_sample_mape'])} "
                f"| {mape_text(d['cross_validated_mape'])} |"
            )
        if md:
            console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
            return
        table = Table(title="capsim validate --calibrated", box=box.SIMPLE_HEAD)
        for col in ("scenario", "C", "metric", "measured", "uncal.", "in-sample", "CV"):
            table.add_column(col, justify="left" if col in ("scenario", "metric") else "right")
        for r in rows:
            table.add_row(
                r["scenario"],
                str(r["concurrency"]),
                r["metric"],
                f"{r['measured']:,.0f}",
                pct(r["uncalibrated"]),
                pct(r["in_sample"]),
                pct(r["cross_validated"]),
            )
        console.print(table)
        console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
        return
    points: list[ComparedPoint] = []
    for ds in loaded:
        points += compare_dataset(ds, cat)
    if json_out:
        print_json(
            {
                "points": [{**p.__dict__, "error": p.error} for p in points],
                "mape_percent": mape(points),
            }
        )
        return
    if md:
        console.print(markdown(points), markup=False, highlight=False, soft_wrap=True)
        return
    table = Table(title="capsim validate: predicted vs measured", box=box.SIMPLE_HEAD)
    for col in ("scenario", "C", "metric", "measured", "predicted", "error"):
        table.add_column(col, justify="left" if col in ("scenario", "metric") else "right")
    for p in points:
        table.add_row(
            p.scenario,
            str(p.concurrency),
            p.metric,
            f"{p.measured:,.0f}",
            f"{p.predicted:,.1f}",
            f"{100 * p.error:+.1f}%",
        )
    console.print(table)
    console.print(f"MAPE over {len(points)} points: {mape(points):.1f}%")
