"""``capsim validate``: predicted vs measured for published datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich import box
from rich.table import Table

from capsim.calibration.compare import ComparedPoint, compare_dataset
from capsim.calibration.published import load_published
from capsim.cli.common import DbOption, JsonOption, catalog, console, print_json


def mape(points: list[ComparedPoint]) -> float:
    """Mean absolute percentage error of the predictions, in percent."""
    return float(np.mean([abs(p.error) for p in points]) * 100) if points else float("nan")


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


def validate_cmd(
    datasets: Annotated[
        list[Path] | None,
        typer.Argument(help="Dataset YAML files or folders (default: calibration/published)"),
    ] = None,
    md: Annotated[bool, typer.Option("--markdown", help="Print a Markdown table")] = False,
    json_out: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Predict every published measurement and report the error (uncalibrated defaults)."""
    cat = catalog(db)
    points: list[ComparedPoint] = []
    for ds in load_published(datasets):
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
