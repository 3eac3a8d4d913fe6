"""Streaming summaries (capsim/streaming.py, request_columns.RequestSummary): exact counts and
means, percentiles within the stated relative error of the exact ones."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capsim.metrics import Distribution, weighted_percentiles
from capsim.request_columns import RequestSummary, RequestTable
from capsim.streaming import RELATIVE_ERROR, LogSketch

# the bound, with room for the float rounding of a bin's edge
BOUND = RELATIVE_ERROR * (1 + 1e-9) + 1e-12


def within_bound(estimate: float, exact: float) -> bool:
    return abs(estimate - exact) <= BOUND * abs(exact)


def test_hand_computed_percentiles_of_one_to_a_hundred():
    sketch = LogSketch()
    sketch.add(np.arange(1.0, 101.0))
    # numpy: p50 = 50.5, p90 = 90.1, p99 = 99.01 (linear interpolation)
    p50, p90, p99 = sketch.percentiles([50, 90, 99])
    assert within_bound(p50, 50.5) and within_bound(p90, 90.1) and within_bound(p99, 99.01)
    assert sketch.count == 100 and sketch.mean == 50.5
    assert (sketch.minimum, sketch.maximum) == (1.0, 100.0)
    assert sketch.percentiles([0, 100]) == [1.0, 100.0]  # clipped to the exact extremes


def test_constant_values_and_zeros_are_exact():
    sketch = LogSketch()
    sketch.add(np.full(10, 7.0))
    assert sketch.percentiles([50, 90, 99]) == [7.0, 7.0, 7.0]
    zeros = LogSketch()
    zeros.add(np.array([0.0, 0.0, 0.0, 5.0]))
    assert zeros.percentiles([50]) == [0.0]  # between the 2nd and 3rd zero


def test_weighted_percentiles_hand_computed():
    sketch = LogSketch(weighted=True)
    sketch.add(np.array([1.0, 10.0]), np.array([3.0, 1.0]))
    # inverted CDF: half the weight (2 of 4) is reached at 1, 90% (3.6) at 10
    assert sketch.percentiles([50, 90]) == [1.0, 10.0]
    assert sketch.mean == pytest.approx(13 / 4, rel=1e-15)
    assert Distribution.of_sketch(sketch).count == 4


def test_known_distribution_and_batches_and_merging():
    rng = np.random.default_rng(3)
    values = rng.lognormal(0.0, 1.5, 200_001)
    whole, merged = LogSketch(), LogSketch()
    for part in np.array_split(values, 7):
        whole.add(part)
        other = LogSketch()
        other.add(part)
        merged.merge(other)
    exact = np.percentile(values, [50, 90, 99])
    for sketch in (whole, merged):
        estimates = sketch.percentiles([50, 90, 99])
        assert all(within_bound(e, x) for e, x in zip(estimates, exact, strict=True))
        assert sketch.mean == pytest.approx(values.mean(), rel=1e-12)
        assert sketch.count == values.size
    assert whole.percentiles([50, 90, 99]) == merged.percentiles([50, 90, 99])
    # the median of a lognormal(0, s) is 1
    assert abs(whole.percentiles([50])[0] - 1.0) < 0.02


def test_negative_values_are_binned_by_magnitude():
    values = np.array([-8.0, -2.0, 0.0, 3.0, 9.0])
    sketch = LogSketch()
    sketch.add(values)
    for q, exact in zip([10, 50, 75], np.percentile(values, [10, 50, 75]), strict=True):
        assert within_bound(sketch.percentiles([q])[0], exact)


positive = st.floats(1e-6, 1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.one_of(positive, st.just(0.0)), min_size=1, max_size=300),
    qs=st.lists(st.floats(0, 100), min_size=1, max_size=5),
    batches=st.integers(1, 4),
)
def test_unweighted_streaming_agrees_with_numpy_within_the_bound(values, qs, batches):
    arr = np.array(values)
    sketch = LogSketch()
    for part in np.array_split(arr, batches):
        sketch.add(part)
    exact = np.percentile(arr, qs)
    estimates = sketch.percentiles(qs)
    assert all(within_bound(e, x) for e, x in zip(estimates, exact, strict=True))
    assert sketch.mean == pytest.approx(arr.mean(), rel=1e-12, abs=1e-300)


@settings(max_examples=200, deadline=None)
@given(
    pairs=st.lists(st.tuples(positive, st.integers(1, 64)), min_size=1, max_size=300),
    qs=st.lists(st.floats(0, 100), min_size=1, max_size=5),
)
def test_weighted_streaming_agrees_with_the_exact_path_within_the_bound(pairs, qs):
    values = np.array([v for v, _ in pairs])
    weights = np.array([float(w) for _, w in pairs])
    sketch = LogSketch(weighted=True)
    sketch.add(values, weights)
    exact = weighted_percentiles(values, weights, qs)
    estimates = sketch.percentiles(qs)
    assert all(within_bound(e, x) for e, x in zip(estimates, exact, strict=True))
    exact_dist, folded = Distribution.of(values, weights), Distribution.of_sketch(sketch)
    assert folded.count == exact_dist.count
    assert folded.mean == pytest.approx(exact_dist.mean, rel=1e-12)


def test_request_summary_matches_the_table_it_folds():
    rng = np.random.default_rng(0)
    n = 5_000
    send = rng.uniform(0, 100, n)
    first = send + rng.uniform(0.01, 2, n)
    finish = first + rng.uniform(0.5, 30, n)
    outputs = rng.integers(1, 500, n)
    ok = rng.random(n) > 0.05
    table = RequestTable(send, first, finish, rng.integers(10, 900, n), outputs, send, ok)
    summary = RequestSummary()
    for part in np.array_split(np.arange(n), 9):
        summary.add(RequestTable(*(getattr(table, c)[part] for c in RequestTable._COLUMNS)))
    assert (summary.requests, summary.completed) == (n, int(ok.sum()))
    assert summary.input_tokens == int(table.input_tokens[ok].sum())
    assert summary.output_tokens == int(table.output_tokens[ok].sum())
    assert summary.first_send == send.min() and summary.last_finish == finish[ok].max()
    for name in ("ttft", "tpot", "e2e", "queueing", "output_tok_s"):
        exact = Distribution.of(getattr(table, name)())
        folded = Distribution.of_sketch(getattr(summary, name))
        assert folded.count == exact.count
        assert folded.mean == pytest.approx(exact.mean, rel=1e-12, abs=1e-15)
        for q in ("p50", "p90", "p99"):
            assert within_bound(getattr(folded, q), getattr(exact, q)) or getattr(exact, q) == 0
