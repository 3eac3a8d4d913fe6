"""Fitting a profile: which parameters to fit, the joint fit that holds those it cannot
pin, and the profile that records them (the least-squares machinery is in
least_squares.py, cross-validation in crossval.py).

A parameter is reported as not identifiable when the data barely move the residuals along
it (its singular direction is weak) or its standard error exceeds half its bounded range;
such a parameter is flagged, and its value is whatever the joint optimum left it at (near
its prior, the hardware-class default, when the data ignore it).
"""

from __future__ import annotations

import math
from concurrent.futures import Executor
from dataclasses import asdict, dataclass

import numpy as np

from capsim.calibration.compare import (
    METRIC_KINDS,
    ComparedPoint,
    simulated_engine,
)
from capsim.calibration.least_squares import (
    AT_BOUND,
    DEFAULT_PRIOR_WEIGHT,
    FIT_TOLERANCE,
    ROBUST_SCALE,
    FitProblem,
    bounds_and_start,
    check_fittable,
    correlation_of,
    jacobian_covariance,
    jacobian_std,
    scenario_pool,
    solve,
    start_point,
)
from capsim.calibration.profiles import (
    FittedParameter,
    PointResidual,
    Profile,
    check_log_spread,
)
from capsim.calibration.published import PublishedDataset
from capsim.calibration.selection import (
    CANDIDATE_FIT,
    IDENTIFIABLE_RSE,
    fit_warnings,
    replicate_noise,
    select_parameters,
)
from capsim.catalog.loader import Catalog
from capsim.errors import CapsimUserError
from capsim.physics.deployment import default_efficiency
from capsim.physics.efficiency import EfficiencyParams

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


def hardware_class_of(ds: PublishedDataset, catalog: Catalog) -> str:
    classes = {catalog.gpu(sc.gpu).hardware_class for sc in ds.scenarios}
    if len(classes) != 1:
        raise CapsimUserError(f"dataset {ds.name} mixes hardware classes {sorted(classes)}")
    return classes.pop()


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
    engine = catalog.engine(simulated_engine(scenario))
    base = default_efficiency(gpu, catalog, engine)
    int8_path = base.weight_only_int8_gemm_efficiency is not None
    if fit is None:
        fit = fit_candidates(hw_class, catalog)
        if int8_path:
            # the engine multiplies weight-only formats on int8 tensor cores on this class
            # (llama.cpp's MMQ on GeForce): their dense GEMMs run at this term, not at
            # compute_efficiency, so a prompt's rate can only move through it
            fit = [*fit, "weight_only_int8_gemm_efficiency"]
    elif "weight_only_int8_gemm_efficiency" in fit and not int8_path:
        raise CapsimUserError(
            f"weight_only_int8_gemm_efficiency is not used by {engine.name} on {hw_class}",
            hint="it applies where the engine runs weight-only formats on int8 tensor cores "
            "(llama.cpp on GeForce Ampere and Ada); fit compute_efficiency instead",
        )
    check_fittable(fit)
    return hw_class, list(fit), base


def fitted_params(
    profile: Profile,
    datasets: list[PublishedDataset],
    catalog: Catalog,
    fit: tuple[str, ...] | None = None,
) -> EfficiencyParams:
    """What a profile fitted on ``datasets`` predicts with: its held and fitted values over
    the base it was fitted on (``fit_setup``'s: the GPU's defaults with the datasets'
    engine release's priors). ``Profile.params`` without an engine lays them over the
    engine-less defaults instead (a cross-validation fold of vLLM 0.7 runs predicted its
    left-out level up to 207% off that way)."""
    _, _, base = fit_setup(datasets, catalog, fit)
    return base.with_overrides({**profile.held, **profile.fitted_values})


