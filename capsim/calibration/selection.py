"""Which parameters a calibration can pin, from the data: metric weights, the Jacobian of
the measured points with respect to each candidate parameter, and the tests that decide
what to fit, what to hold at its prior, and when a fit is poor.

A candidate is fitted when moving it by SENSITIVITY_STEP of its scale changes the points'
log residuals by at least MIN_EFFECT (root mean square) and its column of the Jacobian is
not mostly explained by the columns already chosen (the part left over is at least
COLLINEARITY of the column); candidates are taken in the order in which they explain the
misfit at the priors (orthogonal matching pursuit), so the term the data point at comes
first. Where the data repeat a measurement (a probe's runs), a candidate must also explain
more of the misfit than NOISE_Z standard deviations of what the runs' scatter alone would
put along its direction: a term that fits run-to-run noise at the measured levels
extrapolates that noise to the levels not measured. The others are held at their priors,
with the reason.
After the fit a parameter counts as identifiable when its relative standard error is below
IDENTIFIABLE_RSE and it did not stop at a bound.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

METRIC_WEIGHTS: dict[tuple[str, str], float] = {
    ("output_tok_s", "mean"): 1.0,
    ("total_tok_s", "mean"): 0.5,
    ("ttft_s", "median"): 1.0,
    ("ttft_s", "mean"): 0.5,
    ("tpot_s", "mean"): 1.0,
    ("itl_s", "mean"): 0.5,
    ("e2e_s", "mean"): 0.5,
}
"""Weight of a point's log residual by (metric, statistic); 1 for anything not listed.
Output tok/s, TTFT p50 and TPOT carry full weight: together they pin decode and prefill
apart. Total tok/s, TTFT mean, ITL and E2E mostly repeat them (total = output x (1 + in/out)
in a closed loop, ITL ~ TPOT, E2E ~ TTFT + out x TPOT), so they count half, as a check."""

CANDIDATE_FIT = (
    "bandwidth_efficiency",
    "moe_bandwidth_efficiency",
    "compute_efficiency",
    "attention_compute_efficiency",
    "step_overhead_us",
    "per_sequence_overhead_us",
    "layer_overhead_eager_us",
    "layer_overhead_graph_us",
    "frontend_request_ms",
    "api_server_ms_per_request",
    "allreduce_latency_us",
    "custom_allreduce_latency_us",
)
"""Parameters a calibration considers besides its hardware class's own list: every term of
the step time that a probe's metrics can move. prefill_compute_efficiency is left to the
classes that list it: it differs from compute_efficiency only for GEMMs of thousands of rows,
which a probe's short prompts hardly run, so the two trade off and the fit drifts to a
bound (seen on the stored tiny-qwen3 run: 0.02, its floor)."""

SENSITIVITY_STEP = 0.3
"""Relative move of a parameter (of its prior, or 5% of its range where the prior is 0)
used to measure its effect on the points."""

MIN_EFFECT = 0.02
"""A candidate is fitted only if a SENSITIVITY_STEP move changes the log residuals of one
metric family's points by at least this much, root mean square (2%): less is below what a
probe resolves."""

COLLINEARITY = 0.25
"""A candidate is fitted only if at least this share of its Jacobian column is independent
of the columns chosen before it: else the data cannot tell the two apart."""

NOISE_Z = 1.5
"""A candidate is fitted only if the misfit it explains exceeds this many standard deviations
of the measurement noise along its direction, where the data hold repeated runs to measure
that noise from (replicate_noise). Measured 2026-11-27 on 17 stored live-loop runs (fit C=1,
2, 4 of a tiny model on vLLM's CPU build, predict C=8 and 16): without the test a run whose
C=1-4 scatter tilted the per-sequence term (384 us against its 265 us prior) predicted C=16
TPOT 34% high (14% with the term held); at 2 sd, estimated from two runs a level, a stored
run from another host lost the per-sequence term it needed (C=8 tok/s -25% instead of -3%);
1 and 1.5 sd chose alike on all 17. On the 15 runs of this host (benchmarks/bench_live_loop.py
over calibration/runs/loops-2026-11-27 and the c16 runs) the worst held-out error per run:
median 14.2%, at most 23.9% (14.9% and 34.1% without the test). A 16th loop, from a CI run
whose host slowed by 20-50% from run to run, still fitted its scatter (C=16 TPOT +38.2%)
until deviations were clipped at the runs' own robust spread (NOISE_CLIP_MADS): with that,
all 16 loops at most 23.9%, median 13.7%. Two later CI loops (the *-ci2 runs) still miss
(C=16 TPOT +39% and +69%): their C=1-4 TPOT rises twice as steeply as above C=4, beyond
their scatter at any NOISE_Z up to 2.5, which no noise test can tell from a real
per-sequence cost. (All with cpu-host's step_overhead_us at 900 us; at the 1,300 us that
every stored loop fitted together gave next, the 18 loops' worst error per run has median
12.9% and maximum 49.2%, the MoE *-ci2 loop. The measured GEMM, attention and KV-read
rates since, hardware_db/efficiency/cpu-host.yaml, leave the 22 loops then stored at
median 13.9%, maximum 57.4%, the MoE *-ci loop.)"""

NOISE_CLIP = 0.1
"""A run's deviation from its level's mean counts at most this much (log units, about 10%)
in the noise estimate, unless the runs' scatter is wider (NOISE_CLIP_MADS): one slow request
(a TTFT mean 2.5x its level's other run, seen on a stored tiny MoE run) must not make every
term look like noise, as the fit's soft-L1 loss counts residuals beyond its 0.1 scale only
linearly."""

NOISE_CLIP_MADS = 3.0
"""...unless the runs' own scatter is wider: a deviation counts up to this many robust
standard deviations (1.4826 x the median absolute deviation) of all the scenario's
deviations (noise_clip): an outlier is clipped to the rest's spread, a host that wanders by
20% from run to run keeps it. Three sd is the usual outlier cut for a normal spread. On the
CI loop above the fixed 0.1 clip cut the third run's 20-50% slowdown to 10% and the C=1-4
scatter passed for signal."""

IDENTIFIABLE_RSE = 0.3
"""A fitted parameter is identifiable when its standard error is below this share of its
value (and it did not end at a bound)."""

POOR_FIT_MEDIAN = 0.15
"""A metric whose in-sample errors have a median beyond +-15% is reported as poorly fitted."""

POOR_FIT_TREND = 0.20
"""...as is one whose error drifts by more than 20% from the lowest to the highest level."""


def point_weights(points) -> np.ndarray:
    """METRIC_WEIGHTS of each compared point (anything with .metric and .statistic)."""
    return np.array([METRIC_WEIGHTS.get((p.metric, p.statistic), 1.0) for p in points])


def replicate_noise(points) -> np.ndarray | None:
    """Covariance of the measurement noise in the points' weighted log values (n x n; None
    where nothing was measured twice), from repeated runs. The points of one level of one
    scenario (dataset, scenario, concurrency) form a run's vector of metrics, the k-th
    occurrence of a (metric, statistic) belonging to run k. The runs' deviations from their
    level's mean, pooled over the scenario's levels (relative noise alike at every level;
    two or three runs a level are too few to estimate it level by level), give the sample
    covariance of a run's metrics (they move together when the host slows), placed on each
    run's block."""
    scenarios: dict[tuple, dict[int, list[dict[tuple[str, str], int]]]] = {}
    for i, p in enumerate(points):
        runs = scenarios.setdefault((p.dataset, p.scenario), {}).setdefault(p.concurrency, [])
        key = (p.metric, p.statistic)
        for run in runs:
            if key not in run:
                run[key] = i
                break
        else:
            runs.append({key: i})
    weights = np.sqrt(point_weights(points))
    measured = np.array([p.measured for p in points], dtype=float)
    logs = weights * np.log(np.where(measured > 0, measured, np.nan))
    noise = np.zeros((len(points), len(points)))
    repeated = False
    for levels in scenarios.values():
        keys = sorted({k for runs in levels.values() for run in runs for k in run})
        slot = {k: j for j, k in enumerate(keys)}
        scatter = np.zeros((len(keys), len(keys)))
        counts = np.zeros((len(keys), len(keys)))
        blocks = []
        for runs in levels.values():
            common = [k for k in keys if all(k in run for run in runs)]
            if len(runs) < 2 or not common:
                continue
            rows = np.array([[logs[run[k]] for k in common] for run in runs])
            if np.all(np.isfinite(rows)):
                blocks.append((runs, common, rows - rows.mean(axis=0)))
        clip = noise_clip([d for _, _, d in blocks])
        for runs, common, deviations in blocks:
            deviations = np.clip(deviations, -clip, clip)
            at = np.array([slot[k] for k in common])
            scatter[np.ix_(at, at)] += deviations.T @ deviations
            counts[np.ix_(at, at)] += len(runs) - 1
        if not counts.any():
            continue
        cov = np.divide(scatter, counts, out=np.zeros_like(scatter), where=counts > 0)
        for runs in levels.values():
            for run in runs:
                index = np.array(list(run.values()))
                at = np.array([slot[k] for k in run])
                noise[np.ix_(index, index)] += cov[np.ix_(at, at)]
        repeated = True
    return noise if repeated else None


def noise_clip(deviations: list[np.ndarray]) -> float:
    """Where a run's deviation from its level's mean (log units) stops counting in full:
    NOISE_CLIP_MADS robust standard deviations (1.4826 x the median absolute deviation of
    all of them), at least NOISE_CLIP. An odd request is clipped to the scatter of the rest,
    and a host whose every run wanders by 20% keeps that scatter."""
    if not deviations:
        return NOISE_CLIP
    flat = np.abs(np.concatenate([d.ravel() for d in deviations]))
    return max(NOISE_CLIP, NOISE_CLIP_MADS * 1.4826 * float(np.median(flat)))


def parameter_scale(prior: float, lower: float, upper: float) -> float:
    """The scale a parameter moves on: its prior's size, or 5% of its range at 0."""
    return max(abs(prior), 0.05 * (upper - lower))


@dataclass
class Selection:
    """What a calibration fits and why: ``fitted`` in the order chosen, ``held`` with the
    reason each was left at its prior, and each candidate's effect (RMS change of the log
    residuals for a SENSITIVITY_STEP move)."""

    fitted: list[str]
    held: dict[str, str]
    effect: dict[str, float]


def select_parameters(
    residuals: Callable[[np.ndarray], np.ndarray],
    names: list[str],
    prior: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    max_fitted: int,
    families: Callable[[], Sequence[str]] | None = None,
    noise: Callable[[], np.ndarray | None] | None = None,
) -> Selection:
    """Choose which of ``names`` to fit from the Jacobian of ``residuals`` (weighted log
    residuals of every point as a function of the parameter vector) at the priors: the
    sensitive ones, greedily (orthogonal matching pursuit): each time the one whose own
    direction, apart from those chosen, explains most of the misfit left at the priors
    within its bounds (a move past a bound explains only up to the bound), dropping those
    collinear with earlier choices, at most ``max_fitted``. ``families()``, asked once the
    residuals at the priors are known, labels each residual with its metric family
    (throughput, TTFT, ...): a candidate's effect is then
    its largest RMS within one family, so a term that moves only TTFT is not diluted by the
    throughput and TPOT points it leaves alone. ``noise()``, asked then too, gives the
    covariance of the residuals' measurement noise (replicate_noise) or None: a candidate
    whose explained misfit is within NOISE_Z standard deviations of that noise along its
    own direction is held."""
    r0 = residuals(prior)
    n = max(r0.size, 1)
    columns = []
    for i in range(len(names)):
        scale = parameter_scale(prior[i], lower[i], upper[i])
        x = prior.copy()
        up = prior[i] + SENSITIVITY_STEP * scale
        x[i] = up if up <= upper[i] else prior[i] - SENSITIVITY_STEP * scale
        x[i] = min(max(x[i], lower[i]), upper[i])
        moved = (x[i] - prior[i]) / scale
        delta = residuals(x) - r0 if moved else np.zeros_like(r0)
        columns.append(delta / moved * SENSITIVITY_STEP if moved else delta)
    jac = np.column_stack(columns) if columns else np.zeros((n, 0))
    labels = np.asarray(list(families()) if families is not None else [""] * jac.shape[0])
    noise_cov = noise() if noise is not None else None
    groups = [labels == f for f in dict.fromkeys(labels.tolist())] or [np.ones(n, bool)]
    effect = {
        name: max(float(np.sqrt(np.mean(jac[g, i] ** 2))) for g in groups if g.any())
        for i, name in enumerate(names)
    }
    held = {
        name: f"insensitive: a {SENSITIVITY_STEP:.0%} move changes the points by "
        f"{100 * effect[name]:.3g}% (below {100 * MIN_EFFECT:.0f}%)"
        for name in names
        if not effect[name] >= MIN_EFFECT
    }
    sensitive = [i for i, name in enumerate(names) if name not in held]
    fitted: list[str] = []
    basis = np.zeros((n, 0))  # orthonormal basis of the chosen columns
    misfit = r0.copy()  # the residuals the chosen columns cannot explain (linearised)
    while sensitive:
        scores = {}
        for i in list(sensitive):
            col = jac[:, i]
            own = col - basis @ (basis.T @ col)
            independent = float(np.linalg.norm(own) / max(np.linalg.norm(col), 1e-300))
            if independent < COLLINEARITY:
                held[names[i]] = (
                    f"collinear with {', '.join(fitted)}: only {independent:.0%} of its effect "
                    "is its own"
                )
                sensitive.remove(i)
                continue
            size = float(np.linalg.norm(own))
            # the move (in SENSITIVITY_STEP units) that would cancel most of the misfit
            # along its own direction, cut to the room its bounds leave that way
            move = -float(own @ misfit) / size**2
            unit = SENSITIVITY_STEP * parameter_scale(prior[i], lower[i], upper[i])
            room = (upper[i] - prior[i] if move > 0 else prior[i] - lower[i]) / unit
            # what it can explain of the misfit, then its own size as a tie-break, and the
            # standard deviation of the noise along its own direction
            q = own / size
            sd = float(np.sqrt(max(q @ noise_cov @ q, 0.0))) if noise_cov is not None else 0.0
            scores[i] = (min(abs(move), room) * size, size, sd)
        if not scores:
            break
        beyond_noise = [i for i in scores if scores[i][0] > NOISE_Z * scores[i][2]]
        if noise_cov is not None and not beyond_noise:
            after = f"after {', '.join(fitted)} " if fitted else ""
            for i in scores:
                held[names[i]] = (
                    f"within the runs' scatter: {after}it would explain {scores[i][0]:.3g} "
                    f"of the misfit (root-sum-square of log residuals), the runs' noise along "
                    f"it {scores[i][2]:.3g} (1 sd; needs {NOISE_Z:g} sd)"
                )
            break
        best = max(beyond_noise or scores, key=lambda i: scores[i][:2])
        if fitted and scores[best][0] / np.sqrt(n) < MIN_EFFECT:
            for i in scores:
                held[names[i]] = (
                    f"not needed: after {', '.join(fitted)} it would explain "
                    f"{100 * scores[i][0] / np.sqrt(n):.3g}% of the misfit (below "
                    f"{100 * MIN_EFFECT:.0f}%)"
                )
            break
        if len(fitted) >= max_fitted:
            for i in scores:
                held[names[i]] = f"the data hold {n} points: at most {max_fitted} parameters"
            break
        own = jac[:, best] - basis @ (basis.T @ jac[:, best])
        q = own / np.linalg.norm(own)
        basis = np.column_stack((basis, q))
        misfit = misfit - q * float(q @ misfit)
        fitted.append(names[best])
        sensitive.remove(best)
    return Selection(fitted=fitted, held=held, effect=effect)


def fit_warnings(points, errors: np.ndarray) -> list[str]:
    """Poor-fit warnings from in-sample errors (predicted / measured - 1 per point): per
    metric, a median beyond POOR_FIT_MEDIAN or a drift from the lowest to the highest level
    beyond POOR_FIT_TREND, naming the metric and the levels."""
    groups: dict[str, list[tuple[int, float]]] = {}
    for p, e in zip(points, errors, strict=True):
        if np.isfinite(e):
            key = p.metric if p.statistic == "mean" else f"{p.metric} {p.statistic}"
            groups.setdefault(key, []).append((p.concurrency, float(e)))
    out = []
    for key, pairs in sorted(groups.items()):
        errs = np.array([e for _, e in pairs])
        median = float(np.median(errs))
        if abs(median) > POOR_FIT_MEDIAN:
            out.append(
                f"{key}: in-sample error median {median:+.0%} (beyond "
                f"+-{POOR_FIT_MEDIAN:.0%}) at levels {sorted({c for c, _ in pairs})}"
            )
            continue
        levels = sorted({c for c, _ in pairs})
        if len(levels) >= 2:
            lo = np.median([e for c, e in pairs if c == levels[0]])
            hi = np.median([e for c, e in pairs if c == levels[-1]])
            if abs(hi - lo) > POOR_FIT_TREND:
                out.append(
                    f"{key}: error drifts from {lo:+.0%} at C={levels[0]} to {hi:+.0%} at "
                    f"C={levels[-1]}: the model misses how it scales with concurrency"
                )
    return out
