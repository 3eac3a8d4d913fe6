"""Uncalibrated bands: corpus errors per hardware class and metric family."""

from __future__ import annotations

import numpy as np
import pytest

import capsim
from capsim.calibration.bands import (
    MIN_POINTS,
    MIN_SOURCES,
    POOLED,
    band_coverage,
    build_band_table,
    load_band_table,
    weighted_percentiles,
)
from capsim.calibration.compare import ComparedPoint
from capsim.catalog.loader import load_catalog
from capsim.engine.bands import BAND_FIGURES
from capsim.engine.config import PredictConfig

CAT = load_catalog()


def point(gpu, metric, measured, predicted, scored=True, dataset="ds"):
    return ComparedPoint(dataset, "sc", 1, metric, measured, predicted, gpu, "vllm", "mean", scored)


def test_weighted_percentiles_by_hand():
    # equal weights: cumulative shares 1/8, 3/8, 5/8, 7/8 (midpoint rule)
    assert weighted_percentiles([4, 1, 3, 2], [1, 1, 1, 1], [50]) == pytest.approx([2.5])
    assert weighted_percentiles([1, 2, 3, 4], [1, 1, 1, 1], [10, 90]) == pytest.approx([1, 4])
    # weights 3 and 1: shares 0.375 and 0.875, so the median is 1/4 of the way to 10
    assert weighted_percentiles([0, 10], [3, 1], [50]) == pytest.approx([2.5])


def test_a_class_band_needs_enough_points_and_sources():
    classes = {"h100-sxm": "datacenter-hopper", "rtx4090": "consumer-ada"}
    ratios = np.linspace(0.5, 1.5, MIN_POINTS)
    one_source = [point("h100-sxm", "output_tok_s", 100 * r, 100.0) for r in ratios]
    band, pooled = build_band_table(one_source, classes).band("datacenter-hopper", "throughput")
    assert pooled and band.sources == 1
    many = [
        point("h100-sxm", "output_tok_s", 100 * r, 100.0, dataset=f"ds{i % MIN_SOURCES}")
        for i, r in enumerate(np.linspace(0.5, 1.5, 3 * MIN_SOURCES))
    ]
    many += [point("rtx4090", "tpot_s", 1.0, 1.0)]  # one point: too few for its own band
    many += [point("h100-sxm", "output_tok_s", 1.0, 100.0, scored=False)]  # reference only
    table = build_band_table(many, classes)
    band, pooled = table.band("datacenter-hopper", "throughput")
    assert not pooled and band.points == 3 * MIN_SOURCES and band.sources == MIN_SOURCES
    band, pooled = table.band("consumer-ada", "TPOT")
    assert pooled and band == table.bands[POOLED]["TPOT"]


def test_a_source_weighs_the_square_root_of_its_points_in_a_band():
    # 4 points of one write-up 2x over (weight 4 x 1/2 = 2, sqrt(4)), one write-up spot on
    # and one 2x under (weight 1 each): midpoint shares 1/8 (0.5), 3/8 (1.0), then 9/16 ..
    # 15/16 (2.0), so the 25th percentile lies halfway from 0.5 to 1.0 in log units.
    # Every point alike would put it on 1.0, every source alike at 0.5 ** (1/4).
    pts = [point("h100-sxm", "output_tok_s", 2.0, 1.0, dataset="big") for _ in range(4)]
    pts += [point("h100-sxm", "output_tok_s", 1.0, 1.0, dataset="exact")]
    pts += [point("h100-sxm", "output_tok_s", 0.5, 1.0, dataset="under")]
    table = build_band_table(pts, {})
    band = table.bands[POOLED]["throughput"]
    assert band.low_50 == pytest.approx(0.5**0.5)
    assert band.high_50 == pytest.approx(2.0) and band.sources == 3 and band.points == 6
    assert "n^0.5" in table.note


