"""Out-of-sample checks of calibration: leave a concurrency level out, or a point."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import numpy as np

from capsim.calibration.compare import ComparedPoint, compare_dataset
from capsim.calibration.fit import Sensitivities, fit_profile, fit_setup, fitted_params
from capsim.calibration.least_squares import (
    AT_BOUND,
    DEFAULT_PRIOR_WEIGHT,
    ROBUST_SCALE,
    FitProblem,
    bounds_and_start,
    scenario_pool,
    solve,
    start_point,
)
from capsim.calibration.published import PublishedDataset
from capsim.calibration.selection import point_weights
from capsim.catalog.loader import Catalog, engine_base

CrossValidation = Literal["level", "point"]
"""Cross-validation schemes: leave one concurrency level out, or leave one point out."""

CV_TOLERANCE = 1e-3
"""Relative ftol and xtol of the refits that cross-validation runs (a level or a point left
out), ten times calibrate's FIT_TOLERANCE: the figure is the refit's prediction of what it
left out, which a change of 0.1% in cost or parameters barely moves. Counted on 2026-11-30
on two parts of validate --calibrated (scenario simulations of the part, leave-a-level-out
median): RTX 4090 Mistral 165 -> 145, 21.23% -> 21.17%; InferenceX gpt-oss-120b 1k/8k on
an H100 171 -> 156, 17.26% -> 17.26%. At 1e-2 the second read 121 and 16.05%: a refit
stopped that early stays nearer where it starts, the fit on every point, which saw the
left-out level, so the test grows kinder; not taken."""


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


def profile_engine(sc) -> str:
    """The engine a profile fitted on scenario ``sc`` serves under ``--profile auto``: the
    engine it is simulated as, without a release ('vllm@0.7.3' and 'other' are vllm)."""
    from capsim.calibration.compare import simulated_engine

    return engine_base(simulated_engine(sc))


def group_by_class_and_engine(
    datasets: list[PublishedDataset], catalog: Catalog
) -> dict[tuple[str, str], list]:
    """Datasets by (hardware class, engine): a profile serves one engine (capsim
    calibrate), so llama.cpp's points on an RTX 4090 fit another profile than vLLM's; a
    dataset spanning several is split into one part per pair, under its name."""
    groups: dict[tuple[str, str], list[PublishedDataset]] = {}
    for hw_class, parts in group_by_class(datasets, catalog).items():
        for ds in parts:
            by_engine: dict[str, list] = {}
            for sc in ds.scenarios:
                by_engine.setdefault(profile_engine(sc), []).append(sc)
            for engine, scenarios in by_engine.items():
                part = ds if len(by_engine) == 1 else ds.model_copy(update={"scenarios": scenarios})
                groups.setdefault((hw_class, engine), []).append(part)
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
    sensitivities: Sensitivities | None = None,
    held: dict[str, float] | None = None,
    only_levels: list[int] | None = None,
) -> list[ComparedPoint]:
    """Out-of-sample predictions of every point of ``datasets`` (one hardware class).

    ``level``: leave one concurrency level out; fit on the other levels of every dataset,
    predict the left-out level. ``point``: leave one point out; refit on all other points
    and predict that point. Each refit starts from ``start`` (the fit on every point,
    computed here for ``point`` when not given) or else from the priors; where it starts
    changes how fast it converges, not what it leaves out. ``sensitivities``: those of the
    fit on every point (fit_profile's ``record``), from which each level's fold chooses
    its parameters on its own points' rows without simulating them again. ``held``: for
    ``point``, the values the fit on every point held (leave_one_point_out).
    ``only_levels``: for ``level``, leave out these levels only (their points alone come
    back), e.g. those the linearised scheme cannot answer for.
    """
    if scheme == "point":
        return leave_one_point_out(
            datasets, catalog, fit, max_evaluations, start, prior_weight, held=held
        )
    out: list[ComparedPoint] = []
    levels = sorted({p.concurrency for ds in datasets for sc in ds.scenarios for p in sc.points})
    if len(levels) < 2:
        return out
    for level in levels if only_levels is None else [v for v in levels if v in only_levels]:
        train = [t for t in (without_level(ds, level) for ds in datasets) if t is not None]
        profile = fit_profile(
            train,
            catalog,
            f"cv-{level}",
            fit,
            max_evaluations,
            start,
            prior_weight,
            sensitivities,
            tolerance=CV_TOLERANCE,
        )
        params = fitted_params(profile, train, catalog, fit)  # over the fold's own base
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
    only: list[int] | None = None,
    held: dict[str, float] | None = None,
) -> list[ComparedPoint]:
    """Leave one point out: for each point (or each of the indices ``only``, in that
    order), refit on all the others (from ``start``, or the optimum of a fit on every
    point, so each refit takes a few evaluations) and predict it. The other points of its
    level stay in the fit, so this asks less of the model than leaving a whole level out.

    Without ``fit``, the refits fit the parameters ``start`` holds (those the fit on every
    point chose), over the values that fit ``held`` away from their priors, as the
    linearised scheme does (linearised_cross_validation); with neither, every candidate
    of the class. Refitting every candidate on the points a fit chose two or three of had
    each refit move a dozen parameters that the remaining points cannot pin down: on the
    RTX 3090 Vulkan part (6 points, 2 chosen) 10-20 evaluations of 15 simulations a
    refit, 33 s in all where the fit took 1.3 s."""
    if fit is None and start:
        fit = tuple(start)
    _, names, base = fit_setup(datasets, catalog, fit)
    base = base.with_overrides(held or {})
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
        for i in range(points) if only is None else only:
            fitted = np.ones(points, dtype=bool)
            fitted[i] = False
            solve(
                problem,
                x_start,
                lower,
                upper,
                max_evaluations,
                fitted,
                x0,
                prior_weight,
                tolerance=CV_TOLERANCE,
            )
            out.append(problem.last[i])  # the last evaluation is at the refit's optimum
    return out


JACOBIAN_STEP = 0.02
"""Relative step of the finite differences behind the linearised cross-validation (the
fits' own ``diff_step``)."""


LEVERAGE_CEILING = 0.9
"""A point whose leverage in the linearised fit is above this mostly decides a parameter on
its own: left out, the linear picture cannot say where the fit goes (r / (1 - h) blows
up), so it is refitted instead."""


def linearised_cross_validation(
    datasets: list[PublishedDataset],
    catalog: Catalog,
    fitted: dict[str, float],
    held: dict[str, float] | None = None,
    prior_weight: float = DEFAULT_PRIOR_WEIGHT,
) -> tuple[list[ComparedPoint], list[ComparedPoint], list[int]]:
    """Leave-one-level-out and leave-one-point-out predictions of every point of
    ``datasets`` (one hardware class) from the fit on all of them (``fitted``: parameter
    values; ``held``: values the fit held away from their priors), without refitting.

    The fit is linearised at its optimum: with J the Jacobian of the weighted log
    residuals r (finite differences, one simulation a parameter) and w the soft-L1 loss's
    weights there (1 / sqrt(1 + (r / ROBUST_SCALE)^2)), leaving out a group g of points
    moves its residuals to (I - H_gg)^-1 r_g in the whitened space, H = W^1/2 J (J^T W J +
    P)^-1 J^T W^1/2 (P: the prior pull's curvature). For a model linear in its parameters
    that is exactly what refitting without the group gives (the PRESS identity); for
    capsim's it is one Gauss-Newton step from the full fit, which is also where the exact
    refits start. Parameters at a bound stay there. One Jacobian serves every group, so
    both schemes cost p + 1 simulations of the datasets instead of a fit a group. The third
    list holds the points (indices) of leverage above LEVERAGE_CEILING, whose linearised
    prediction is not to be trusted (refit them); the fourth the levels (concurrencies)
    whose group of points has a leverage above it (the largest eigenvalue of H_gg: the
    level alone decides a direction of the parameters), to be refitted likewise."""
    _, _, base = fit_setup(datasets, catalog, tuple(fitted) or None)
    base = base.with_overrides(held or {})
    names = list(fitted)
    lower, upper, _ = bounds_and_start(names, base)
    x = np.clip(np.array([fitted[n] for n in names], dtype=float), lower, upper)
    with scenario_pool(datasets) as pool:
        problem = FitProblem(datasets, catalog, names, base, pool=pool)
        r = problem.residuals(x)
        points = list(problem.last)
        span = upper - lower
        free = np.array(
            [min(x[i] - lower[i], upper[i] - x[i]) > AT_BOUND * span[i] for i in range(len(x))],
            dtype=bool,
        )
        jac = np.zeros((r.size, len(names)))
        for i in np.flatnonzero(free):
            step = JACOBIAN_STEP * max(abs(x[i]), 0.01 * span[i])
            if x[i] + step > upper[i]:
                step = -step
            moved = x.copy()
            moved[i] += step
            jac[:, i] = (problem.residuals(moved) - r) / step
    groups_level: dict[int, list[int]] = {}
    for k, pt in enumerate(points):
        groups_level.setdefault(pt.concurrency, []).append(k)
    by_level = _left_out(points, r, jac[:, free], span[free], prior_weight, groups_level)
    high_levels = [
        level
        for level, h in _group_leverage(
            r, jac[:, free], span[free], prior_weight, groups_level
        ).items()
        if h > LEVERAGE_CEILING
    ]
    if len(groups_level) < 2:  # nothing is left to fit a level from
        by_level, high_levels = [], []
    singles = {k: [k] for k in range(r.size)}
    by_point = _left_out(points, r, jac[:, free], span[free], prior_weight, singles)
    high = np.flatnonzero(_leverage(r, jac[:, free], span[free], prior_weight) > LEVERAGE_CEILING)
    return by_level, by_point, high.tolist(), sorted(high_levels)


def _whitened(r: np.ndarray, jac: np.ndarray, span: np.ndarray, prior_weight: float):
    """The linearised fit in the soft-L1 loss's whitened space: the square roots of the
    loss's weights at ``r`` (1 / sqrt(1 + (r / ROBUST_SCALE)^2)), the whitened Jacobian,
    and the inverse of its curvature (with the prior pull's, P)."""
    root = np.sqrt(1.0 / np.sqrt(1.0 + (r / ROBUST_SCALE) ** 2))
    jw = root[:, None] * jac
    if not span.size:
        return root, jw, np.zeros((0, 0))
    curvature = jw.T @ jw
    if prior_weight > 0:
        curvature = curvature + np.diag((prior_weight / span) ** 2)
    return root, jw, np.linalg.pinv(curvature)


def _leverage(r: np.ndarray, jac: np.ndarray, span: np.ndarray, prior_weight: float):
    """Each point's leverage h_ii in the linearised, soft-L1-whitened fit."""
    _, jw, inverse = _whitened(r, jac, span, prior_weight)
    return np.einsum("ij,jk,ik->i", jw, inverse, jw)


def _group_leverage(
    r: np.ndarray,
    jac: np.ndarray,
    span: np.ndarray,
    prior_weight: float,
    groups: dict[int, list[int]],
) -> dict[int, float]:
    """Each group's leverage in the linearised, soft-L1-whitened fit: the largest
    eigenvalue of its block H_gg of the hat matrix (1 where the group alone decides a
    direction of the parameters; a single point's is its h_ii)."""
    _, jw, inverse = _whitened(r, jac, span, prior_weight)
    out = {}
    for key, rows in groups.items():
        block = jw[np.array(rows)]
        h = block @ inverse @ block.T
        out[key] = float(np.linalg.eigvalsh((h + h.T) / 2).max()) if h.size else 0.0
    return out


def _left_out(
    points: list[ComparedPoint],
    r: np.ndarray,
    jac: np.ndarray,
    span: np.ndarray,
    prior_weight: float,
    groups: dict[int, list[int]],
) -> list[ComparedPoint]:
    """``points`` as predicted with each group of them left out of the linearised fit
    (see linearised_cross_validation), in their order."""
    root, jw, inverse = _whitened(r, jac, span, prior_weight)
    weights = np.sqrt(point_weights(points))
    left = np.empty_like(r)
    for rows in groups.values():
        idx = np.array(rows)
        h = jw[idx] @ inverse @ jw[idx].T
        e = np.linalg.lstsq(np.eye(idx.size) - h, root[idx] * r[idx], rcond=None)[0]
        left[idx] = e / root[idx]
    out = []
    for k, pt in enumerate(points):
        log_error = left[k] / weights[k] if weights[k] > 0 else np.log(pt.predicted / pt.measured)
        # a point that decides a parameter alone (leverage ~1) has no finite linear answer;
        # the caller refits it (LEVERAGE_CEILING)
        log_error = float(np.clip(log_error, -50.0, 50.0))
        out.append(replace(pt, predicted=float(pt.measured * np.exp(log_error))))
    return out
