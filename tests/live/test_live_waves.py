"""Issue 45: a closed loop that starts as a burst queues in waves, on a real vLLM server.

C clients that start together are prefilled a few at a time (the token budget), so they
finish in groups and each later wave arrives as a burst that queues for the prefill budget
again. With equal lengths the waves persist; with spread lengths they dissolve. The
simulator, run on this server's own step times (measured at other loads: a sweep of
C=1..16, never the burst runs themselves), must reproduce that structure; its first-token
latencies are printed beside the measured ones (gated on stored runs, tests/test_waves.py).

Why the step table and not the cpu-host catalog entry: the cpu-host entry was measured on
the development machine of 2026-11-22 (AMX, 23.5 GB/s); the machine this suite runs on
may be another (on 2026-11-28 one without AMX or AVX512-BF16, 10.5 GB/s and 0.044 bf16
TFLOPS by benchmarks/bench_host.py, where the uncalibrated prediction is 4x off on every
metric). The test is about the scheduler and the front end, so it takes the host's speed
from the host.
"""

from __future__ import annotations

import pytest

from capsim.calibration.step_table import measured_setup_from_run
from capsim.probe.runfile import load_run
from capsim.probe.runner import ProbeConfig, run_probe
from tests.live.conftest import live_server
from tests.wall_clock import OTHERS_BUSY_CORES, OthersCores, cpu_share, host_was_busy
from tests.wave_checks import (
    EQUAL_OVER_SPREAD,
    STRUCTURE_ONLY,
    TOLERANCE,
    WaveMiss,
    compare_waves,
    measured_runs,
    second_wave_ratio,
    simulated_waves,
    waves,
)

pytestmark = pytest.mark.live

MODEL = "tiny-qwen3"
C = 16
PROMPT = 512
WAVES = 3
BURSTS = (("equal", "64"), ("spread", "uniform:32,96"))


def measure_and_compare(url: str, folder) -> tuple[list[str], list[str]]:
    """One attempt: the sweep that gives the step table, then the bursts, each run compared
    with the simulation; the figures missed at TOLERANCE (reported, never gating) and the
    structural misses (the simulated waves persisting with equal lengths and dissolving with
    spread ones; the measured equal runs keeping EQUAL_OVER_SPREAD above the spread runs)."""
    folder.mkdir()
    sweep = run_probe(
        ProbeConfig(
            url=url,
            model=MODEL,
            concurrency=[1, 2, 4, 8, 16],
            input_tokens=PROMPT,
            output_tokens=64,
            requests=16,
        ),
        folder / "sweep.json",
    )
    # vLLM's CPU build runs 2048 batched tokens a step (engines/vllm.yaml's row for
    # devices under 70 GiB; its first wave of 16 x 512 tokens takes 4-5 prefill steps)
    setup = measured_setup_from_run(sweep, max_num_batched_tokens=2048)
    figures, structure = [], []
    ratios: dict[str, list[float]] = {}
    for name, output in BURSTS:
        path = folder / f"burst-{name}.json"
        run_probe(
            ProbeConfig(
                url=url,
                model=MODEL,
                concurrency=[C],
                input_tokens=PROMPT,
                output_tokens=output,
                requests=WAVES * C,
                runs=2,
            ),
            path,
        )
        sim = simulated_waves(setup, C, WAVES * C, PROMPT, output)
        for run, records in sorted(measured_runs(load_run(path)[1]).items()):
            assert len(records) == WAVES * C
            measured = waves(records, C)
            ratios.setdefault(name, []).append(second_wave_ratio(measured))
            try:
                print(compare_waves(name, run, measured, sim, measured_structure=False))
            except WaveMiss as miss:
                figures.append(str(miss).splitlines()[0])
            try:
                compare_waves(name, run, measured, sim, STRUCTURE_ONLY, measured_structure=False)
            except WaveMiss as miss:
                structure.append(f"simulated structure: {str(miss).splitlines()[0]}")
    line = (
        f"second wave over first (p50): equal {[round(r, 2) for r in ratios['equal']]}, "
        f"spread {[round(r, 2) for r in ratios['spread']]}"
    )
    print(line)
    if min(ratios["equal"]) < EQUAL_OVER_SPREAD * max(ratios["spread"]):
        # the measured waves did not persist with equal lengths, or did with spread ones
        structure.append(f"{line}: equal under {EQUAL_OVER_SPREAD}x spread")
    return figures, structure


def test_dense_closed_loop_burst_queues_in_waves(tmp_path):
    """What gates: the wave structure, which is read within one run, so the host's speed
    cancels to first order. With equal lengths the simulated second wave's median TTFT
    must be over half the first's (without the API server's serial work the simulation
    puts it at 0.34 of the first, tests/test_waves.py; the stored runs measure 0.69-0.74),
    with spread lengths under 0.3 of it; the measured runs, whose ratios move with the
    host's timing (CI, 2026-12-01: equal 0.58-1.15, spread up to 0.37), must keep the two
    apart: every equal run's ratio EQUAL_OVER_SPREAD (1.3) times every spread run's of the
    same attempt. A structural miss is measured once more from a fresh sweep, and is an
    expected failure when the host was measured busy (tests/wall_clock.py).

    The figures (mean, p50, p90, second wave, within TOLERANCE) are printed, and a miss
    is an expected failure that names them: they compare a simulation fed by a sweep with
    bursts measured minutes later, so they carry the host's speed between the two (CI runs
    of 2026-11-28..30 missed by 16-33% both ways; on 2026-12-01 the measured first wave's
    median moved from 0.195 to 0.334 s between runs of one job, against 0.347-0.370
    simulated, and its p90 missed by +81%). A test that rests on the host's wall-clock
    speed does not gate a landing; the figures are gated deterministically on the stored
    runs of this server (tests/test_waves.py, within TOLERANCE)."""
    url = live_server("dense")
    shares, others = [cpu_share()], []
    with OthersCores() as meter:
        figures, structure = measure_and_compare(url, tmp_path / "first")
    others.append(meter.cores)
    shares.append(cpu_share())
    if structure:
        print(f"first attempt missed the structure: {structure}; measuring again")
        with OthersCores() as meter:
            figures, structure = measure_and_compare(url, tmp_path / "again")
        others.append(meter.cores)
        shares.append(cpu_share())
    busy = host_was_busy(shares) or max(others) > OTHERS_BUSY_CORES
    if structure and busy:
        pytest.xfail(
            f"the host was busy (shares of a core {shares}; other processes took "
            f"{[round(c, 2) for c in others]} cores): {structure}"
        )
    assert not structure, structure
    if figures:
        pytest.xfail(
            f"figures beyond {TOLERANCE:.0%} (the host's speed between the sweep and the "
            f"bursts; tests/test_waves.py gates them on stored runs): {figures}"
        )
