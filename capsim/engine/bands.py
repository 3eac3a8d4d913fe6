"""80% and 50% prediction bands on every predicted figure.

Without a calibration profile a figure's band is the uncalibrated model's spread of errors
on the published corpus (calibration/bands/uncalibrated.yaml). With one, it combines the
profile's in-sample (or cross-validated) log-residual spread for the figure's metric family
with its fitted parameters' uncertainty carried through the simulator: each parameter moved
by one standard error and the prediction run again, the log changes added in quadrature
(first-order propagation of the diagonal covariance). A level far from those the profile
was fitted on moves more with the parameters, so its band is wider.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from capsim.metrics import LevelMetrics

BAND_Z = 1.2815515655446004
"""Standard normal quantile of 0.9: an 80% two-sided band."""

BAND_Z_50 = 0.6744897501960817
"""Standard normal quantile of 0.75: a 50% two-sided band."""

BAND_FIGURES = {
    "output_tok_s": "throughput",
    "total_tok_s": "throughput",
    "per_request_output_tok_s": "throughput",
    "ttft_p50_ms": "TTFT",
    "ttft_p90_ms": "TTFT",
    "tpot_ms": "TPOT",
    "e2e_p50_s": "E2E",
}
"""Figures that get a band, and the metric family whose errors set it."""

MAX_PROPAGATED = 2
"""Principal axes of the fitted parameters' covariance whose uncertainty is propagated
(largest relative variance first, ``uncertainty_moves``): each costs one more simulation
of the propagation levels."""


def band_values(m: LevelMetrics) -> dict[str, float | None]:
    """The banded figures of one simulated level."""
    return {
        "output_tok_s": m.output_tok_s,
        "total_tok_s": m.total_tok_s,
        "per_request_output_tok_s": m.per_request_output_tok_s.mean,
        "ttft_p50_ms": m.ttft_ms.p50,
        "ttft_p90_ms": m.ttft_ms.p90,
        "tpot_ms": m.tpot_ms.mean,
        "e2e_p50_s": m.e2e_s.p50,
    }


def add_corpus_bands(results: list, hardware_class: str, table) -> None:
    """80% and 50% bands on every figure from the uncalibrated model's errors on the
    published corpus (``table``, a BandTable the calibration layer loaded): the hardware
    class's own where it has enough points and sources, else the pooled corpus's."""
    pooled = set()
    for r in results:
        bands, bands_50 = {}, {}
        for name, value in band_values(r.metrics).items():
            band, fallback = table.band(hardware_class, BAND_FIGURES[name])
            if band is None or value is None:
                continue
            if fallback:
                pooled.add(BAND_FIGURES[name])
            bands[name] = (value * band.low, value * band.high)
            if band.low_50 is not None and band.high_50 is not None:
                bands_50[name] = (value * band.low_50, value * band.high_50)
        r.band_80 = bands or None
        r.band_50 = bands_50 or None
        r.band_source = "uncalibrated errors on the published corpus (" + (
            f"pooled over all classes for {', '.join(sorted(pooled))}; {hardware_class} "
            "for the rest)"
            if pooled
            else f"{hardware_class})"
        )


PROPAGATION_LEVELS = 6
"""Levels at which the parameters' uncertainty is simulated (spread evenly over the sweep,
both ends included); the levels between take the spread interpolated in log level."""

PROPAGATION_REQUESTS = 150
"""Requests per level in the propagation runs (the base run is repeated at the same count,
with the same seed, so the log change measures the parameter, not sampling noise; closed
loops run at least four rounds of their level). At 300 the shipped RTX 3090 profile's
80% bands on a 1..64 sweep were the same to 0.2% of their width, at twice the cost."""


def propagation_indices(count: int) -> list[int]:
    """Indices of the levels (sorted by level) at which the propagation runs simulate."""
    if count <= PROPAGATION_LEVELS:
        return list(range(count))
    return sorted(
        {round(i * (count - 1) / (PROPAGATION_LEVELS - 1)) for i in range(PROPAGATION_LEVELS)}
    )


def uncertainty_moves(profile) -> list[dict[str, float]]:
    """Parameter values to rerun the simulator at, one dict per direction, so that a
    figure's log changes add in quadrature to its first-order variance: the fitted
    parameters' covariance (standard errors and the profile's correlations), in units
    relative to each value, factored along its principal axes; the MAX_PROPAGATED axes
    of largest variance are each moved by one standard deviation (every parameter at
    once). Parameters that trade off (a lower bandwidth efficiency against a smaller step
    overhead) move together along the ridge the data leave open, where the points they
    were fitted on barely change, rather than each by its own standard error as if the
    others were known. Without correlations the axes are the parameters themselves, the
    least certain (relative to its value) first. A move that would leave the bounds goes
    the other way, or as far as the bounds allow."""
    chosen = [
        (name, p)
        for name, p in profile.parameters.items()
        if p.std is not None and math.isfinite(p.std) and p.std > 0
    ]
    if not chosen:
        return []
    names = [name for name, _ in chosen]
    value = np.array([p.value for _, p in chosen])
    scale = np.maximum(np.abs(value), 1e-12)
    relative_std = np.array([p.std for _, p in chosen]) / scale
    rho = np.array([[profile.correlation_between(a, b) for b in names] for a in names])
    eigenvalues, axes = np.linalg.eigh(rho * np.outer(relative_std, relative_std))
    low = np.array([p.bounds[0] for _, p in chosen])
    high = np.array([p.bounds[1] for _, p in chosen])
    moves = []
    for k in np.argsort(-eigenvalues, kind="stable")[:MAX_PROPAGATED]:
        if not eigenvalues[k] > 0:
            continue
        axis = axes[:, k] * (1 if axes[np.argmax(np.abs(axes[:, k])), k] > 0 else -1)
        step = scale * math.sqrt(eigenvalues[k]) * axis  # its largest component upwards
        # the sign, and the share of the step, that keeps every parameter in bounds
        fractions = [_fraction_in_bounds(value, sign * step, low, high) for sign in (1, -1)]
        sign = 1 if fractions[0] >= fractions[1] else -1
        moved = value + sign * max(fractions) * step
        if not np.allclose(moved, value, rtol=0, atol=1e-15):
            moves.append({n: float(v) for n, v in zip(names, moved, strict=True)})
    return moves


def _fraction_in_bounds(value, step, low, high) -> float:
    """The largest t in [0, 1] with value + t * step within [low, high] (arrays)."""
    t = 1.0
    for v, d, lo, hi in zip(value, step, low, high, strict=True):
        if d > 0 and v + d > hi:
            t = min(t, max(hi - v, 0.0) / d)
        elif d < 0 and v + d < lo:
            t = min(t, max(v - lo, 0.0) / -d)
    return t


def propagation_plan(levels: list[float], profile) -> tuple[list[dict[str, float]], list[int]]:
    """The parameter moves (``uncertainty_moves``) and the indices into ``levels`` (a
    prediction's levels, in its order) at which ``propagated_log_sd`` reruns the
    simulator; with no moves nothing is rerun. Known before the prediction runs, so the
    reruns can start alongside it."""
    order = sorted(range(len(levels)), key=lambda i: levels[i])
    return uncertainty_moves(profile), [order[j] for j in propagation_indices(len(order))]


def propagated_log_sd(
    results: list, profile, rerun: Callable[[dict[str, float], list[int]], list]
) -> list[dict[str, float]]:
    """Per level and figure, the log-spread the fitted parameters' standard errors cause:
    sqrt(sum over parameters of log(figure moved / figure)^2), each parameter moved by its
    standard error (within its bounds; correlated parameters along their principal axes,
    ``uncertainty_moves``). ``rerun(overrides, indices)`` simulates the levels
    at ``indices`` again (with PROPAGATION_REQUESTS requests each); the spread at the other
    levels is interpolated linearly in log level (in index where a level is not positive)."""
    order = sorted(range(len(results)), key=lambda i: results[i].level)
    moves, sampled = propagation_plan([r.level for r in results], profile)
    squares = [dict.fromkeys(BAND_FIGURES, 0.0) for _ in sampled]
    if moves:
        base_runs = [band_values(r.metrics) for r in rerun({}, sampled)]
        for overrides in moves:
            for j, other in enumerate(rerun(overrides, sampled)):
                base, shifted = base_runs[j], band_values(other.metrics)
                for k in BAND_FIGURES:
                    if base[k] and shifted[k] and base[k] > 0 and shifted[k] > 0:
                        squares[j][k] += math.log(shifted[k] / base[k]) ** 2
    levels = [results[i].level for i in sampled]
    positive = all(level > 0 for level in levels)
    x_sampled = [math.log(v) for v in levels] if positive else list(range(len(sampled)))
    out: list[dict[str, float]] = [{} for _ in results]
    for rank, i in enumerate(order):
        level = results[i].level
        if positive:
            x = math.log(level)
        else:  # position among the sampled indices of the sorted order
            x = float(np.interp(rank, propagation_indices(len(order)), range(len(sampled))))
        for k in BAND_FIGURES:
            sd = [math.sqrt(s[k]) for s in squares]
            out[i][k] = float(np.interp(x, x_sampled, sd))
    return out


def add_profile_bands(results: list, profile, rerun: Callable[[dict[str, float]], list]) -> None:
    """80% bands from a calibration profile: each figure x exp(+-1.2816 sd), sd combining
    the profile's residual spread for the figure's metric family (its overall spread where
    the profile has none for that family, e.g. one fitted on throughput alone) with the
    parameters' propagated uncertainty (propagated_log_sd)."""
    param_sd = propagated_log_sd(results, profile, rerun)
    families = profile.metric_log_sd or {}
    for r, extra in zip(results, param_sd, strict=True):
        values = band_values(r.metrics)
        bands = dict(r.band_80 or {})
        bands_50 = dict(r.band_50 or {})
        for k, family in BAND_FIGURES.items():
            if values[k] is None:
                continue
            residual = max(families.get(family, profile.band_sd), profile.cv_log_residual_sd or 0)
            if family not in families and family != "throughput":
                continue  # no evidence for this family in the profile: keep the corpus band
            sd = math.hypot(residual, extra[k])
            factor, factor_50 = math.exp(BAND_Z * sd), math.exp(BAND_Z_50 * sd)
            bands[k] = (values[k] / factor, values[k] * factor)
            bands_50[k] = (values[k] / factor_50, values[k] * factor_50)
        r.band_80 = bands
        r.band_50 = bands_50
        fitted_on = ", ".join(sorted(families)) or "throughput"
        r.band_source = (
            f"calibration profile {profile.name}: residuals ({fitted_on}) and its parameters' "
            "standard errors propagated through the simulator"
            + ("; other figures: " + r.band_source if r.band_source else "")
        )


PESSIMISTIC_EDGE = {
    "output_tok_s": 0,
    "total_tok_s": 0,
    "per_request_output_tok_s": 0,
    "ttft_p50_ms": 1,
    "ttft_p90_ms": 1,
    "tpot_ms": 1,
    "e2e_p50_s": 1,
}
"""Which edge of a figure's band is the pessimistic one: 0 the low edge (a rate), 1 the
high edge (a latency)."""


def pessimistic_factors(level) -> dict[str, float]:
    """Per banded figure of a level, its 80% band's pessimistic edge / the figure itself
    (below 1 for a rate, above 1 for a latency, where the band says the figure may be
    worse); figures without a band are left out. Objectives checked at this edge hold
    with about 90% confidence each, as far as the bands are calibrated."""
    values = band_values(level.metrics)
    out = {}
    for name, edges in (level.band_80 or {}).items():
        value = values.get(name)
        if value and value > 0 and name in PESSIMISTIC_EDGE:
            out[name] = edges[PESSIMISTIC_EDGE[name]] / value
    return out
