"""Workload length distributions: parsing, quantiles and stratified draws."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capsim.engine.lengths import Z_999, parse_length
from capsim.errors import CapsimUserError


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 400), seed=st.integers(0, 10_000))
def test_stratified_draws_take_one_value_per_slice(n, seed):
    """n draws of uniform:0,1 put exactly one value in each of n equal slices."""
    draws = parse_length("uniform:0,1").sample(np.random.default_rng(seed), n)
    slices = np.floor(np.sort(draws) * n).astype(int)
    assert slices.tolist() == list(range(n))


def test_draws_follow_the_distribution():
    rng = np.random.default_rng(0)
    logn = parse_length("lognormal:500,0.4").sample(rng, 4001)
    assert np.median(logn) == pytest.approx(500, rel=0.01)
    assert np.std(np.log(logn)) == pytest.approx(0.4, rel=0.03)
    assert logn.max() <= 500 * np.exp(Z_999 * 0.4) + 1e-9
    normal = parse_length("normal:300,50").sample(rng, (40, 50))
    assert normal.shape == (40, 50)
    assert normal.mean() == pytest.approx(300, abs=1.0)
    assert normal.std() == pytest.approx(50, rel=0.03)
    assert parse_length("512").sample(rng, 3).tolist() == [512, 512, 512]


def test_quantiles_by_hand():
    assert parse_length("uniform:100,300").quantile(np.array([0, 0.25, 1])).tolist() == [
        100,
        150,
        300,
    ]
    assert parse_length("lognormal:800,0.5").quantile(np.array([0.5]))[0] == pytest.approx(800)
    assert parse_length("normal:10,2").quantile(np.array([0.5]))[0] == pytest.approx(10)


def test_same_seed_same_draws_and_the_seed_matters():
    spec = parse_length("lognormal:1000,0.6")
    a = spec.tokens(np.random.default_rng(7), 64)
    b = spec.tokens(np.random.default_rng(7), 64)
    c = spec.tokens(np.random.default_rng(8), 64)
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()
    assert a.min() >= 1


def test_empirical_draws_resample_the_list(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("40\n10\n30\n20\n")
    spec = parse_length(f"file:{path}")
    draws = spec.tokens(np.random.default_rng(3), 8)
    assert sorted(draws.tolist()) == [10, 10, 20, 20, 30, 30, 40, 40]


def test_a_large_lengths_file_is_kept_as_its_order_statistics(tmp_path):
    """Four million values were copied to every configuration a plan built and re-read at
    each check (300 s); they are kept as MAX_KEPT_VALUES order statistics, read once, and
    draw as the whole file does."""
    from capsim.engine.lengths import MAX_KEPT_VALUES

    rng = np.random.default_rng(3)
    values = rng.integers(1, 4000, size=300_000)
    path = tmp_path / "many.txt"
    path.write_text("\n".join(map(str, values)))
    spec = parse_length(f"file:{path}", "--input-tokens", minimum=1)
    assert len(spec.values) == MAX_KEPT_VALUES
    assert spec.mean == pytest.approx(values.mean(), rel=1e-3)
    assert spec.maximum <= values.max() and spec.values[0] >= values.min()
    draws = spec.tokens(np.random.default_rng(0), 20_000)
    for q in (0.1, 0.5, 0.9, 0.99):
        assert np.quantile(draws, q) == pytest.approx(np.quantile(values, q), rel=0.02)
    from capsim.engine.lengths import _file_values

    hits = _file_values.cache_info().hits
    again = parse_length(f"file:{path}", "--input-tokens", minimum=1)
    assert again.values == spec.values and _file_values.cache_info().hits == hits + 1
    path.write_text("7\n8")  # a new version of the file is read again
    assert parse_length(f"file:{path}", "--input-tokens", minimum=1).values == (7.0, 8.0)


@pytest.mark.parametrize("text", ["1e3", "1000.0", "+1000", "1_000", "１０００"])
def test_a_token_count_is_written_in_digits(text):
    """'--input-tokens 1e3' ran as 1000; vLLM's --random-input-len (an int) refuses it."""
    # '1_000' and full-width digits are refused before they are read as numbers at all
    with pytest.raises(CapsimUserError, match=r"in digits|an '_' in it|a character outside 0-9"):
        parse_length(text, "--input-tokens")


def test_a_number_given_as_a_number_is_read_and_a_think_time_may_be_fractional():
    assert parse_length(1000.0).a == 1000 and parse_length(1000).a == 1000
    assert parse_length("2.5", whole=False).a == 2.5
    assert parse_length("uniform:1e3,2e3").b == 2000  # a distribution's numbers are floats


def test_a_uniform_range_of_tokens_has_whole_ends_and_a_think_time_need_not():
    """'uniform:1.5,2.5' drew 2 tokens every time (issue 47's fuzzing)."""
    with pytest.raises(CapsimUserError, match="whole-number ends"):
        parse_length("uniform:1.5,2.5", "--input-tokens")
    with pytest.raises(CapsimUserError, match="whole-number ends"):
        parse_length("uniform:10,20.5", "--output-tokens")
    assert parse_length("uniform:0.1,1", whole=False).b == 1.0
    assert parse_length("lognormal:198.5,0.652").a == 198.5  # a centre, not a draw


def test_the_python_api_takes_token_counts_as_numbers():
    from capsim.engine.config import PredictConfig

    config = PredictConfig(
        gpu="rtx3090", model="llama-3.1-8b", input_tokens=1000, think_time=0.5, tool_tokens=64
    )
    assert (config.input_tokens, config.think_time, config.tool_tokens) == ("1000", "0.5", "64")
    with pytest.raises(CapsimUserError, match="whole number"):
        PredictConfig(gpu="rtx3090", model="llama-3.1-8b", output_tokens=2.5)
