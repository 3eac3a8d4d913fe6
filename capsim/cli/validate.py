"""``capsim validate``: predicted vs measured for published datasets."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.table import Table

from capsim.calibration.part_fits import (
    FitProgress,
    calibrated_part_rows,
    calibration_parts,
)
from capsim.cli.common import (
    EXIT_INTERRUPTED,
    PLOT_HELP,
    AcceptFailuresOption,
    DbOption,
    ForceOption,
    JsonOption,
    PriorWeightOption,
    SetOption,
    catalog,
    check_plot_target,
    console,
    err_console,
    exclusive_outputs,
    fitted_table,
    fmt_sig,
    interrupted,
    parse_overrides,
    print_json,
    progress_bar,
    refuse_force_without_output,
    stop_on_ctrl_c,
)
from capsim.cli.parity_plot import metric_panels, plot_parity
from capsim.cli.predict import split_list
from capsim.errors import CapsimUserError

SHARE_STEPS = 1000
"""Steps of the bar of ``validate --calibrated``, which shows the share of the estimated
work done (part_fits.FitProgress)."""


class CrossValidationMethod(StrEnum):
    """How ``validate --calibrated`` leaves levels and points out."""

    linearised = "linearised"
    refit = "refit"


if TYPE_CHECKING:
    from capsim.calibration.compare import ComparedPoint


def metric_text(metric: str, statistic: str = "mean") -> str:
    """A compared metric as the tables name it: ``tpot_s``, or ``tpot_s p99`` for a
    statistic other than the mean."""
    return metric if statistic == "mean" else f"{metric} {statistic}"


def headline_line(every_point: list[dict], points: list[ComparedPoint]) -> str:
    """validate's last line: the headline (every point's median absolute error by metric
    family with its median optimism, as the summary's first table and the docs give it),
    then the mean."""
    from capsim.calibration.compare import mape

    parts = ", ".join(
        f"{g['group']} {g['median_abs_error_percent']:.1f}% "
        f"({g['points']}, optimism {g['median_optimism_percent']:+.1f}%)"
        for g in sorted(every_point, key=lambda g: HEADLINE_ORDER.get(g["group"], 99))
    )
    return (
        f"every point, median absolute error: {parts}; "
        f"MAPE over {len(points)} points: {mape(points):.1f}%"
    )


HEADLINE_ORDER = {"throughput": 0, "TPOT": 1, "TTFT": 2, "E2E": 3}


def markdown(points: list[ComparedPoint]) -> str:
    from capsim.calibration.compare import mape

    lines = [
        "| dataset | scenario | C | metric | measured | predicted | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(
            f"| {p.dataset} | {p.scenario} | {p.concurrency} | "
            f"{metric_text(p.metric, p.statistic)} | {fmt_sig(p.measured)} | "
            f"{fmt_sig(p.predicted)} | {100 * p.error:+.1f}% |"
        )
    lines.append(f"\nMAPE over {len(points)} points: {mape(points):.1f}%")
    return "\n".join(lines)


SUMMARY_TITLES = {
    "every_point": "every point (reference only included)",
}
"""Column headings of validate's summary tables where the key does not say it."""


def summary_markdown(summaries: dict[str, list[dict]], skipped) -> str:
    """Median and mean absolute errors per accelerator, metric family and engine, and the
    scenarios that could not be simulated, as Markdown."""
    lines = []
    for title, rows in summaries.items():
        if not rows:
            continue
        name = SUMMARY_TITLES.get(title, title.removeprefix("by_").replace("_", " "))
        lines += [
            "",
            f"| {name} | points | median abs. error | median optimism | MAPE |",
            "|---|---|---|---|---|",
        ]
        for r in rows:
            lines.append(
                f"| {r['group']} | {r['points']} | {r['median_abs_error_percent']:.1f}% | "
                f"{r['median_optimism_percent']:+.1f}% | {r['mape_percent']:.1f}% |"
            )
    if any(summaries.values()):
        lines += ["", OPTIMISM]
    if skipped:
        lines += ["", f"{len(skipped)} scenario(s) not simulated:"]
        lines += [f"- {s.dataset} / {s.scenario} ({s.points} points): {s.reason}" for s in skipped]
    return "\n".join(lines)


def loso_markdown(rows: list[dict]) -> str:
    """``loso_summaries`` as a Markdown table."""
    lines = [
        "",
        "| leave one source out (calibration/priors_in_view.yaml) | points | in-sample "
        "median abs. | left out median abs. | left out median optimism |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['points']}: {r['group']} | {r['count']} | "
            f"{r['in_sample_median_abs_error_percent']:.1f}% | "
            f"{r['left_out_median_abs_error_percent']:.1f}% | "
            f"{r['left_out_median_optimism_percent']:+.1f}% |"
        )
    return "\n".join(lines)


