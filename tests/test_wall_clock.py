"""The wall-clock tests' one policy (tests/wall_clock.py) on hand-made checks."""

from __future__ import annotations

from math import inf

import pytest
from _pytest.outcomes import Failed, XFailed

from tests.wall_clock import Check, judge_on_the_wall_clock


def test_a_check_counts_its_error_in_tolerances():
    assert Check("rel", 110.0, 100.0, 0.05).misses_by == pytest.approx(2.0)
    assert Check("abs", 0.9, 0.825, 0.12, relative=False).misses_by == pytest.approx(0.625)


def attempts(*values: float):
    def attempt(i: int) -> list[Check]:
        return [Check("TTFT", values[i], 100.0, 0.05)]

    return attempt


def test_a_later_attempt_that_holds_passes():
    judge_on_the_wall_clock(attempts(120.0, 103.0), noise_band=3.0)


def test_misses_within_the_noise_band_are_an_expected_failure_naming_the_best():
    with pytest.raises(XFailed, match=r"TTFT 108 vs 100"):
        judge_on_the_wall_clock(attempts(112.0, 108.0), noise_band=3.0)


def test_a_miss_beyond_the_band_on_every_attempt_fails():
    with pytest.raises(Failed, match=r"beyond 3.0x"):
        judge_on_the_wall_clock(attempts(130.0, 60.0), noise_band=3.0)


def slow_attempts(*values: float, slow: str = "high"):
    def attempt(i: int) -> list[Check]:
        return [Check("TTFT", values[i], 100.0, 0.05, slow=slow)]

    return attempt


def test_a_slow_side_miss_is_judged_against_the_slow_band():
    """A latency too long is what a busy host makes: with slow_band inf it never fails,
    however far; a latency too short (no host makes a server faster) still fails."""
    with pytest.raises(XFailed, match=r"any on the slow side.*TTFT 190 vs 100"):
        judge_on_the_wall_clock(slow_attempts(200.0, 190.0), noise_band=2.0, slow_band=inf)
    with pytest.raises(Failed, match=r"beyond 2.0x"):
        judge_on_the_wall_clock(slow_attempts(80.0, 85.0), noise_band=2.0, slow_band=inf)
    with pytest.raises(XFailed, match=r"TTFT 85 vs 100"):  # a throughput too low
        judge_on_the_wall_clock(slow_attempts(80.0, 85.0, slow="low"), 2.0, slow_band=inf)
    with pytest.raises(Failed, match=r"beyond 5.0x"):  # a finite slow band still fails
        judge_on_the_wall_clock(slow_attempts(130.0, 140.0), noise_band=2.0, slow_band=5.0)


def test_other_processes_cpu_time_is_counted_and_the_servers_is_not():
    """OthersCores counts the CPU time a process running beside the block spends during it
    (what the kernel charged a spinning child, whatever share of a core a busy host gives
    it), and leaves out the server under test ('vllm' in its command line) and this
    process."""
    import os
    import subprocess
    import sys
    import time

    from tests.wall_clock import OthersCores, _cpu_seconds_by_pid

    spin = "import time\nt = time.time()\nwhile time.time() - t < 3: pass\n"
    hog = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.2)
        start = _cpu_seconds_by_pid()[hog.pid][0]
        with OthersCores() as meter:
            time.sleep(0.8)
        spent = _cpu_seconds_by_pid()[hog.pid][0] - start
    finally:
        hog.kill()
        hog.wait()
    assert spent > 0.1  # it ran
    assert meter.seconds >= 0.8 * spent, (meter.seconds, spent)  # spent brackets the block
    # the server, its engine process (a child with another command line) and this process
    # are left out; the rest counts
    snapshot = {
        10: (5.0, "python -m vllm.entrypoints.openai.api_server", 1),
        11: (7.0, "python -c from multiprocessing.spawn import spawn_main", 10),
        2: (3.0, "yes ", 1),
        os.getpid(): (9.0, "python", 1),
    }
    assert OthersCores(ours=("vllm",))._others(snapshot) == {2: 3.0}
