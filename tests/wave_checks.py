"""Comparing a closed loop's first-token latencies wave by wave (issue 45): shared by the
live burst test and the replay of its stored runs."""

from __future__ import annotations

import numpy as np

TOLERANCE = 0.20
"""How far a simulated TTFT statistic may be from the measured one (relative)."""

WIDE_TOLERANCE = 0.5
"""A miss that fails the live burst test (relative): the scale of the mechanism under test
(without the API server's serial work the stored runs' second wave is simulated 52-59%
short): tests/test_waves.py shows that such a simulation misses by more than this."""

STRUCTURE_ONLY = float("inf")
"""The tolerance that leaves only compare_waves' structural checks (every figure agrees
within an infinite tolerance): what the live burst test gates."""

EQUAL_OVER_SPREAD = 1.3
"""How many times a spread-length run's second-wave ratio (second_wave_ratio) every
equal-length run of the same live attempt must reach. The fixed thresholds the stored runs
meet (equal over 0.5, spread under 0.3: 0.69-0.74 and 0.10-0.11 there) carry the host's
timing: the clean-clone CI run of 2026-12-01 measured equal 0.58-0.80 and spread 0.18-0.37
(0.076 s against 0.207 s), a structural miss of a run whose figures held. Measured in the
same minutes, the two workloads keep their order by 1.56x or more in every run on record;
were the waves gone (a server that admits the second wave step by step), the equal runs
would fall to the spread runs' ratios and fail this."""


def second_wave_ratio(meas: list[np.ndarray]) -> float:
    """The second wave's median TTFT over the first's (1 when the waves persist at full
    depth, near 0 when the later requests meet no queue)."""
    return float(np.median(meas[1]) / np.median(meas[0]))


def quantile_band(values: np.ndarray, q: float) -> tuple[float, float]:
    """The order statistics that bound the ``q`` quantile of ``values``' population with
    about 95% confidence (binomial: rank n q +- 1.96 sqrt(n q (1 - q)))."""
    v = np.sort(values)
    n = v.size
    half = 1.96 * np.sqrt(n * q * (1 - q))
    lo = int(np.clip(np.floor(n * q - half), 0, n - 1))
    hi = int(np.clip(np.ceil(n * q + half), 0, n - 1))
    return float(v[lo]), float(v[hi])


def agrees(simulated: float, measured: np.ndarray, q: float, tolerance: float = TOLERANCE) -> bool:
    """A simulated quantile agrees with a measured sample when it is within TOLERANCE of
    the measured quantile, or inside that quantile's own 95% band (a bimodal sample can
    put its median on either side of its gap by one request's timing)."""
    m = float(np.quantile(measured, q))
    if abs(simulated / m - 1) <= tolerance:
        return True
    lo, hi = quantile_band(measured, q)
    return lo <= simulated <= hi


def waves(records: list[dict], concurrency: int) -> list[np.ndarray]:
    """TTFTs (s) of each wave: the requests in sending order, ``concurrency`` at a time."""
    ordered = sorted(records, key=lambda r: r["send"])
    ttft = np.array([r["first_token"] - r["send"] for r in ordered])
    return [ttft[i : i + concurrency] for i in range(0, len(ttft), concurrency)]


def simulated_waves(setup, concurrency: int, requests: int, prompt: int, output: str):
    """The simulator's waves for a closed loop of ``requests`` at ``concurrency``."""
    from capsim.engine.lengths import parse_length
    from capsim.engine.levels import simulate_level
    from capsim.engine.workloads import Workload

    workload = Workload(
        kind="closed",
        concurrency=concurrency,
        requests=requests,
        input=parse_length(str(prompt)),
        output=parse_length(output),
    )
    sim = simulate_level(setup, workload, seed=0, keep_records=True)
    return waves([r.model_dump() for r in sim.records], concurrency)


def measured_runs(events: list[dict]) -> dict[int, list[dict]]:
    """A probe log's ok requests by run."""
    runs: dict[int, list[dict]] = {}
    for e in events:
        if e.get("type") == "request" and e.get("outcome") == "ok":
            runs.setdefault(e["run"], []).append(e)
    return runs


class WaveMiss(AssertionError):
    """A wave statistic the simulation missed; ``direction`` is +1 when the simulated
    latencies were too long, -1 when too short, 0 for a structural miss (the waves
    persisting or dissolving)."""

    def __init__(self, line: str, direction: int):
        super().__init__(line)
        self.direction = direction


def compare_waves(
    name: str,
    run: int,
    meas: list[np.ndarray],
    sim: list[np.ndarray],
    tolerance: float = TOLERANCE,
    measured_structure: bool = True,
) -> str:
    """Check the wave structure of one measured run against the simulation's, each
    statistic within ``tolerance``; returns the line of figures it checked and raises
    WaveMiss naming them when one does not hold. ``measured_structure=False`` leaves the
    measured run's own structure (its second wave against its first) to the caller, which
    compares it across runs (second_wave_ratio, EQUAL_OVER_SPREAD)."""
    meas_all, sim_all = np.concatenate(meas), np.concatenate(sim)
    line = (
        f"{name} run {run}: TTFT mean {meas_all.mean():.3f} s measured, "
        f"{sim_all.mean():.3f} simulated; p50 {np.median(meas_all):.3f} / "
        f"{np.median(sim_all):.3f}; p90 {np.quantile(meas_all, 0.9):.3f} / "
        f"{np.quantile(sim_all, 0.9):.3f}; second wave p50 {np.median(meas[1]):.3f} / "
        f"{np.median(sim[1]):.3f}; first wave p50 {np.median(meas[0]):.3f} / "
        f"{np.median(sim[0]):.3f}"
    )

    def quantile_check(simulated: float, measured: np.ndarray, q: float) -> None:
        if not agrees(simulated, measured, q, tolerance):
            raise WaveMiss(line, 1 if simulated > np.quantile(measured, q) else -1)

    def structure_check(holds: bool) -> None:
        if not holds:
            raise WaveMiss(line, 0)

    mean_ratio = sim_all.mean() / meas_all.mean()
    if abs(mean_ratio - 1) > tolerance:
        raise WaveMiss(line, 1 if mean_ratio > 1 else -1)
    quantile_check(float(np.quantile(sim_all, 0.9)), meas_all, 0.9)
    if name == "equal":
        # the waves persist: the second queues for the prefill budget as the first did,
        # several prefill steps, not one
        quantile_check(float(np.median(sim_all)), meas_all, 0.5)
        quantile_check(float(np.median(sim[1])), meas[1], 0.5)
        if measured_structure:
            structure_check(second_wave_ratio(meas) > 0.5)
        structure_check(second_wave_ratio(sim) > 0.5)
    else:
        # Spread lengths: the later waves arrive one by one and meet no queue. The median
        # is not asserted: it falls in the gap between the requests that met an idle
        # prefill (0.18 s) and those that waited behind another's prefill step (0.33 s);
        # on 2026-11-28 6-8 of the 32 later requests waited on the server and 9-10 in the
        # simulation, so the median was 0.19 s measured and 0.32 s simulated while the
        # mean and p90 agreed within 8%.
        if measured_structure:
            structure_check(second_wave_ratio(meas) < 0.3)
        structure_check(second_wave_ratio(sim) < 0.3)
    return line
