"""``capsim calibrate``: fit efficiency parameters to measurements; write profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from capsim.cli.common import (
    EXIT_INTERRUPTED,
    AcceptFailuresOption,
    DbOption,
    ForceOption,
    JsonOption,
    PriorWeightOption,
    catalog,
    console,
    err_console,
    interrupted,
    print_json,
    progress_bar,
    stop_on_ctrl_c,
)
from capsim.cli.predict import split_list
from capsim.errors import CapsimUserError


def identifiable_text(p) -> str:
    """'yes', or 'no' with why: at a bound, or its relative standard error."""
    if p.identifiable:
        return "yes"
    if p.at_bound:
        return "no (at bound)"
    if p.std is None:
        return "no"
    return f"no (±{100 * p.std / max(abs(p.value), 1e-12):.0f}%)"


def refuse_odd_profile_name(name: str, said: str) -> None:
    """A profile name (``--name``) begins with a letter and reads as no value
    (files.name_read_as_value), nor as 'auto' or 'none' in any case: 'NaN', '1e309', 'true'
    and '8..1' were taken, names that a result's reader takes for a number or a boolean and
    capsim's own lists read as a range (issue 47, round 7). file_stem has checked its
    characters."""
    from capsim.files import name_read_as_value, name_suggestion

    word = name.lower()
    if word in ("auto", "none") and name != word:
        why = f"is --profile's own word '{word}' but for case"
    elif word in ("auto", "none"):
        why = f"could never be chosen: --profile {word} means " + (
            "no profile" if word == "none" else "the class profile"
        )
    elif not (name[:1].isascii() and name[:1].isalpha()):
        why = name_read_as_value(name) or "does not begin with a letter"
    else:
        why = name_read_as_value(name)
        if why is None:
            return
    raise CapsimUserError(
        f"{said} '{name}' {why}; a profile name begins with a letter (A-Z, a-z), then "
        "letters, digits, '-', '_' or '.', no '..', and is no word such as true, null, nan, "
        "inf, auto or none",
        hint="--profile NAME finds the profile by this name, and results carry it",
        suggestions=[name_suggestion(name, "profile")],
    )


def refuse_profile_names_taken(targets: list[Path], keys: list[str], cat) -> None:
    """A profile file named 'none' or 'auto' (which --profile reads as its two words), or
    after another hardware class and engine ('--name consumer-ampere-vllm' on Blackwell
    data: --profile auto then found it for every RTX 3090 and refused it), is an error."""
    taken = {f"{c}-{e}" for c in cat.efficiency.names() for e in cat.engines.names()}
    for target, key in zip(targets, keys, strict=True):  # one profile a class and engine
        stem = target.stem
        if stem in ("none", "auto"):
            raise CapsimUserError(
                f"a profile named '{stem}' could never be chosen: --profile {stem} means "
                f"{'no profile' if stem == 'none' else 'the class profile'}",
                hint="pick another --name (or --out file name)",
            )
        if stem in taken and stem != key:
            raise CapsimUserError(
                f"'{stem}' is the name --profile auto looks up for {stem.rsplit('-', 1)[0]} "
                f"under {stem.rsplit('-', 1)[1]}; this profile is fitted for {key}",
                hint=f"leave --name out (the file is then {key}.yaml), or pick a name that is "
                "no hardware class's",
            )


def calibrate_cmd(
    datasets: Annotated[
        list[Path] | None,
        typer.Argument(help="Dataset YAML files or folders (default: calibration/published)"),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Profile file, or folder when several classes (default: your profile "
            "folder, CAPSIM_PROFILE_DIR or the platform's user data folder; never the "
            "installed package)",
        ),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Profile name")] = None,
    fit: Annotated[
        str | None,
        typer.Option(
            "--fit",
            help="Comma-separated parameters to fit (default: chosen from the data among "
            "the hardware class's candidates and every step-time term; the table says why)",
        ),
    ] = None,
    prior_weight: PriorWeightOption = 0.0,
    accept_failures: AcceptFailuresOption = False,
    json_out: JsonOption = False,
    force: ForceOption = False,
    db: DbOption = None,
) -> None:
    """Fit efficiency parameters per hardware class with scipy least_squares."""
    import numpy as np

    from capsim.calibration.crossval import cross_validate, group_by_class_and_engine
    from capsim.calibration.fit import fit_profile
    from capsim.calibration.profiles import check_log_spread
    from capsim.calibration.published import load_published

    if name is not None:  # before the catalog and the datasets are read
        from capsim.files import file_stem

        file_stem(name, "--name")
        refuse_odd_profile_name(name, "--name")
    cat = catalog(db)
    out_given = out is not None
    if out is None:
        from capsim.calibration.profiles import user_profiles_dir

        out = user_profiles_dir()
    if out.suffix not in ("", ".yaml") and not out.is_dir():
        raise CapsimUserError(
            f"--out {out}: a profile is a .yaml file, or a folder for one profile a hardware "
            f"class; '{out.suffix}' is neither",
            hint=f"use --out {out.with_suffix('.yaml')}, or a folder name without a suffix",
        )
    from capsim.files import path_exists

    if out.suffix != ".yaml" and path_exists(out) and not out.is_dir():
        raise CapsimUserError(
            f"--out {out} exists and is not a folder: profiles are written into a folder, or "
            "to a .yaml file",
            hint=f"use --out {out.with_suffix('.yaml')}, or a folder's name",
        )
    names = None if fit is None else tuple(split_list(fit, "--fit"))
    # one profile a hardware class and engine, named after both unless --name says
    groups = {
        f"{hw_class}-{engine}": (hw_class, engine, group)
        for (hw_class, engine), group in group_by_class_and_engine(
            load_published(datasets, accept_failures), cat
        ).items()
    }
    if len(groups) > 1 and (out.suffix == ".yaml" or name is not None):
        said = f"--out {out}" if out.suffix == ".yaml" else f"--name {name}"
        raise CapsimUserError(
            f"the datasets span {len(groups)} hardware classes and engines "
            f"({', '.join(groups)}), one profile each; {said} names one",
            hint="pass a folder to --out and leave out --name, or datasets of one hardware "
            "class and engine",
        )
    from capsim.files import (
        refuse_missing_folder,
        refuse_overwrite,
        refuse_writing_over_inputs,
    )

    targets = [out if out.suffix == ".yaml" else out / f"{name or key}.yaml" for key in groups]
    refuse_profile_names_taken(targets, list(groups), cat)
    refuse_overwrite(targets, "--out", force)
    if out_given:  # the profile folder of its own (user_profiles_dir) is created
        refuse_missing_folder(out.parent, "--out", out)  # a folder for the profiles is made
    refuse_writing_over_inputs(targets, datasets or [Path("calibration/published")], "--out")
    profiles = []
    skipped = []
    stopped = None  # after Ctrl-C: the class that was being fitted
    size = {
        key: sum(len(sc.points) for ds in g for sc in ds.scenarios)
        for key, (_, _, g) in groups.items()
    }
    # the bar counts points: a class's fit takes time in proportion to them
    with stop_on_ctrl_c() as ctrl_c, progress_bar() as bar:
        task = bar.add_task("fitting profiles", total=sum(size.values()))
        key = ""
        try:
            for key, (_, engine, group) in groups.items():
                bar.update(task, description=f"fitting {key}")
                try:
                    profile = fit_profile(
                        group, cat, name or key, names, prior_weight=prior_weight, engine=engine
                    )
                    cv = cross_validate(
                        group, cat, names, start=profile.fitted_values, prior_weight=prior_weight
                    )
                except CapsimUserError as exc:
                    if len(groups) == 1:
                        raise
                    # one class capsim cannot simulate (a GPU without a figure the step
                    # needs) does not stop the others
                    skipped.append((key, exc.message))
                    bar.advance(task, size[key])
                    continue
                if cv:
                    errors = np.log([p.predicted / p.measured for p in cv])
                    profile.cv_log_residual_sd = check_log_spread(
                        float(np.sqrt(np.mean(errors**2))), "cross-validated log spread"
                    )
                path = out if out.suffix == ".yaml" else out / f"{profile.name}.yaml"
                profile.save(path)
                profiles.append((profile, path))
                bar.advance(task, size[key])
        except BaseException as exc:
            if not ctrl_c.stopped(exc):
                raise
            stopped = key
    for key, why in skipped:
        err_console.print(
            f"[yellow]skipped {escape(key)}:[/] {escape(why)}", markup=True, highlight=False
        )
    if json_out:
        print_json([{"path": str(p), **prof.model_dump(mode="json")} for prof, p in profiles])
    else:
        print_profiles(profiles)
    if stopped:
        written = ", ".join(str(path) for _, path in profiles)
        interrupted(
            f"while fitting {stopped}; "
            + (
                f"{len(profiles)} of {len(groups)} profiles fitted and written: {written}"
                if profiles
                else f"none of {len(groups)} profiles fitted, nothing written"
            )
        )
        raise typer.Exit(EXIT_INTERRUPTED)


def print_profiles(profiles) -> None:
    """Each fitted profile as a table: prior and fitted value, standard error and whether
    the data pin each parameter down; then what was held, poor fits and the residuals."""
    for profile, path in profiles:
        table = Table(
            title=f"{profile.name} ({profile.points} points) -> {path}", box=box.SIMPLE_HEAD
        )
        for col in ("parameter", "prior", "fitted", "std", "identifiable"):
            table.add_column(
                col, justify="left" if col == "parameter" else "right", overflow="fold"
            )
        for key, p in profile.parameters.items():
            table.add_row(
                key,
                f"{p.prior:.4g}",
                f"{p.value:.4g}",
                "—" if p.std is None else f"{p.std:.3g}",
                identifiable_text(p),
            )
        console.print(table)
        for key, why in profile.held_reasons.items():
            where = "its prior" if key not in profile.held else f"{profile.held[key]:.4g}"
            console.print(f"held at {where}: {key}: {why}", highlight=False)
        for warning in profile.warnings:
            console.print(
                f"[yellow]poor fit[/yellow]: {escape(warning)}", markup=True, highlight=False
            )
        cv = "—" if profile.cv_log_residual_sd is None else f"{profile.cv_log_residual_sd:.3f}"
        console.print(
            f"log-residual sd {profile.log_residual_sd:.3f} in-sample, {cv} cross-validated; "
            f"{profile.note}"
        )


def calibrate_kernels_cmd(
    dataset: Annotated[
        Path, typer.Argument(help="Kernel dataset JSON (calibration/kernels/*.json)")
    ],
    weights: Annotated[
        str | None, typer.Option("--weights", help="Only these formats, e.g. bf16")
    ] = None,
    fit: Annotated[
        str | None,
        typer.Option(
            "--fit",
            help="Comma-separated parameters to fit (default: what the rows identify: the "
            "decode terms, and with prefill rows the prefill GEMM, attention and elementwise "
            "terms; calibration/kernels.py default_fit)",
        ),
    ] = None,
    json_out: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Fit the step model's GPU terms to kernel measurements: decode and prefill layers
    timed on one real GPU, or published fused-MoE kernel timings."""
    from capsim.calibration.kernels import (
        check_row_bandwidths,
        fit_kernel_params,
        load_kernel_dataset,
    )
    from capsim.calibration.moe_kernels import (
        MOE_KERNEL_FIT,
        check_moe_rows,
        fit_moe_kernel_params,
        is_moe_dataset,
        load_moe_dataset,
    )

    cat = catalog(db)
    names = tuple(split_list(fit, "--fit")) if fit is not None else None
    if is_moe_dataset(dataset):
        if weights:
            raise CapsimUserError(
                "--weights selects rows of a layer dataset; a fused-MoE dataset is fitted whole",
                hint="leave --weights out",
            )
        ds = load_moe_dataset(dataset)
        check_moe_rows(ds, cat, dataset)
        result = fit_moe_kernel_params(ds, cat, names or MOE_KERNEL_FIT)
        ds_gpu = ", ".join(sorted({r.gpu for r in ds.rows}))
    else:
        ds = load_kernel_dataset(dataset)
        check_row_bandwidths(ds, cat, dataset)
        formats = tuple(split_list(weights, "--weights")) if weights else None
        if formats and not any(r.weights in formats for r in ds.rows):
            have = ", ".join(sorted({r.weights for r in ds.rows}))
            raise CapsimUserError(
                f"--weights {weights}: no row of {ds.name} is in that format",
                hint=f"its rows are in {have}",
            )
        result = fit_kernel_params(ds, cat, names, formats)
        ds_gpu = ds.gpu
    if json_out:
        print_json(
            {
                "dataset": ds.name,
                "gpu": ds_gpu,
                "rows_used": len(result.points),
                "mape_class_defaults": result.mape_prior,
                "mape_fitted": result.mape_fitted,
                "parameters": {
                    n: {"prior": result.prior[n], "fitted": v, "std": result.std[n]}
                    for n, v in result.values.items()
                },
            }
        )
        return
    table = Table(title=f"{ds.name} on {ds_gpu}: {len(result.points)} rows", box=box.SIMPLE_HEAD)
    for col in ("parameter", "class default", "fitted", "std"):
        table.add_column(col, justify="left" if col == "parameter" else "right", overflow="fold")
    for n, v in result.values.items():
        table.add_row(n, f"{result.prior[n]:.4g}", f"{v:.4g}", f"{result.std[n]:.3g}")
    console.print(table)
    console.print(
        f"MAPE {result.mape_prior:.1f}% with the class defaults, {result.mape_fitted:.1f}% fitted"
    )
