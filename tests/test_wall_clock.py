"""The wall-clock tests' one policy (tests/wall_clock.py) on hand-made checks."""

from __future__ import annotations

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