def test_coverage_checks_each_source_against_bands_built_without_it():
    # three sources spot on, one 5x off: leaving out an exact one, the others' 50% band
    # is [1, 5^0.75] and holds it; leaving out the 5x one, the band is [1, 1] and misses
    pts = [point("h100-sxm", "output_tok_s", 1.0, 1.0, dataset=d) for d in "abc"]
    pts += [point("h100-sxm", "output_tok_s", 5.0, 1.0, dataset="d")]
    table = band_coverage(pts, {}, lambda p: p.dataset)
    assert table["throughput"] == {
        "inside_50": 0.75,
        "inside_80": 0.75,
        "points": 4,
        "sources_inside_50": 0.75,
        "sources_inside_80": 0.75,
        "sources": 4,
    }


def test_coverage_per_source_weighs_each_source_the_same():
    # a 10-point source 5x off and three 1-point sources spot on: per point 3 of 13
    # are inside; per source 3 of 4 sources are wholly inside
    pts = [point("h100-sxm", "output_tok_s", 5.0, 1.0, dataset="big") for _ in range(10)]
    pts += [point("h100-sxm", "output_tok_s", 1.0, 1.0, dataset=d) for d in "abc"]
    row = band_coverage(pts, {}, lambda p: p.dataset)["throughput"]
    assert row["inside_50"] == pytest.approx(3 / 13)
    assert row["sources_inside_50"] == pytest.approx(0.75) and row["sources"] == 4


def test_a_decode_rate_counts_as_tpot_inverted():
    # predicted 50 tok/s per request, measured 100: TPOT was predicted twice too long
    pts = [point("h100-sxm", "decode_tok_s", 100.0, 50.0)]
    table = build_band_table(pts, {"h100-sxm": "datacenter-hopper"})
    assert table.bands[POOLED]["TPOT"].low == pytest.approx(0.5)


def test_every_figure_of_an_uncalibrated_prediction_has_a_band():
    assert load_band_table() is not None  # shipped in calibration/bands/
    config = PredictConfig(gpu="h100-sxm", model="llama-3.1-8b", concurrency=[4], requests=16)
    (level,) = capsim.predict(config, catalog=CAT).levels
    assert set(level.band_80) == set(BAND_FIGURES) == set(level.band_50)
    for name, (lo, hi) in level.band_80.items():
        lo50, hi50 = level.band_50[name]
        assert 0 < lo <= lo50 < hi50 <= hi
    assert "corpus" in level.band_source


def test_parameter_spread_is_simulated_at_a_few_levels_and_interpolated_in_log_level(
    monkeypatch,
):
    from types import SimpleNamespace

    import capsim.engine.bands as bands
    from capsim.engine.bands import PROPAGATION_LEVELS, propagated_log_sd, propagation_indices

    monkeypatch.setattr(bands, "band_values", lambda m: dict.fromkeys(BAND_FIGURES) | m)

    def level(c: float, rate: float) -> SimpleNamespace:
        return SimpleNamespace(level=c, metrics={"output_tok_s": rate})

    levels = [float(c) for c in range(1, 65)]
    assert propagation_indices(64) == [0, 13, 25, 38, 50, 63]
    assert propagation_indices(3) == [0, 1, 2]
    calls = []

    def rerun(overrides, indices):
        calls.append(indices)
        # a parameter that moves the rate by exactly level/64 in log
        shift = 1.0 if not overrides else None
        return [
            level(levels[i], 100.0 * (shift or np.exp(levels[i] / 64)) * levels[i]) for i in indices
        ]

    profile = SimpleNamespace(
        parameters={"p": SimpleNamespace(value=1.0, std=0.5, bounds=(0.0, 10.0))},
        correlation_between=lambda a, b: 1.0 if a == b else 0.0,
    )
    spread = propagated_log_sd([level(c, 100.0 * c) for c in levels], profile, rerun)
    assert len(calls) == 2 and all(len(c) == PROPAGATION_LEVELS for c in calls)
    # exact where simulated, linear in log level between
    assert spread[63]["output_tok_s"] == pytest.approx(1.0)
    assert spread[13]["output_tok_s"] == pytest.approx(14 / 64)
    x = (np.log(20) - np.log(14)) / (np.log(26) - np.log(14))
    assert spread[19]["output_tok_s"] == pytest.approx((1 - x) * 14 / 64 + x * 26 / 64)


