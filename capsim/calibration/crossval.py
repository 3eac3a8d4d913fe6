"""Out-of-sample checks of calibration: leave a concurrency level out, or a point."""

from __future__ import annotations

from typing import Literal

import numpy as np

from capsim.calibration.compare import ComparedPoint, compare_dataset
from capsim.calibration.fit import fit_profile, fit_setup
from capsim.calibration.least_squares import (
    DEFAULT_PRIOR_WEIGHT,
    FitProblem,
    bounds_and_start,
    scenario_pool,
    solve,
    start_point,
)
from capsim.calibration.published import PublishedDataset
from capsim.catalog.loader import Catalog

CrossValidation = Literal["level", "point"]
"""Cross-validation schemes: leave one concurrency level out, or leave one point out."""


def group_by_class(datasets: list[PublishedDataset], catalog: Catalog) -> dict[str, list]:
    """Datasets by hardware class; one whose scenarios span several classes (a write-up
    that measured an A100 and an H100) is split into one part per class, under its name."""
    groups: dict[str, list[PublishedDataset]] = {}
    for ds in datasets:
        by_class: dict[str, list] = {}
        for sc in ds.scenarios:
            by_class.setdefault(catalog.gpu(sc.gpu).hardware_class, []).append(sc)
        for hw_class, scenarios in by_class.items():
            part = ds if len(by_class) == 1 else ds.model_copy(update={"scenarios": scenarios})
            groups.setdefault(hw_class, []).append(part)
    return groups


def without_level(ds: PublishedDataset, concurrency: int) -> PublishedDataset | None:
    """The dataset with every point at one concurrency removed (None if nothing is left)."""
    scenarios = []
    for sc in ds.scenarios:
        kept = [p for p in sc.points if p.concurrency != concurrency]
        if kept:
            scenarios.append(sc.model_copy(update={"points": kept}))
    return ds.model_copy(update={"scenarios": scenarios}) if scenarios else None


def only_level(ds: PublishedDataset, concurrency: int) -> PublishedDataset:
    scenarios = []
    for sc in ds.scenarios:
        kept = [p for p in sc.points if p.concurrency == concurrency]
        if kept:
            scenarios.append(sc.model_copy(update={"points": kept}))
    return ds.model_copy(update={"scenarios": scenarios})


def cross_validate(
    datasets: list[PublishedDataset],
    catalog: Catalog,
    fit: tuple[str, ...] | None = None,
    max_evaluations: int = 60,
    scheme: CrossValidation = "level",
    start: dict[str, float] | None = None,
    prior_weight: float = DEFAULT_PRIOR_WEIGHT,
) -> list[ComparedPoint]:
    """Out-of-sample predictions of every point of ``datasets`` (one hardware class).

    ``level``: leave one concurrency level out; fit on the other levels of every dataset,
    predict the left-out level. ``point``: leave one point out; refit on all other points
    and predict that point. Each refit starts from ``start`` (the fit on every point,
    computed here for ``point`` when not given) or else from the priors; where it starts
    changes how fast it converges, not what it leaves out.
    """
    if scheme == "point":
        return leave_one_point_out(datasets, catalog, fit, max_evaluations, start, prior_weight)
    out: list[ComparedPoint] = []
    levels = sorted({p.concurrency for ds in datasets for sc in ds.scenarios for p in sc.points})
    if len(levels) < 2:
        return out
    for level in levels:
        train = [t for t in (without_level(ds, level) for ds in datasets) if t is not None]
        profile = fit_profile(
            train, catalog, f"cv-{level}", fit, max_evaluations, start, prior_weight
        )
        gpu = datasets[0].scenarios[0].gpu
        params = profile.params(catalog, gpu)
        for ds in datasets:
            test = only_level(ds, level)
            if test.scenarios:
                out += compare_dataset(test, catalog, params)
    return out


def leave_one_point_out(
    datasets: list[PublishedDataset],
    catalog: Catalog,
    fit: tuple[str, ...] | None = None,
    max_evaluations: int = 60,
    start: dict[str, float] | None = None,
    prior_weight: float = DEFAULT_PRIOR_WEIGHT,
) -> list[ComparedPoint]:
    """Leave one point out: for each point, refit on all the others (from ``start``, or
    the optimum of a fit on every point, so each refit takes a few evaluations) and
    predict it. The other points of its level stay in the fit, so this asks less of the
    model than leaving a whole level out."""
    _, names, base = fit_setup(datasets, catalog, fit)
    lower, upper, x0 = bounds_and_start(names, base)
    out: list[ComparedPoint] = []
    with scenario_pool(datasets) as pool:
        problem = FitProblem(datasets, catalog, names, base, pool=pool)
        if start is None:
            x_start = solve(
                problem, x0, lower, upper, 2 * max_evaluations, None, x0, prior_weight
            ).x
        else:
            x_start = start_point(names, x0, lower, upper, start)
        points = problem.residuals(x_start).size
        for i in range(points):
            fitted = np.ones(points, dtype=bool)
            fitted[i] = False
            solve(problem, x_start, lower, upper, max_evaluations, fitted, x0, prior_weight)
            out.append(problem.last[i])  # the last evaluation is at the refit's optimum
    return out