OPTIMISM = (
    "median optimism: + where capsim predicts the servers faster than they were (a rate too "
    "high or a time too short), - slower; absolute errors are on each metric as quoted"
)

UNITS = "each metric in the unit its name ends in (_s: seconds, _tok_s: tokens/s)"
"""Caption of validate's tables: measured and predicted are in the metric's own unit."""

COMPACT = dict(cell_padding=2, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
"""fitted_table options for two spaces between columns (as predict's table)."""


ERROR_COLUMNS = {
    "uncalibrated": "MAPE uncalibrated",
    "in_sample": "MAPE in-sample",
    "cross_validated": "MAPE CV (leave level out)",
    "cross_validated_point": "MAPE CV (leave point out)",
}
"""Error columns of ``validate --calibrated``, and their headings in the summary."""


def summarize_errors(rows: list[dict]) -> list[dict]:
    """Per dataset and per metric within it: the MAPE of each error column (percent;
    None where no point has that error)."""
    from capsim.calibration.compare import mape_of

    def mapes(sub: list[dict]) -> dict:
        out = {}
        for col in ERROR_COLUMNS:
            errors = [r[col] for r in sub if r[col] is not None]
            out[f"{col}_mape"] = mape_of(errors) if errors else None
        return out

    out = []
    for name in dict.fromkeys(r["dataset"] for r in rows):
        sub = [r for r in rows if r["dataset"] == name]
        metrics = dict.fromkeys(r["metric"] for r in sub)
        by_metric = {m: mapes([r for r in sub if r["metric"] == m]) for m in metrics}
        out.append({"dataset": name, "points": len(sub), **mapes(sub), "by_metric": by_metric})
    return out


def validate_cmd(
    ctx: typer.Context,
    datasets: Annotated[
        list[Path] | None,
        typer.Argument(help="Dataset YAML files or folders (default: calibration/published)"),
    ] = None,
    calibrated: Annotated[
        bool,
        typer.Option("--calibrated", help="Also fit each dataset: in-sample and cross-validated"),
    ] = False,
    fit: Annotated[
        str | None,
        typer.Option(
            "--fit",
            help="With --calibrated: comma-separated parameters to fit (default: the "
            "hardware class's set, as capsim calibrate)",
        ),
    ] = None,
    cv: Annotated[
        CrossValidationMethod | None,
        typer.Option(
            "--point-cv",
            help="With --calibrated: how each point is left out (default: linearised). "
            "linearised: the fit on every point linearised at its optimum, one simulation a "
            "parameter, with the points that alone decide a parameter (and every one of a "
            "dataset of at most 3 points a parameter) refitted; refit: a fit of the same "
            "parameters for every point",
        ),
    ] = None,
    level_cv: Annotated[
        CrossValidationMethod | None,
        typer.Option(
            "--level-cv",
            help="With --calibrated: how each concurrency level is left out (default: "
            "linearised). linearised: from the same linearised fit as --point-cv's (the "
            "parameters the fit on every point chose), with the levels that alone decide a "
            "parameter (and every one of a dataset of at most 3 points a parameter) "
            "refitted; refit: a fit for every level, choosing its own parameters as capsim "
            "calibrate would (its medians within a few points of linearised's, the run "
            "about twice as long)",
        ),
    ] = None,
    md: Annotated[bool, typer.Option("--markdown", help="Print a Markdown table")] = False,
    prior_weight: PriorWeightOption = 0.0,
    set_values: SetOption = None,
    plot_path: Annotated[
        Path | None,
        typer.Option("--plot", help=PLOT_HELP.format(what="a parity plot of every point")),
    ] = None,
    write_bands: Annotated[
        Path | None,
        typer.Option(
            "--write-bands",
            help="Write the uncalibrated 80% bands (per hardware class and metric family) "
            "that predict uses without a profile, e.g. calibration/bands/uncalibrated.yaml",
        ),
    ] = None,
    coverage: Annotated[
        bool,
        typer.Option(
            "--coverage",
            help="Measure how often the uncalibrated 50% and 80% bands hold the truth, "
            "leaving each source (dataset) out of the bands it is checked against",
        ),
    ] = False,
    accept_failures: AcceptFailuresOption = False,
    json_out: JsonOption = False,
    force: ForceOption = False,
    db: DbOption = None,
) -> None:
    """Predict every published measurement and report the error."""
    from capsim.files import refuse_missing_folder, refuse_overwrite, refuse_writing_over_inputs

    check_plot_target(plot_path, force)
    refuse_force_without_output(force, plot_path, write_bands)
    if write_bands is not None:
        if write_bands.suffix.lower() not in (".yaml", ".yml"):  # bands are read back as YAML
            raise CapsimUserError(
                f"--write-bands '{write_bands}' is not a .yaml file",
                hint="e.g. calibration/bands/uncalibrated.yaml",
            )
        refuse_overwrite([write_bands], "--write-bands", force)
        refuse_missing_folder(write_bands.parent, "--write-bands", write_bands)
        refuse_writing_over_inputs(
            [write_bands], datasets or [Path("calibration/published")], "--write-bands"
        )
    from capsim.calibration.compare import METRIC_KINDS, compare_or_skip, error_summary, mape
    from capsim.calibration.least_squares import check_fittable
    from capsim.calibration.published import load_published

    exclusive_outputs(json=json_out, markdown=md)
    cat = catalog(db)
    overrides = parse_overrides(set_values)
    if overrides and calibrated:
        raise CapsimUserError(
            "--set applies to the uncalibrated comparison, not to --calibrated",
            hint="to fit with a parameter held at a value of your own, set it in a catalog "
            "overlay (--db DIR with efficiency/CLASS.yaml) and leave it out of --fit",
        )
    typed = getattr(ctx.get_parameter_source("prior_weight"), "name", None) == "COMMANDLINE"
    if (prior_weight or typed) and not calibrated:  # '--prior-weight 0' too: it is no fit's
        raise CapsimUserError("--prior-weight applies to fits: add --calibrated")
    if fit is not None and not calibrated:  # it was ignored, its value unchecked
        raise CapsimUserError("--fit applies to fits: add --calibrated")
    if cv is not None and not calibrated:
        raise CapsimUserError("--point-cv applies to fits: add --calibrated")
    if level_cv is not None and not calibrated:
        raise CapsimUserError("--level-cv applies to fits: add --calibrated")
    cv = cv or CrossValidationMethod.linearised
    level_cv = level_cv or CrossValidationMethod.linearised
    for flag, given in (("--coverage", coverage), ("--write-bands", write_bands is not None)):
        if given and calibrated:
            raise CapsimUserError(
                f"{flag} works on the uncalibrated bands, not with --calibrated",
                hint=f"run capsim validate {flag} on its own",
            )
    loaded = load_published(datasets, accept_failures)
    if overrides:  # a parameter none of the models reads would change nothing, as in predict
        from capsim.engine.override_checks import refuse_overrides_no_scenario_reads

        refuse_overrides_no_scenario_reads(overrides, loaded, cat)
    stopped = None  # after Ctrl-C: what the output covers
    try:
        if calibrated:
            names = None if fit is None else tuple(split_list(fit, "--fit"))
            if names is not None:
                check_fittable(names)
            skipped_fits: list = []
            parts = calibration_parts(loaded, cat, skipped_fits)
            for s in skipped_fits:
                err_console.print(
                    f"not simulated: {s.dataset} / {s.scenario} ({s.points} points): {s.reason}",
                    highlight=False,
                )
            found: dict[int, list[dict]] = {}
            # the bar measures seconds of simulation (FitProgress): a part's cost is its
            # simulations' count times their length, which points alone did not foretell
            # (its time left read -:-- until the largest part had finished)
            work = FitProgress(parts, names, cv.value, level_cv.value)
            with stop_on_ctrl_c() as ctrl_c, progress_bar(counts=False) as bar:
                # a fixed total (rich forgets the speed it measured when the total
                # changes), the share done never moving back when an estimate grows
                task = bar.add_task(f"fitting {len(parts)} datasets", total=SHARE_STEPS)

                def status(text: str) -> None:
                    bar.update(task, description=text)

                def share() -> float:
                    done = SHARE_STEPS * work.completed() / work.total()
                    return max(bar.tasks[0].completed, min(done, SHARE_STEPS))

                def simulated(index: int, seconds: float) -> None:
                    work.simulated(index, seconds)
                    bar.update(task, completed=share())

                try:
                    for i, part_rows in calibrated_part_rows(
                        parts,
                        cat,
                        names,
                        prior_weight,
                        cv.value,
                        status,
                        simulated,
                        level_cv.value,
                    ):
                        found[i] = part_rows
                        work.finish(i)
                        bar.update(
                            task,
                            completed=share(),
                            description=f"fitted {len(found)} of {len(parts)} datasets",
                        )
                except BaseException as exc:
                    if not ctrl_c.stopped(exc):
                        raise
                    done = len(found)
                    stopped = (
                        f"{done} of {len(parts)} datasets fitted and cross-validated; the "
                        f"results cover those{'' if plot_path is None else ' (no plot written)'}"
                        if done
                        else f"before the first of {len(parts)} datasets was fitted"
                    )
            rows = [row for i in sorted(found) for row in found[i]]
            if stopped and not rows:
                return
            summary = summarize_errors(rows)
            if plot_path is not None and not stopped:
                panels = {
                    heading.removeprefix("MAPE "): [
                        (r["dataset"], r["measured"], r["measured"] * (1 + r[col]))
                        for r in rows
                        if r[col] is not None
                    ]
                    for col, heading in ERROR_COLUMNS.items()
                }
                plot_parity(panels, plot_path)
            if json_out:
                print_json({"points": rows, "datasets": summary})
                return

            def pct(v):
                return "—" if v is None else f"{100 * v:+.1f}%"

            def mape_text(v):
                return "—" if v is None else f"{v:.1f}%"

            lines = [
                "| dataset | points | " + " | ".join(ERROR_COLUMNS.values()) + " |",
                "|---|---|" + "---|" * len(ERROR_COLUMNS),
            ]
            for d in summary:
                cells = [mape_text(d[f"{col}_mape"]) for col in ERROR_COLUMNS]
                lines.append(f"| {d['dataset']} | {d['points']} | " + " | ".join(cells) + " |")
                if len(d["by_metric"]) > 1:
                    for metric, m in d["by_metric"].items():
                        n = sum(
                            1
                            for r in rows
                            if r["dataset"] == d["dataset"] and r["metric"] == metric
                        )
                        cells = [mape_text(m[f"{col}_mape"]) for col in ERROR_COLUMNS]
                        lines.append(f"| ... {metric} only | {n} | " + " | ".join(cells) + " |")
            if md:
                console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
                return
            columns = [
                (col, "left" if col in ("scenario", "metric") else "right", False)
                for col in (
                    "scenario",
                    "C",
                    "metric",
                    "measured",
                    "uncal.",
                    "in-sample",
                    "CV level",
                    "CV point",
                )
            ]
            cells = [
                [
                    r["scenario"],
                    str(r["concurrency"]),
                    metric_text(r["metric"], r["statistic"]),
                    fmt_sig(r["measured"]),
                    pct(r["uncalibrated"]),
                    pct(r["in_sample"]),
                    pct(r["cross_validated"]),
                    pct(r["cross_validated_point"]),
                ]
                for r in rows
            ]
            table = fitted_table(
                "capsim validate --calibrated", columns, cells, caption=UNITS, **COMPACT
            )
            console.print(table)
            console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
            return
        scenarios = sum(len(ds.scenarios) for ds in loaded)
        kept: dict[int, tuple[list, list]] = {}  # what a scenario finished, past Ctrl-C
        cut_short = False

        def keep(sc, found, missed) -> None:
            kept[id(sc)] = (found, missed)

        with stop_on_ctrl_c() as ctrl_c, progress_bar() as bar:
            task = bar.add_task("simulating measured scenarios", total=scenarios)
            try:
                compare_or_skip(
                    loaded,
                    cat,
                    overrides=overrides,
                    advance=lambda: bar.advance(task),
                    workers=None,
                    finished=keep,
                )
            except BaseException as exc:
                if not ctrl_c.stopped(exc):
                    raise
                cut_short = True
        # in the datasets' order, whichever finished first
        finished = [sc for ds in loaded for sc in ds.scenarios if id(sc) in kept]
        points = [p for sc in finished for p in kept[id(sc)][0]]
        skipped = [s for sc in finished for s in kept[id(sc)][1]]
        done = len(finished)
        if cut_short:
            stopped = (
                f"{done} of {scenarios} scenarios compared; the results cover those"
                + ("" if plot_path is None else " (no plot written)")
                if points
                else f"before the first of {scenarios} scenarios was compared"
            )
        if stopped and not points:
            return
        if not points:  # it printed 'MAPE over 0 points: nan%' and exited 0
            why = "; ".join(f"{s.scenario}: {s.reason}" for s in skipped[:3])
            raise CapsimUserError(
                f"no point to validate in {len(loaded)} dataset(s)"
                + (f" ({why})" if why else ": they hold no measured points"),
                hint="give a dataset with measured points capsim can simulate",
            )
        if stopped and (coverage or write_bands is not None):
            stopped = f"{done} of {scenarios} scenarios compared; no bands written or checked"
            return
        if write_bands is not None:
            from capsim.calibration.bands import build_band_table, save_band_table

            classes = {g.name: g.hardware_class for g in cat.gpus}
            try:
                save_band_table(build_band_table(points, classes), write_bands)
            except OSError as exc:
                raise CapsimUserError(
                    f"cannot write bands '{write_bands}': {exc.strerror}"
                ) from None
            err_console.print(f"wrote {write_bands}", highlight=False)
        scored = [p for p in points if p.scored]
        if coverage:
            from capsim.calibration.bands import band_coverage

            classes = {g.name: g.hardware_class for g in cat.gpus}
            table = band_coverage(points, classes, lambda p: p.dataset)
            if json_out:
                print_json({"coverage": table, "scheme": "leave one dataset out"})
                return
            headers = (
                "metric",
                "points",
                "inside 50% band",
                "inside 80% band",
                "sources",
                "per source: 50%",
                "80%",
            )
            rows = [
                [
                    family,
                    str(row["points"]),
                    f"{100 * row['inside_50']:.0f}%",
                    f"{100 * row['inside_80']:.0f}%",
                    str(row["sources"]),
                    f"{100 * row['sources_inside_50']:.0f}%",
                    f"{100 * row['sources_inside_80']:.0f}%",
                ]
                for family, row in table.items()
            ]
            if md:
                lines = ["| " + " | ".join(headers) + " |", "|---" * len(headers) + "|"]
                lines += ["| " + " | ".join(r) + " |" for r in rows]
                console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
                return
            out = Table(
                title="Band coverage, leave one dataset out (target: 50% and 80%)",
                box=box.SIMPLE_HEAD,
            )
            for col in headers:
                out.add_column(col, justify="left" if col == "metric" else "right", overflow="fold")
            for r in rows:
                out.add_row(*r)
            console.print(out)
            return
        summaries = {
            # the headline: every point, the reference-only sets included, by metric family
            "every_point": error_summary(points, lambda p: METRIC_KINDS.get(p.metric, p.metric)),
            "by_accelerator": error_summary(scored, lambda p: p.gpu),
            "by_metric": error_summary(scored, lambda p: METRIC_KINDS.get(p.metric, p.metric)),
            "by_engine": error_summary(scored, lambda p: p.engine),
            "reference_only": error_summary(
                [p for p in points if not p.scored], lambda p: p.dataset
            ),
        }
        left_out = None
        if not stopped:
            from capsim.calibration.loso import leave_one_source_out, loso_summaries

            try:
                left_out = loso_summaries(
                    points, leave_one_source_out(loaded, points, cat, overrides=overrides)
                )
            except KeyboardInterrupt:  # Ctrl-C while the sources are predicted again
                stopped = (
                    f"{scenarios} scenarios compared; the results cover them, without the "
                    "leave-one-source-out figures"
                )
        if plot_path is not None and not stopped:
            heading = ", with --set" if overrides else ", uncalibrated"
            plot_parity(metric_panels(points), plot_path, heading)
        if json_out:
            print_json(
                {
                    "points": [
                        {**p.__dict__, "error": p.error, "optimism": p.optimism} for p in points
                    ],
                    "mape_percent": mape(points),
                    **summaries,
                    "leave_one_source_out": left_out,
                    "skipped": [s.__dict__ for s in skipped],
                }
            )
            return
        if md:
            console.print(markdown(points), markup=False, highlight=False, soft_wrap=True)
            console.print(
                summary_markdown(summaries, skipped), markup=False, highlight=False, soft_wrap=True
            )
            if left_out:
                table = loso_markdown(left_out)
                console.print(table, markup=False, highlight=False, soft_wrap=True)
            return
        columns = [
            (col, "left" if col in ("scenario", "metric") else "right", False)
            for col in ("scenario", "C", "metric", "measured", "predicted", "error")
        ]
        rows = [
            [
                p.scenario,
                str(p.concurrency),
                metric_text(p.metric, p.statistic),
                fmt_sig(p.measured),
                fmt_sig(p.predicted),
                f"{100 * p.error:+.1f}%",
            ]
            for p in points
        ]
        title = "capsim validate: predicted vs measured"
        console.print(fitted_table(title, columns, rows, caption=UNITS, **COMPACT))
        console.print(summary_markdown(summaries, skipped), markup=False, highlight=False)
        if left_out:
            console.print(loso_markdown(left_out), markup=False, highlight=False)
        console.print(
            headline_line(summaries["every_point"], points), highlight=False, soft_wrap=True
        )
    finally:
        if stopped:  # what was finished is printed above; then one line and exit 130
            interrupted(stopped)
            raise typer.Exit(EXIT_INTERRUPTED)
