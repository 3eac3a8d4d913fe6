"""validate's summaries: one sign for optimism whatever the metric (issue 46's bias)."""

import pytest

from capsim.calibration.compare import ComparedPoint, error_summary


def point(metric: str, measured: float, predicted: float) -> ComparedPoint:
    return ComparedPoint("ds", "sc", 1, metric, measured, predicted)


def test_a_time_too_short_and_a_rate_too_high_are_both_optimistic():
    # a TPOT predicted 8 ms against 10 ms measured: the server is predicted 25% faster
    tpot = point("tpot_s", 0.010, 0.008)
    # llama-bench's decode rate predicted 125 tok/s against 100: also 25% faster
    rate = point("decode_tok_s", 100.0, 125.0)
    assert tpot.error == pytest.approx(-0.2)
    assert rate.error == pytest.approx(0.25)
    assert tpot.optimism == pytest.approx(0.25)
    assert rate.optimism == pytest.approx(0.25)
    assert point("ttft_s", 0.5, 1.0).optimism == pytest.approx(-0.5)
    assert point("output_tok_s", 200.0, 150.0).optimism == pytest.approx(-0.25)


def test_a_family_of_times_and_rates_reports_one_optimism():
    # the old median of predicted / measured - 1 over these two read -20% and +25%, whose
    # median (+2.5%) said "balanced" of two points that are both 25% optimistic
    rows = error_summary(
        [point("tpot_s", 0.010, 0.008), point("decode_tok_s", 100.0, 125.0)],
        lambda p: "TPOT",
    )
    (row,) = rows
    assert row["points"] == 2
    assert row["median_optimism_percent"] == pytest.approx(25.0)
    assert row["median_abs_error_percent"] == pytest.approx(22.5)  # |-20%| and |+25%|
    assert row["mape_percent"] == pytest.approx(22.5)
    assert "median_signed_error_percent" not in row
