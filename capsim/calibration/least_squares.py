"""The least-squares problem behind calibration: residuals, bounds, priors and the solver.

Residuals are log(predicted / measured) per point: relative errors, symmetric in over-
and under-prediction. ``scipy.optimize.least_squares`` minimises them with a soft-L1 loss
(robust to a few odd points, such as seed 002's C=3 values) within each parameter's bounds,
simulating every measured scenario with the engine at each evaluation.

Uncertainty comes from the Jacobian at the optimum: cov = s^2 (J^T J)^-1 with
s^2 = sum(r^2) / (n - p).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from capsim.calibration.compare import ComparedPoint, compare_datasets
from capsim.calibration.published import PublishedDataset
from capsim.calibration.selection import point_weights
from capsim.catalog.loader import Catalog
from capsim.engine.pool import cores_for, worker_pool
from capsim.errors import CapsimUserError, close_matches
from capsim.physics.efficiency import EfficiencyParams

FIT_BOUNDS: dict[str, tuple[float, float]] = {
    "bandwidth_efficiency": (0.3, 1.0),
    "moe_bandwidth_efficiency": (0.15, 1.0),
    "moe_layer_overhead_us": (0.0, 200.0),
    "moe_expert_overhead_us": (0.0, 5.0),
    "mla_layer_overhead_us": (0.0, 2000.0),
    "mla_layer_floor_share": (0.0, 5.0),
    "kv_bandwidth_efficiency": (0.2, 1.0),
    "elementwise_bandwidth_efficiency": (0.1, 1.0),
    "compute_efficiency": (0.005, 1.0),  # a tiny model on a CPU core: 0.03-0.06 (cpu-host)
    "attention_compute_efficiency": (0.02, 1.0),
    "step_overhead_us": (0.0, 20_000.0),
    "per_sequence_overhead_us": (0.0, 2_000.0),
    "layer_overhead_graph_us": (0.0, 200.0),
    "layer_overhead_eager_us": (0.0, 2000.0),
    "layer_overhead_eager_mla_us": (0.0, 5000.0),
    "layer_overhead_compiled_us": (0.0, 2000.0),
    "allreduce_latency_us": (0.0, 300.0),
    "allreduce_eager_launch_us": (0.0, 500.0),
    "l2_reuse_strength": (0.0, 1.0),
    "moe_routing_skew": (0.0, 2.0),
    "compute_power_exponent": (0.0, 4.0),
    "bandwidth_power_exponent": (0.0, 4.0),
    "async_host_overlap": (0.0, 1.0),
    "prefill_compute_efficiency": (0.02, 1.0),
    "moe_compute_efficiency": (0.02, 1.0),
    "moe_compute_efficiency_8bit": (0.01, 1.0),
    "moe_gemm_half_width": (1.0, 20_000.0),
    "moe_gemm_half_rows": (1.0, 20_000.0),
    "moe_dequant_compute_efficiency": (0.01, 1.0),
    "moe_dequant_bandwidth_efficiency": (0.1, 1.0),
    "weight_only_int8_gemm_efficiency": (0.02, 1.0),
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
    core, with a single scenario, or in a pool's worker (``cores_for``)."""
    workers = cores_for(sum(len(ds.scenarios) for ds in datasets))
    if workers < 2:
        yield None
        return
    with worker_pool(workers) as pool:
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


INHERITED_PRIORS = {
    "prefill_compute_efficiency": "compute_efficiency",
    "moe_compute_efficiency": "compute_efficiency",
    "moe_compute_efficiency_8bit": "moe_compute_efficiency",
    "moe_dequant_compute_efficiency": "moe_compute_efficiency",
    "moe_dequant_bandwidth_efficiency": "moe_bandwidth_efficiency",
}
"""Parameters whose unset value (None) means another's: their prior is that one's (an
expert GEMM without its own figure runs like a dense one)."""


UNSET_STARTS = {"moe_gemm_half_width": 128.0, "moe_gemm_half_rows": 64.0}
"""Where a fit starts an optional parameter that is unset and inherits from none (a term
that is off until set): about a tile (128 columns, 64 rows), where the term begins to
matter."""


def prior_value(base: EfficiencyParams, name: str) -> float:
    """A parameter's prior in ``base``, following INHERITED_PRIORS (as far as it goes)
    where it is unset; an unset one without an inherited prior starts at UNSET_STARTS, or
    at the middle of its FIT_BOUNDS."""
    value = getattr(base, name)
    if value is not None:
        return value
    if name in INHERITED_PRIORS:
        return prior_value(base, INHERITED_PRIORS[name])
    if name in UNSET_STARTS:
        return UNSET_STARTS[name]
    low, high = FIT_BOUNDS[name]
    return (low + high) / 2


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


def check_fittable(names) -> None:
    """Reject parameter names calibration cannot fit, naming those it can."""
    unknown = [n for n in names if n not in FIT_BOUNDS]
    if unknown:
        raise CapsimUserError(
            f"cannot fit {', '.join(unknown)}",
            hint="fittable: " + ", ".join(FIT_BOUNDS),
            suggestions=[m for n in unknown for m in close_matches(n, FIT_BOUNDS)],
        )


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
    tolerance: float = FIT_TOLERANCE,
) -> LeastSquaresFit:
    """Minimise the soft-L1 loss of ``problem``'s log residuals from ``x0`` within bounds.
    ``fitted`` (a boolean mask over the points) leaves the others out of the loss; they
    are still simulated and come back in ``residuals``. With ``prior_weight`` > 0 each
    parameter is pulled towards ``prior`` (see DEFAULT_PRIOR_WEIGHT); the Jacobian that
    comes back holds the points' rows only, so standard errors and identifiability say
    what the data pin down. ``tolerance``: least_squares' ftol and xtol (relative)."""
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
        ftol=tolerance,
        xtol=tolerance,
    )
    jac = result.jac[: -len(x0)] if pull else result.jac
    return LeastSquaresFit(result.x, jac, problem.residuals(result.x))
