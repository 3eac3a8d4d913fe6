"""Fitting efficiency parameters to measurements, and the profiles that hold them.

Residuals are log(predicted / measured) per point: relative errors, symmetric in over-
and under-prediction. ``scipy.optimize.least_squares`` minimises them with a soft-L1 loss
(robust to a few odd points, such as seed 002's C=3 values) within each parameter's bounds,
simulating every measured scenario with the engine at each evaluation.

Uncertainty comes from the Jacobian at the optimum: cov = s^2 (J^T J)^-1 with
s^2 = sum(r^2) / (n - p). A parameter is reported as not identifiable when the data barely
move the residuals along it (its singular direction is weak) or its standard error exceeds
half its bounded range; such a parameter is flagged, and its value is whatever the joint
optimum left it at (near its prior, the hardware-class default, when the data ignore it).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np

from capsim.calibration.compare import (
    ENGINE_SIMULATED,
    METRIC_KINDS,
    ComparedPoint,
    compare_dataset,
    compare_datasets,
)
from capsim.calibration.profiles import FittedParameter, PointResidual, Profile
from capsim.calibration.published import PublishedDataset
from capsim.calibration.selection import (
    CANDIDATE_FIT,
    IDENTIFIABLE_RSE,
    fit_warnings,
    point_weights,
    select_parameters,
)
from capsim.catalog.loader import Catalog
from capsim.engine.pool import worker_pool
from capsim.errors import CapsimUserError, close_matches
from capsim.physics.efficiency import EfficiencyParams
from capsim.physics.step import default_efficiency

FIT_BOUNDS: dict[str, tuple[float, float]] = {
    "bandwidth_efficiency": (0.3, 1.0),
    "moe_bandwidth_efficiency": (0.15, 1.0),
    "moe_layer_overhead_us": (0.0, 200.0),
    "moe_expert_overhead_us": (0.0, 5.0),
    "kv_bandwidth_efficiency": (0.2, 1.0),
    "elementwise_bandwidth_efficiency": (0.1, 1.0),
    "compute_efficiency": (0.005, 1.0),  # a tiny model on a CPU core: 0.03-0.06 (cpu-host)
    "attention_compute_efficiency": (0.02, 1.0),
    "step_overhead_us": (0.0, 20_000.0),
    "per_sequence_overhead_us": (0.0, 2_000.0),
    "layer_overhead_graph_us": (0.0, 200.0),
    "layer_overhead_eager_us": (0.0, 2000.0),
    "layer_overhead_compiled_us": (0.0, 2000.0),
    "allreduce_latency_us": (0.0, 300.0),
    "allreduce_eager_launch_us": (0.0, 500.0),
    "l2_reuse_strength": (0.0, 1.0),
    "moe_routing_skew": (0.0, 2.0),
    "compute_power_exponent": (0.0, 4.0),
    "bandwidth_power_exponent": (0.0, 4.0),
    "async_host_overlap": (0.0, 1.0),
    "prefill_compute_efficiency": (0.02, 1.0),
    "custom_allreduce_latency_us": (0.0, 100.0),
    "frontend_request_ms": (0.0, 500.0),
    "api_server_ms_per_request": (0.0, 200.0),
}
"""Parameters calibration may fit, with their bounds (units as in EfficiencyParams)."""

FIT_TOLERANCE = 1e-4
"""least_squares stops when the cost or the parameters change by less than this (relative).
Standard errors are 10% of a value or more, so finer convergence buys nothing but
simulations."""

ROBUST_SCALE = 0.1
"""soft-L1 scale on log residuals: errors beyond about 10% count linearly, not squared."""

DEFAULT_PRIOR_WEIGHT = 0.0
"""Default pull of each fitted parameter towards its prior (``prior_weight``): off. With a
weight w the loss gains one residual per parameter, w x (value - prior) / (its bounded
range), next to the points' log residuals, so moving a parameter across its whole range
costs w in log units, like a point w off. Measured with ``capsim validate --calibrated
--prior-weight 1``: on seed 002 it lowered cross-validated error (leave a level out 16.7%
-> 15.0%, leave a point out 13.6% -> 12.6%) at about the same in-sample error (10.9% ->
11.0%), and on seed 000 (353% -> 328%); on seed 001 (three parameters far from their
priors, four points) it raised leave-one-point-out error from 11.3% to 18.8%, and on seed
004 from 83% to 88%. A pull that helps two datasets and hurts two is not a default."""

DEFAULT_FIT = (
    "bandwidth_efficiency",
    "moe_bandwidth_efficiency",
    "step_overhead_us",
    "layer_overhead_eager_us",
    "allreduce_eager_launch_us",
)
"""What calibrate fits by default: the weight-read efficiencies, the host's work per step
and the two eager launch costs (which decide eager steps once they outlast the GPU's work).
With seed 002's four levels, more parameters overfit: leave-one-level-out error was 23.9%
with eight parameters. A hardware class may name its own set (``fit`` in
hardware_db/efficiency/)."""


def class_fit(hw_class: str, catalog: Catalog) -> tuple[str, ...]:
    """The parameters calibrate fits for a hardware class by default."""
    entry = catalog.efficiency.entries.get(hw_class)
    return tuple(entry.fit) if entry is not None and entry.fit else DEFAULT_FIT


@dataclass
class FitProblem:
    """Points of one hardware class and the parameters to fit."""

    datasets: list[PublishedDataset]
    catalog: Catalog
    names: list[str]
    base: EfficiencyParams
    evaluations: int = 0
    last: list[ComparedPoint] = field(default_factory=list)
    pool: Executor | None = None  # processes to simulate the scenarios in

    def params_for(self, x: np.ndarray) -> EfficiencyParams:
        return self.base.with_overrides(dict(zip(self.names, map(float, x), strict=True)))

    def residuals(self, x: np.ndarray) -> np.ndarray:
        params = self.params_for(x)
        points = compare_datasets(self.datasets, self.catalog, params, self.pool)
        self.evaluations += 1
        self.last = points
        weights = np.sqrt(point_weights(points))
        return weights * np.array([np.log(p.predicted / p.measured) for p in points])


@contextmanager
def scenario_pool(datasets: list[PublishedDataset]) -> Iterator[Executor | None]:
    """Worker processes (one per core) to simulate a fit's scenarios in, or None on one
    core or with a single scenario."""
    scenarios = sum(len(ds.scenarios) for ds in datasets)
    cores = os.cpu_count() or 1
    if cores < 2 or scenarios < 2:
        yield None
        return
    with worker_pool(min(cores, scenarios)) as pool:
        yield pool


def bounds_and_start(
    names: list[str] | tuple[str, ...], base: EfficiencyParams
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lower and upper bounds of fittable parameters, and their starting values (the
    base values, clipped into the bounds)."""
    lower = np.array([FIT_BOUNDS[n][0] for n in names])
    upper = np.array([FIT_BOUNDS[n][1] for n in names])
    x0 = np.clip(np.array([prior_value(base, n) for n in names], dtype=float), lower, upper)
    return lower, upper, x0


AT_BOUND = 0.002
"""A fitted value within this share of its range from a bound counts as at the bound."""

INHERITED_PRIORS = {"prefill_compute_efficiency": "compute_efficiency"}
"""Parameters whose unset value (None) means another's: their prior is that one's."""


def prior_value(base: EfficiencyParams, name: str) -> float:
    """A parameter's prior in ``base``, following INHERITED_PRIORS where it is unset."""
    value = getattr(base, name)
    return getattr(base, INHERITED_PRIORS[name]) if value is None else value


def start_point(
    names: list[str],
    x0: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    start: dict[str, float] | None,
) -> np.ndarray:
    """Where a fit starts: ``start``'s values (clipped into the bounds) for the parameters
    it names, the priors ``x0`` for the others and when it is None."""
    if start is None:
        return x0
    return np.clip([start.get(n, x0[i]) for i, n in enumerate(names)], lower, upper)


def jacobian_covariance(jac: np.ndarray, residuals: np.ndarray) -> np.ndarray:
    """Covariance of least-squares parameters from the Jacobian at the optimum (units of
    the parameters squared): s^2 (J^T J)^-1, s^2 = sum(r^2) / (n - p) (pseudo-inverse);
    infinite where it cannot be computed."""
    n, p = jac.shape
    s2 = float(residuals @ residuals) / max(n - p, 1)
    try:
        return np.linalg.pinv(jac.T @ jac) * s2
    except np.linalg.LinAlgError:
        return np.full((p, p), np.inf)


def jacobian_std(jac: np.ndarray, residuals: np.ndarray) -> np.ndarray:
    """Standard errors of least-squares parameters: sqrt of the diagonal of
    ``jacobian_covariance``."""
    return np.sqrt(np.clip(np.diag(jacobian_covariance(jac, residuals)), 0, None))


def correlation_of(cov: np.ndarray, names: list[str]) -> dict[str, dict[str, float]]:
    """Each pair of parameters' correlation (-1..1) from their covariance, as
    {name: {other: rho}} with each pair once (the first name in ``names`` order holds it);
    pairs with an infinite or zero variance are left out."""
    out: dict[str, dict[str, float]] = {}
    for i, a in enumerate(names):
        for j in range(i + 1, len(names)):
            denom = math.sqrt(cov[i, i] * cov[j, j]) if cov[i, i] > 0 and cov[j, j] > 0 else 0
            if denom and math.isfinite(denom) and math.isfinite(cov[i, j]):
                rho = float(np.clip(cov[i, j] / denom, -1.0, 1.0))
                out.setdefault(a, {})[names[j]] = rho
    return out


CrossValidation = Literal["level", "point"]
"""Cross-validation schemes: leave one concurrency level out, or leave one point out."""


def check_fittable(names) -> None:
    """Reject parameter names calibration cannot fit, naming those it can."""
    unknown = [n for n in names if n not in FIT_BOUNDS]
    if unknown:
        raise CapsimUserError(
            f"cannot fit {', '.join(unknown)}",
            hint="fittable: " + ", ".join(FIT_BOUNDS),
            suggestions=[m for n in unknown for m in close_matches(n, FIT_BOUNDS)],
        )


def hardware_class_of(ds: PublishedDataset, catalog: Catalog) -> str:
    classes = {catalog.gpu(sc.gpu).hardware_class for sc in ds.scenarios}
    if len(classes) != 1:
        raise CapsimUserError(f"dataset {ds.name} mixes hardware classes {sorted(classes)}")
    return classes.pop()


@dataclass
class LeastSquaresFit:
    """The optimum of one least-squares fit: parameter values, the Jacobian of the points
    fitted, and the residuals of every point there."""

    x: np.ndarray
    jac: np.ndarray
    residuals: np.ndarray


def solve(
    problem: FitProblem,
    x0: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    max_evaluations: int,
    fitted: np.ndarray | None = None,
    prior: np.ndarray | None = None,
    prior_weight: float = DEFAULT_PRIOR_WEIGHT,
) -> LeastSquaresFit:
    """Minimise the soft-L1 loss of ``problem``'s log residuals from ``x0`` within bounds.
    ``fitted`` (a boolean mask over the points) leaves the others out of the loss; they
    are still simulated and come back in ``residuals``. With ``prior_weight`` > 0 each
    parameter is pulled towards ``prior`` (see DEFAULT_PRIOR_WEIGHT); the Jacobian that
    comes back holds the points' rows only, so standard errors and identifiability say
    what the data pin down."""
    pull = prior_weight > 0 and prior is not None
    span = upper - lower

    def loss_residuals(x: np.ndarray) -> np.ndarray:
        r = problem.residuals(x)
        r = r if fitted is None else r[fitted]
        return np.concatenate((r, prior_weight * (x - prior) / span)) if pull else r

    from scipy.optimize import least_squares  # heavy: imported where fits run

    result = least_squares(
        loss_residuals,
        x0,
        bounds=(lower, upper),
        loss="soft_l1",
        f_scale=ROBUST_SCALE,
        x_scale=span,
        diff_step=0.02,
        max_nfev=max_evaluations,
        ftol=FIT_TOLERANCE,
        xtol=FIT_TOLERANCE,
    )
    jac = result.jac[: -len(x0)] if pull else result.jac
    return LeastSquaresFit(result.x, jac, problem.residuals(result.x))


def fit_candidates(hw_class: str, catalog: Catalog) -> list[str]:
    """What a calibration without --fit chooses from: the class's own list, then every
    CANDIDATE_FIT term."""
    return list(dict.fromkeys([*class_fit(hw_class, catalog), *CANDIDATE_FIT]))


def fit_setup(
    datasets: list[PublishedDataset], catalog: Catalog, fit: tuple[str, ...] | None
) -> tuple[str, list[str], EfficiencyParams]:
    """The hardware class of ``datasets`` (one), the parameters to fit (None: the class's
    candidates, to be chosen from by select_parameters) and the class's default efficiency
    parameters (with the datasets' engine's priors) to fit them from."""
    classes = {hardware_class_of(ds, catalog) for ds in datasets}
    if len(classes) != 1:
        raise CapsimUserError(
            f"datasets of several hardware classes ({', '.join(sorted(classes))})",
            hint="fit one profile per hardware class",
        )
    hw_class = classes.pop()
    scenario = datasets[0].scenarios[0]
    gpu = catalog.gpu(scenario.gpu)
    engine = catalog.engines.find(ENGINE_SIMULATED.get(scenario.engine, scenario.engine))
    fit = fit_candidates(hw_class, catalog) if fit is None else fit
    check_fittable(fit)
    return hw_class, list(fit), default_efficiency(gpu, catalog, engine)


def fit_profile(
    datasets: list[PublishedDataset],
    catalog: Catalog,
    name: str,
    fit: tuple[str, ...] | None = None,
    max_evaluations: int = 120,
    start: dict[str, float] | None = None,
    prior_weight: float = DEFAULT_PRIOR_WEIGHT,
) -> Profile:
    """Fit ``fit`` parameters (None: the class's default set) to every point of
    ``datasets`` (one hardware class), from the class's defaults (the priors) or from
    ``start`` (e.g. a fit on more points, to converge in fewer evaluations), pulled
    towards the priors by ``prior_weight`` (see DEFAULT_PRIOR_WEIGHT)."""
    hw_class, names, base = fit_setup(datasets, catalog, fit)
    held_reasons: dict[str, str] = {}
    with scenario_pool(datasets) as pool:
        if fit is None:
            names, held_reasons = choose_parameters(datasets, catalog, names, base, pool)
        lower, upper, x0 = bounds_and_start(names, base)
        x_start = start_point(names, x0, lower, upper, start)
        if fit is None and start is None and len(names) > 1:
            x_start = stagewise_start(datasets, catalog, names, base, pool, max_evaluations)
        while True:
            problem = FitProblem(datasets, catalog, names, base, pool=pool)
            if names:
                optimum = solve(
                    problem,
                    x_start,
                    lower,
                    upper,
                    max_evaluations,
                    prior=x0,
                    prior_weight=prior_weight,
                )
                x, jac = optimum.x, optimum.jac
                r = optimum.residuals
            else:
                x, jac = x0, np.zeros((0, 0))
                r = problem.residuals(x0)
            std = jacobian_std(jac, r) if names else np.zeros(0)
            # a chosen parameter the joint fit cannot pin (standard error above its
            # value, or its prior where the value has gone to 0: a term fitted to its
            # floor is pinned there, not loose) drifts along a direction the data do not
            # see: hold the worst at its prior and fit the rest again
            rse = std / np.maximum(np.abs(x), np.abs(x0)) if names else np.zeros(0)
            worst = int(np.argmax(rse)) if names else -1
            if fit is not None or len(names) < 2 or not rse[worst] > UNPINNED_RSE:
                break
            held_reasons[names[worst]] = (
                f"not pinned once fitted with the others: {x[worst]:.3g} +- {std[worst]:.3g} "
                "(held at its prior, the rest fitted again)"
            )
            keep = [i for i in range(len(names)) if i != worst]
            names = [names[i] for i in keep]
            lower, upper, x0 = bounds_and_start(names, base)
            x_start = np.clip(x[keep], lower, upper)
    scale = upper - lower
    n, p = r.size, len(names)
    dof = max(n - p, 1)
    column_norm = np.linalg.norm(jac, axis=0) * scale if names else np.zeros(0)
    parameters = {}
    for i, param in enumerate(names):
        value = float(x[i])  # the joint optimum; a weak direction stays near its prior
        at_bound = bool(min(value - lower[i], upper[i] - value) <= AT_BOUND * scale[i])
        rse = std[i] / max(abs(value), 1e-12)
        weak = column_norm[i] < 1e-3 or not rse < IDENTIFIABLE_RSE or at_bound
        parameters[param] = FittedParameter(
            value=value,
            prior=float(x0[i]),
            std=None if not np.isfinite(std[i]) else float(std[i]),
            identifiable=not weak,
            bounds=(float(lower[i]), float(upper[i])),
            at_bound=at_bound,
        )
    correlation = correlation_of(jacobian_covariance(jac, r), names) if len(names) > 1 else {}
    problem.pool = None  # closed: the last evaluation runs here
    final = problem.residuals(np.array([parameters[n].value for n in names]))
    points = problem.last
    errors = np.array([pt.error for pt in points])
    warnings = fit_warnings(points, errors)
    for key in names:
        par = parameters[key]
        if not par.at_bound:
            continue
        if par.bounds[0] == 0 and par.value - par.bounds[0] < par.bounds[1] - par.value:
            held_reasons[key] = f"fitted to {par.value:.3g}, its floor 0: this term does not "
            held_reasons[key] += "matter on this data"
        else:
            warnings.append(
                f"{key} ended at its bound {par.value:g} (range {par.bounds[0]:g}-"
                f"{par.bounds[1]:g}): the physics it stands for may be missing or wrong"
            )
    residuals = [PointResidual(**asdict(pt), error=pt.error) for pt in points]
    return Profile(
        name=name,
        hardware_class=hw_class,
        fitted_from=[ds.name for ds in datasets],
        parameters=parameters,
        correlation=correlation,
        held_reasons=held_reasons,
        log_residual_sd=float(np.sqrt(float(final @ final) / dof)),
        metric_log_sd=metric_log_sd(points),
        points=n,
        residuals=residuals,
        warnings=warnings,
        note=f"least_squares (soft_l1, f_scale {ROBUST_SCALE}), {problem.evaluations} evaluations"
        + (f", pulled towards the priors with weight {prior_weight:g}" if prior_weight else ""),
    )


def profile_uncertainty(
    profile: Profile, datasets: list[PublishedDataset], catalog: Catalog, step: float = 0.02
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Standard errors and correlations of ``profile``'s fitted parameters at their stored
    values on ``datasets`` (those it was fitted on): the Jacobian of the weighted log
    residuals by forward differences (each parameter moved by ``step`` of its value, as the
    fit's own differences do, backwards where that would leave its bounds), then
    ``jacobian_covariance``. For a profile fitted before correlations were stored."""
    names = list(profile.parameters)
    _, _, base = fit_setup(datasets, catalog, tuple(names))
    base = base.with_overrides(profile.held)
    x = np.array([profile.parameters[n].value for n in names])
    with scenario_pool(datasets) as pool:
        problem = FitProblem(datasets, catalog, names, base, pool=pool)
        r = problem.residuals(x)
        columns = []
        for i, n in enumerate(names):
            low, high = profile.parameters[n].bounds
            h = step * max(abs(x[i]), 1e-3 * (high - low))
            h = h if x[i] + h <= high else -h
            moved = x.copy()
            moved[i] += h
            columns.append((problem.residuals(moved) - r) / h)
    cov = jacobian_covariance(np.column_stack(columns), r)
    std = np.sqrt(np.clip(np.diag(cov), 0, None))
    return dict(zip(names, map(float, std), strict=True)), correlation_of(cov, names)


UNPINNED_RSE = 1.0
"""A chosen parameter whose standard error after the joint fit exceeds its value (100%; or
its prior, where the value is smaller) is held at its prior and the rest fitted again
(backward elimination): seen on the tiny-qwen3 live loop, where compute and attention
efficiency traded off (0.19 +- 41 and 0.10 +- 65)."""


def stagewise_start(
    datasets: list[PublishedDataset],
    catalog: Catalog,
    names: list[str],
    base: EfficiencyParams,
    pool: Executor | None,
    max_evaluations: int,
) -> np.ndarray:
    """Where the joint fit of the chosen parameters starts: each fitted alone in the order
    they were chosen (the one that explains most of the misfit first), the others at what
    the earlier stages found. A joint fit from the priors can stall when a wide-ranged term
    (a latency in ms) takes the first large steps and the one the data point at never moves
    (seen on a synthetic cpu-host run: compute efficiency left at its prior, errors of 160%)."""
    found: dict[str, float] = {}
    for name in names:
        stage_base = base.with_overrides(found)
        lower, upper, x0 = bounds_and_start([name], stage_base)
        problem = FitProblem(datasets, catalog, [name], stage_base, pool=pool)
        result = solve(problem, x0, lower, upper, max(10, max_evaluations // len(names)))
        found[name] = float(result.x[0])
    lower, upper, _ = bounds_and_start(names, base)
    return np.clip([found[n] for n in names], lower, upper)


def metric_log_sd(points: list[ComparedPoint]) -> dict[str, float]:
    """Root-mean-square log error of the points per acceptance family (throughput, TTFT,
    TPOT, E2E): each family's own spread, for its bands."""
    groups: dict[str, list[float]] = {}
    for pt in points:
        if pt.predicted > 0 and pt.measured > 0:
            family = METRIC_KINDS.get(pt.metric, "throughput")
            groups.setdefault(family, []).append(np.log(pt.predicted / pt.measured))
    return {k: float(np.sqrt(np.mean(np.square(v)))) for k, v in sorted(groups.items())}


def choose_parameters(
    datasets: list[PublishedDataset],
    catalog: Catalog,
    candidates: list[str],
    base: EfficiencyParams,
    pool: Executor | None,
) -> tuple[list[str], dict[str, str]]:
    """select_parameters over ``candidates`` on these datasets: the names to fit, and why
    each other candidate is held at its prior. At most a third of the distinct measured
    (level, metric) pairs are fitted (at least one)."""
    lower, upper, x0 = bounds_and_start(candidates, base)
    problem = FitProblem(datasets, catalog, candidates, base, pool=pool)
    distinct = {
        (sc.name, p.concurrency, p.metric, p.statistic)
        for ds in datasets
        for sc in ds.scenarios
        for p in sc.points
    }
    chosen = select_parameters(
        problem.residuals,
        candidates,
        x0,
        lower,
        upper,
        max(1, len(distinct) // 3),
        # the points of the first evaluation, at the priors, in residual order
        families=lambda: [METRIC_KINDS.get(p.metric, p.metric) for p in problem.last],
    )
    return chosen.fitted, chosen.held


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
