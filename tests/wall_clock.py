"""Tests that run on the wall clock (a mock or simulated server answering in real time)
measure the contention beside them: a test that depends on this host's speed must not fail
on a busy host (issue 48), and must still fail on a quiet one."""

from __future__ import annotations

import time

BUSY_SHARE = 0.8
"""Below this share of a core (cpu_share) the host counts as busy."""


def cpu_share(seconds: float = 0.2) -> float:
    """The share of one core this process gets while it computes (CPU time over wall
    time of a busy loop): about 1 on a quiet host, lower when other processes compete for
    the cores. The serve round trips run on the wall clock, so their tolerances widen
    with the contention measured beside them (issue 48: a test that depends on the host's
    speed must not fail on a busy host)."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    x = 0
    while time.perf_counter() - wall0 < seconds:
        x += 1
    return min(1.0, (time.process_time() - cpu0) / (time.perf_counter() - wall0))


def wall_clock_tolerance(base: float, shares: list[float]) -> float:
    """``base`` on a quiet host, widened by twice the share of a core that other
    processes took (at 0.66 of a core, two CPU hogs beside the test on two cores, the
    tolerance grows by 0.68)."""
    return base + 2.0 * (1.0 - min(shares))


def host_was_busy(shares: list[float]) -> bool:
    """Whether any contention sample (cpu_share) found the host busy."""
    return min(shares) < BUSY_SHARE
