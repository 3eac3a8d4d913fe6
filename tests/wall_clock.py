"""Tests that run on the wall clock (a mock or simulated server answering in real time)
measure the contention beside them: a test that depends on this host's speed must not fail
on a busy host (issue 48), and must still fail on a quiet one."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import pytest

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


OTHERS_BUSY_CORES = 0.25
"""Above this many cores taken by processes outside the test and the server under test
(OthersCores) the host counts as busy."""


def _cpu_seconds_by_pid() -> dict[int, tuple[float, str, int]]:
    """Every process's CPU time so far (user + system, seconds), command line and parent,
    from /proc (empty where there is no /proc)."""
    import os

    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # its own time and that of the children it has reaped (a make's compilers)
        spent = sum(int(fields[i]) for i in (11, 12, 13, 14))
        out[int(entry)] = (spent / tick, cmdline, int(fields[1]))
    return out


class OthersCores:
    """How many cores processes other than this test's own and the server under test took
    while the block ran (a context manager; ``cores`` after it). cpu_share samples taken
    between measurements miss a CPU hog when the server idles then: on 2026-11-29 a CI run
    beside ``yes`` sampled shares of 0.99, 0.69 and 0.98 around a burst test while the hog
    held a whole core throughout. ``ours`` are substrings of the command lines that belong
    to the run (the vLLM server: 'vllm'); their descendants (its engine process) and this
    process count as ours too."""

    def __init__(self, ours: tuple[str, ...] = ("vllm", "VLLM")):
        self.ours = ours
        self.cores = 0.0
        self.seconds = 0.0

    def _others(self, snapshot) -> dict[int, float]:
        """CPU seconds of every process but this one, those whose command line names the
        run and their descendants (vLLM's engine process, a spawned worker)."""
        import os

        me = os.getpid()
        marked = {pid for pid, (_, cmd, _) in snapshot.items() if any(m in cmd for m in self.ours)}

        def ours(pid: int) -> bool:
            seen = set()
            while pid in snapshot and pid not in seen:
                if pid in marked:
                    return True
                seen.add(pid)
                pid = snapshot[pid][2]
            return False

        return {pid: cpu for pid, (cpu, _, _) in snapshot.items() if pid != me and not ours(pid)}

    def __enter__(self):
        self.wall0 = time.perf_counter()
        self.before = self._others(_cpu_seconds_by_pid())
        return self

    def __exit__(self, *exc):
        after = self._others(_cpu_seconds_by_pid())
        wall = max(time.perf_counter() - self.wall0, 1e-9)
        self.seconds = sum(cpu - self.before.get(pid, 0.0) for pid, cpu in after.items())
        self.cores = max(0.0, self.seconds / wall)
        return False

    @property
    def busy(self) -> bool:
        return self.cores > OTHERS_BUSY_CORES


@dataclass(frozen=True)
class Check:
    """One wall-clock comparison: ``got`` against ``want`` within ``tolerance`` (a share of
    ``want`` when ``relative``, else in ``got``'s units). ``slow`` is the side a slow or
    busy host pushes ``got`` to: ``high`` for a latency, ``low`` for a throughput, None
    when it can go either way."""

    label: str
    got: float
    want: float
    tolerance: float
    relative: bool = True
    slow: Literal["high", "low"] | None = None

    @property
    def on_the_slow_side(self) -> bool:
        """Whether ``got`` missed the way a slow host would push it."""
        if self.slow is None:
            return False
        return self.got > self.want if self.slow == "high" else self.got < self.want

    @property
    def misses_by(self) -> float:
        """The error in tolerances: 1 or less holds."""
        allowed = self.tolerance * (abs(self.want) if self.relative else 1.0)
        return abs(self.got - self.want) / allowed

    def __str__(self) -> str:
        allowed = f"{100 * self.tolerance:.0f}%" if self.relative else f"{self.tolerance:g}"
        return f"{self.label} {self.got:.4g} vs {self.want:.4g} (+-{allowed})"


def judge_on_the_wall_clock(
    attempt: Callable[[int], list[Check]],
    noise_band: float,
    attempts: int = 2,
    slow_band: float | None = None,
) -> None:
    """The one policy of the tests that run on the wall clock (issue 48: a test that
    depends on this host's speed must not gate a landing, and must still catch a broken
    mechanism). ``attempt(i)`` measures afresh and returns its checks. The test passes when
    one attempt holds every check; when every attempt misses but the best one stays within
    ``noise_band`` tolerances, it is an expected failure naming the figures (a two-core
    virtual machine's steal time and scheduling jitter, which no contention sample sees,
    moved clean-clone CI runs by 5-32% on quiet-looking hosts); beyond that it fails. Each
    test sets ``noise_band`` below the miss its mechanism makes when broken, and says so.

    A miss on a check's slow side (a latency too long, a throughput too low) is judged
    against ``slow_band`` instead (default: ``noise_band``): a test whose mechanism a
    host-independent test already holds (tests/test_serve_pacing.py runs capsim serve's
    engine on a virtual clock) passes ``math.inf``, so a slow host never fails it, while a
    miss no slow host can make (a first token too early) still does."""
    slow_band = noise_band if slow_band is None else slow_band
    best: list[Check] | None = None
    for i in range(attempts):
        misses = [check for check in attempt(i) if check.misses_by > 1.0]
        if not misses:
            return
        print(f"attempt {i + 1} missed: {[str(m) for m in misses]}")
        if best is None or max(m.misses_by for m in misses) < max(m.misses_by for m in best):
            best = misses
    assert best is not None
    figures = "; ".join(str(m) for m in best)
    beyond = [m for m in best if m.misses_by > (slow_band if m.on_the_slow_side else noise_band)]
    if not beyond:
        slow = "any" if math.isinf(slow_band) else f"{slow_band}x"
        bands = f"{noise_band}x"
        if slow_band != noise_band:
            bands += f" ({slow} on the slow side)"
        pytest.xfail(f"wall-clock noise, every attempt missed within {bands}: {figures}")
    band = slow_band if beyond[0].on_the_slow_side else noise_band
    pytest.fail(f"beyond {band}x the tolerance on every attempt: {figures}")
