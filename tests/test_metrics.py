"""The columnar metrics (RequestTable) agree with the per-record definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capsim.metrics import Distribution, RequestRecord, level_metrics
from capsim.request_columns import RequestTable

times = st.floats(0, 100, allow_nan=False, allow_subnormal=False)


@st.composite
def records(draw):
    out = []
    for i in range(draw(st.integers(0, 12))):
        send = draw(times)
        first = draw(st.one_of(st.none(), times.map(lambda d, s=send: s + d)))
        finish = None if first is None else draw(st.one_of(st.none(), times.map(first.__add__)))
        # scheduled after its send and by its first token (RequestRecord refuses another)
        latest = first if first is not None else send + 100
        scheduled = draw(
            st.one_of(st.none(), st.floats(0, 1).map(lambda f, s=send, e=latest: s + f * (e - s)))
        )
        out.append(
            RequestRecord(
                request_id=str(i),
                send=send,
                first_token=first,
                finish=finish,
                input_tokens=draw(st.integers(0, 5000)),
                output_tokens=draw(st.integers(0, 3000)),
                first_scheduled=scheduled,
                error=draw(st.sampled_from([None, None, "boom"])),
            )
        )
    return out


def per_record(records, prop):
    return Distribution.of(getattr(r, prop) for r in records if r.ok)


def same(a: Distribution, b: Distribution) -> None:
    assert a.count == b.count
    for f in ("mean", "p50", "p90", "p99"):
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None) == (y is None)
        if x is not None:
            assert x == pytest.approx(y, rel=1e-12, abs=1e-12, nan_ok=True)


@settings(max_examples=100, deadline=None)
@given(records())
def test_table_metrics_equal_record_properties(recs):
    table = RequestTable.from_records(recs)
    same(Distribution.of(table.ttft()), per_record(recs, "ttft"))
    same(Distribution.of(table.e2e()), per_record(recs, "e2e"))
    same(Distribution.of(table.tpot()), per_record(recs, "tpot"))
    same(Distribution.of(table.queueing()), per_record(recs, "queueing"))
    same(Distribution.of(table.output_tok_s()), per_record(recs, "output_tok_s"))
    m = level_metrics(recs)
    done = [r for r in recs if r.ok]
    assert m.completed == len(done) and m.failed == len(recs) - len(done)
    assert m.output_tokens == sum(r.output_tokens for r in done)
    if done:
        wall = max(max(r.finish for r in done) - min(r.send for r in recs), 1e-12)
        assert m.wall_s == pytest.approx(wall)
        assert m.output_tok_s == pytest.approx(m.output_tokens / wall)


def test_level_metrics_by_hand():
    recs = [
        RequestRecord(request_id="a", send=0, first_token=1, finish=3, output_tokens=5),
        RequestRecord(request_id="b", send=1, first_token=2, finish=6, output_tokens=11),
        RequestRecord(request_id="c", send=2, error="timeout"),
    ]
    m = level_metrics(recs)
    assert m.wall_s == 6 and m.output_tokens == 16 and m.output_tok_s == pytest.approx(16 / 6)
    assert m.ttft_ms.mean == pytest.approx(1000)
    assert m.tpot_ms.p50 == pytest.approx((0.5 + 0.4) / 2 * 1000)
    assert m.e2e_s.mean == pytest.approx(4)
    assert m.completed == 2 and m.failed == 1
    assert math.isclose(m.per_request_output_tok_s.mean, (5 / 3 + 11 / 5) / 2)


def test_a_table_needs_given_itl():
    table = RequestTable.from_rows([(0.0, 1.0, 2.0, 10, 3, None, True)])
    with pytest.raises(ValueError, match="itl_values"):
        level_metrics(table)
    m = level_metrics(table, itl_values=np.array([0.5]), itl_weights=np.array([2.0]))
    assert m.itl_ms.mean == pytest.approx(500) and m.tpot_ms.mean == pytest.approx(500)