def _two_parameter_profile(rho: float, bounds=(0.0, 10.0), b_std: float = 1.0):
    from capsim.calibration.profiles import FittedParameter, Profile

    def param(value: float, std: float) -> FittedParameter:
        return FittedParameter(value=value, prior=value, std=std, identifiable=True, bounds=bounds)

    # abstract parameters 'a' and 'b' (the band arithmetic only): built without the
    # checks a profile read from a file gets (its parameters must be capsim's)
    return Profile.model_construct(
        name="t",
        hardware_class="c",
        fitted_from=[],
        parameters={"a": param(4.0, 2.0), "b": param(2.0, b_std)},
        correlation={"a": {"b": rho}} if rho else {},
        log_residual_sd=0.1,
        points=0,
        residuals=[],
    )


def test_uncorrelated_parameters_each_move_by_their_standard_error():
    from capsim.engine.bands import uncertainty_moves

    # a's sd is 50% of its value, b's 25%: a first
    moves = uncertainty_moves(_two_parameter_profile(0.0, b_std=0.5))
    assert moves == [{"a": pytest.approx(6.0), "b": pytest.approx(2.0)}, {"a": 4.0, "b": 2.5}]


def test_parameters_that_trade_off_move_together_along_the_ridge():
    from capsim.engine.bands import uncertainty_moves

    # rho = -1: one direction only, a up by its sd while b goes down by its: covariance
    # [[4, -2], [-2, 1]] has eigenvalues 5 and 0, axis (2, -1)/sqrt(5), step (2, -1)
    (move,) = uncertainty_moves(_two_parameter_profile(-1.0))
    assert move == {"a": pytest.approx(6.0), "b": pytest.approx(1.0)}
    # rho = 0.6: both axes of [[4, 1.2], [1.2, 1]] (two parameters, two axes); each
    # move's log-changes then add in quadrature to J C J^T for any linear figure
    moves = uncertainty_moves(_two_parameter_profile(0.6))
    jac = np.array([0.3, -0.7])  # a figure's log change per unit of a and of b
    cov = np.array([[4.0, 1.2], [1.2, 1.0]])
    variance = sum((jac @ (np.array([m["a"], m["b"]]) - [4.0, 2.0])) ** 2 for m in moves)
    assert variance == pytest.approx(jac @ cov @ jac)


def test_a_move_past_a_bound_goes_the_other_way_or_as_far_as_it_can():
    from capsim.engine.bands import uncertainty_moves

    moves = uncertainty_moves(_two_parameter_profile(0.0, bounds=(0.0, 5.0), b_std=0.5))
    # a = 4 + 2 leaves [0, 5]: it goes down to 2; b = 2 + 0.5 stays
    assert moves == [{"a": pytest.approx(2.0), "b": pytest.approx(2.0)}, {"a": 4.0, "b": 2.5}]


def test_profile_reruns_in_the_sweeps_workers_give_the_bands_of_reruns_in_process():
    """The reruns that propagate a profile's parameter uncertainty run in the sweep's
    worker processes when it has them (engine/reruns.py): the bands must be those of the
    same reruns in this process, and they must widen with the parameters' uncertainty."""
    from capsim.calibration.applied import calibrated_predict

    config = PredictConfig(
        gpu="rtx3090",
        model="qwen3-coder-30b-a3b",
        concurrency=[1, 2, 4, 8, 16, 32, 64],
        requests=120,
    )
    serial = calibrated_predict(config, CAT, workers=1)
    pooled = calibrated_predict(config, CAT, workers=2)
    assert serial.profile is not None and "standard errors" in serial.levels[0].band_source
    for a, b in zip(serial.levels, pooled.levels, strict=True):
        assert a.band_80 == b.band_80 and a.band_50 == b.band_50
    # a profile's band for a figure is wider than its residual spread alone somewhere
    widths = [lv.band_80["output_tok_s"][1] / lv.band_80["output_tok_s"][0] for lv in serial.levels]
    assert max(widths) > min(widths)