@dataclass
class JointFit:
    """The joint fit of chosen parameters, dropping (holding) those it cannot pin."""

    datasets: list[PublishedDataset]
    catalog: Catalog
    pool: Executor | None
    max_evaluations: int
    prior_weight: float
    drop_unpinned: bool  # False when the user named the parameters (--fit)
    tolerance: float = FIT_TOLERANCE  # least_squares' relative ftol and xtol

    def run(
        self,
        names: list[str],
        base: EfficiencyParams,
        x_start: np.ndarray,
        held: dict[str, float],
        held_reasons: dict[str, str],
    ) -> tuple:
        """Fit ``names`` from ``x_start``; a parameter the fit cannot pin (standard error
        above its value, or its prior where the value has gone to 0: a term fitted to its
        floor is pinned there, not loose) drifts along a direction the data do not see:
        the worst is held (``nearest_allowed``; recorded in ``held`` where that is not its
        prior, with the reason in ``held_reasons``) and the rest fitted again. Returns
        (names, base with the held values, x, residuals, Jacobian, standard errors,
        the FitProblem)."""
        lower, upper, x0 = bounds_and_start(names, base)
        while True:
            problem = FitProblem(self.datasets, self.catalog, names, base, pool=self.pool)
            if names:
                optimum = solve(
                    problem,
                    x_start,
                    lower,
                    upper,
                    self.max_evaluations,
                    prior=x0,
                    prior_weight=self.prior_weight,
                    tolerance=self.tolerance,
                )
                x, jac, r = optimum.x, optimum.jac, optimum.residuals
            else:
                x, jac = x0, np.zeros((0, 0))
                r = problem.residuals(x0)
            std = jacobian_std(jac, r) if names else np.zeros(0)
            rse = std / np.maximum(np.abs(x), np.abs(x0)) if names else np.zeros(0)
            worst = int(np.argmax(rse)) if names else -1
            if not self.drop_unpinned or len(names) < 2 or not rse[worst] > UNPINNED_RSE:
                return names, base, x, r, jac, std, problem
            hold = nearest_allowed(problem, x, r, worst, float(x0[worst]))
            name = names[worst]
            reason = f"not pinned once fitted with the others: {x[worst]:.3g} +- {std[worst]:.3g}"
            if hold == float(x0[worst]):
                reason += " (held at its prior, the rest fitted again)"
            else:  # the data rule the prior out: hold where they stop ruling it out
                held[name] = hold
                reason += (
                    f" (held at {hold:.3g}, the value nearest its prior {x0[worst]:.3g} "
                    "that the data allow within one standard deviation; the rest fitted again)"
                )
            held_reasons[name] = reason
            base = base.with_overrides({name: hold})
            keep = [i for i in range(len(names)) if i != worst]
            names = [names[i] for i in keep]
            lower, upper, x0 = bounds_and_start(names, base)
            x_start = np.clip(x[keep], lower, upper)


