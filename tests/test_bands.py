"""Uncalibrated bands: corpus errors per hardware class and metric family."""

from __future__ import annotations

import numpy as np
import pytest

from capsim.calibration.bands import MIN_POINTS, POOLED, build_band_table, load_band_table
from capsim.calibration.compare import ComparedPoint
from capsim.catalog.loader import load_catalog
from capsim.engine.bands import BAND_FIGURES
from capsim.engine.simulate import PredictConfig, predict

CAT = load_catalog()


def point(gpu, metric, measured, predicted, scored=True):
    return ComparedPoint("ds", "sc", 1, metric, measured, predicted, gpu, "vllm", "mean", scored)


def test_bands_are_percentiles_of_measured_over_predicted_by_hand():
    ratios = np.linspace(0.5, 1.5, MIN_POINTS)
    pts = [point("h100-sxm", "output_tok_s", 100 * r, 100.0) for r in ratios]
    pts += [point("rtx4090", "tpot_s", 1.0, 1.0)]  # one point: too few for its own band
    pts += [point("h100-sxm", "output_tok_s", 1.0, 100.0, scored=False)]  # reference only
    table = build_band_table(pts, {"h100-sxm": "datacenter-hopper", "rtx4090": "consumer-ada"})
    band, pooled = table.band("datacenter-hopper", "throughput")
    assert not pooled and band.points == MIN_POINTS
    assert band.low == pytest.approx(np.percentile(ratios, 10))
    assert band.high == pytest.approx(np.percentile(ratios, 90))
    band, pooled = table.band("consumer-ada", "TPOT")
    assert pooled and band == table.bands[POOLED]["TPOT"]


def test_a_decode_rate_counts_as_tpot_inverted():
    # predicted 50 tok/s per request, measured 100: TPOT was predicted twice too long
    pts = [point("h100-sxm", "decode_tok_s", 100.0, 50.0)]
    table = build_band_table(pts, {"h100-sxm": "datacenter-hopper"})
    assert table.bands[POOLED]["TPOT"].low == pytest.approx(0.5)


def test_every_figure_of_an_uncalibrated_prediction_has_a_band():
    assert load_band_table() is not None  # shipped in calibration/bands/
    config = PredictConfig(gpu="h100-sxm", model="llama-3.1-8b", concurrency=[4], requests=16)
    (level,) = predict(config, CAT).levels
    assert set(level.band_80) == set(BAND_FIGURES)
    for lo, hi in level.band_80.values():
        assert 0 < lo < hi
    assert "corpus" in level.band_source