def fit_profile(
    datasets: list[PublishedDataset],
    catalog: Catalog,
    name: str,
    fit: tuple[str, ...] | None = None,
    max_evaluations: int = 120,
    start: dict[str, float] | None = None,
    prior_weight: float = DEFAULT_PRIOR_WEIGHT,
    sensitivities: Sensitivities | None = None,
    record: bool = False,
    engine: str = "vllm",
    tolerance: float = FIT_TOLERANCE,
) -> Profile:
    """Fit ``fit`` parameters (None: the class's default set) to every point of
    ``datasets`` (one hardware class), from the class's defaults (the priors) or from
    ``start`` (e.g. a fit on more points, to converge in fewer evaluations), pulled
    towards the priors by ``prior_weight`` (see DEFAULT_PRIOR_WEIGHT). ``sensitivities``
    (with ``record``: to be filled) hold the simulations behind the choice of parameters
    (``Sensitivities``). ``engine`` is the engine the profile serves under ``--profile
    auto`` (crossval.profile_engine of the datasets' scenarios). ``tolerance``: the joint
    fit's relative ftol and xtol (least_squares)."""
    hw_class, names, base = fit_setup(datasets, catalog, fit)
    candidates = list(names)
    held_reasons: dict[str, str] = {}
    held: dict[str, float] = {}  # held away from their priors (nearest_allowed)
    with scenario_pool(datasets) as pool:
        if fit is None:
            names, held_reasons = choose_parameters(
                datasets, catalog, names, base, pool, sensitivities, record
            )
        lower, upper, x0 = bounds_and_start(names, base)
        x_start = start_point(names, x0, lower, upper, start)
        if fit is None and start is None and len(names) > 1:
            x_start = stagewise_start(datasets, catalog, names, base, pool, max_evaluations)
        joint = JointFit(
            datasets, catalog, pool, max_evaluations, prior_weight, fit is None, tolerance
        )
        names, base, x, r, jac, std, problem = joint.run(names, base, x_start, held, held_reasons)
        if fit is None and start is None and poor_fit(problem):
            # the choice was made from the Jacobian at the priors; far from them (a term
            # that moved several-fold) another term may explain what the fit still misses:
            # look again from the optimum, once, and fit what it adds with the rest
            # not those held as unpinned (every value in ``held`` is one of them)
            others = [
                c
                for c in candidates
                if c not in names and not held_reasons.get(c, "").startswith("not pinned")
            ]
            at_optimum = base.with_overrides(dict(zip(names, map(float, x), strict=True)))
            room = max_fitted(datasets) - len(names)
            more = choose_parameters(datasets, catalog, others, at_optimum, pool)[0][:room]
            if more:
                for c in more:
                    held_reasons.pop(c, None)
                lower, upper, x0 = bounds_and_start(names + more, base)
                x_start = np.clip(np.concatenate((x, x0[len(names) :])), lower, upper)
                names, base, x, r, jac, std, problem = joint.run(
                    names + more, base, x_start, held, held_reasons
                )
        lower, upper, x0 = bounds_and_start(names, base)
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
    spread = check_log_spread(float(np.sqrt(float(final @ final) / dof)), "log residual spread")
    families = metric_log_sd(points)
    for family, value in families.items():
        check_log_spread(value, f"{family} log spread")
    # after the spreads' checks: a point missed past any calibration is said as such there
    residuals = [PointResidual(**asdict(pt), error=pt.error) for pt in points]
    return Profile(
        name=name,
        hardware_class=hw_class,
        engine=engine,
        fitted_from=[ds.name for ds in datasets],
        parameters=parameters,
        correlation=correlation,
        held=held,
        held_reasons=held_reasons,
        log_residual_sd=spread,
        metric_log_sd=families,
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
its prior, where the value is smaller) is held (at its prior, or where the data stop ruling
the prior out: ``nearest_allowed``) and the rest fitted again (backward elimination): seen
on the tiny-qwen3 live loop, where compute and attention efficiency traded off (0.19 +- 41
and 0.10 +- 65)."""


HOLD_STEPS = 6
"""Bisection steps of ``nearest_allowed`` (the held value to within 1/64 of the way, in
log units, from the fitted value to the prior)."""


def nearest_allowed(
    problem: FitProblem, x: np.ndarray, r: np.ndarray, index: int, prior: float
) -> float:
    """Where to hold parameter ``index`` of a fit the data cannot pin (optimum ``x``, its
    residuals ``r``): its prior when the points there fit about as well (the sum of squared
    residuals rises by at most the fit's residual variance, one standard deviation's worth
    of misfit, the others at their fitted values), else the value between the optimum and
    the prior nearest the prior at which they still do (bisected in log units where both
    are positive). A term that drifted to a bound along a plateau (a compute efficiency at
    1 where a small model's prefill is no longer compute-bound) is held at the plateau's
    edge, not at a prior the data rule out (seen on a probe of tiny-qwen3-moe on another
    host: compute efficiency 1 +- 9.5 held at its prior 0.05 doubled TTFT)."""
    ssr = float(r @ r)
    tolerance = ssr / max(r.size - x.size, 1)
    fitted = float(x[index])

    def allowed(value: float) -> bool:
        moved = x.copy()
        moved[index] = value
        rr = problem.residuals(moved)
        return float(rr @ rr) - ssr <= tolerance

    if prior == fitted or allowed(prior):
        return prior
    logs = fitted > 0 and prior > 0
    a, b = (math.log(fitted), math.log(prior)) if logs else (fitted, prior)
    near, far = 0.0, 1.0  # fractions of the way to the prior: allowed, not allowed
    for _ in range(HOLD_STEPS):
        mid = (near + far) / 2
        value = a + mid * (b - a)
        if allowed(math.exp(value) if logs else value):
            near = mid
        else:
            far = mid
    value = a + near * (b - a)
    return float(math.exp(value) if logs else value)


STAGE_TOLERANCE = 0.01
"""Relative tolerance of stagewise_start's one-parameter fits: they only say where the joint
fit starts, which converges to FIT_TOLERANCE from there. Counted on 2026-11-30 (the calls of
FitProblem.residuals in fit_profile on three corpus parts, the InferenceX gpt-oss-120b sets
and the RTX 4090 Mistral set): their two-parameter stagewise starts took 23-38 simulations
at FIT_TOLERANCE and 15-33 at this tolerance."""


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
        evaluations = max(10, max_evaluations // len(names))
        result = solve(problem, x0, lower, upper, evaluations, tolerance=STAGE_TOLERANCE)
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


def poor_fit(problem: FitProblem) -> bool:
    """Whether the points of ``problem``'s last evaluation draw a poor-fit warning
    (fit_warnings). After ``JointFit.run`` that evaluation is at the optimum it returns
    (``solve`` ends by evaluating its result), so nothing is simulated again."""
    return bool(fit_warnings(problem.last, np.array([pt.error for pt in problem.last])))


def max_fitted(datasets: list[PublishedDataset]) -> int:
    """The most parameters a fit chooses: a third of the distinct measured (level,
    metric) pairs, at least one."""
    distinct = {
        (sc.name, p.concurrency, p.metric, p.statistic)
        for ds in datasets
        for sc in ds.scenarios
        for p in sc.points
    }
    return max(1, len(distinct) // 3)


@dataclass
class Sensitivities:
    """The simulations behind a fit's choice of parameters (``choose_parameters``: every
    point at the priors and with each candidate moved by its sensitivity step), kept so
    that fits on fewer of the same points (validate's leave-a-level-out folds) choose from
    their own points' rows instead of simulating them again. A level's simulation does not
    depend on which other levels are simulated, so the rows are those the fold would get.
    Keyed by the candidates and the parameter vector; the points in the order simulated."""

    runs: dict[tuple, tuple[np.ndarray, list[ComparedPoint]]]

    @staticmethod
    def level_key(pt: ComparedPoint) -> tuple:
        return pt.dataset, pt.scenario, pt.concurrency

    @staticmethod
    def key(candidates: list[str], base: EfficiencyParams, x: np.ndarray) -> tuple:
        return tuple(candidates), repr(base), x.tobytes()

    def rows(
        self,
        candidates: list[str],
        base: EfficiencyParams,
        x: np.ndarray,
        datasets: list[PublishedDataset],
    ):
        """The residuals and points of ``datasets``' points at ``x`` (over ``base``), from
        a kept simulation that covered them all; None if there is none."""
        kept = self.runs.get(self.key(candidates, base, x))
        if kept is None:
            return None
        r, points = kept
        wanted = [
            (ds.name, sc.name, p.concurrency, p.metric, p.statistic)
            for ds in datasets
            for sc in ds.scenarios
            for p in sc.points
        ]
        levels = {w[:3] for w in wanted}
        keep = [i for i, pt in enumerate(points) if self.level_key(pt) in levels]
        got = [(*self.level_key(points[i]), points[i].metric, points[i].statistic) for i in keep]
        if got != wanted:
            return None
        return r[keep], [points[i] for i in keep]


def choose_parameters(
    datasets: list[PublishedDataset],
    catalog: Catalog,
    candidates: list[str],
    base: EfficiencyParams,
    pool: Executor | None,
    sensitivities: Sensitivities | None = None,
    record: bool = False,
) -> tuple[list[str], dict[str, str]]:
    """select_parameters over ``candidates`` on these datasets: the names to fit, and why
    each other candidate is held at its prior. At most a third of the distinct measured
    (level, metric) pairs are fitted (at least one). With ``sensitivities``, simulations
    it holds for these points are reused, or (``record``) those run are kept there."""
    lower, upper, x0 = bounds_and_start(candidates, base)
    problem = FitProblem(datasets, catalog, candidates, base, pool=pool)

    def residuals(x: np.ndarray) -> np.ndarray:
        if sensitivities is not None and not record:
            found = sensitivities.rows(candidates, base, x, datasets)
            if found is not None:
                problem.last = found[1]
                return found[0]
        r = problem.residuals(x)
        if sensitivities is not None and record:
            sensitivities.runs[sensitivities.key(candidates, base, x)] = (r, list(problem.last))
        return r

    chosen = select_parameters(
        residuals,
        candidates,
        x0,
        lower,
        upper,
        max_fitted(datasets),
        # the points of the first evaluation, at the priors, in residual order
        families=lambda: [METRIC_KINDS.get(p.metric, p.metric) for p in problem.last],
        noise=lambda: replicate_noise(problem.last),
    )
    return chosen.fitted, chosen.held
