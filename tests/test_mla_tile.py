"""The MLA decode kernel's row tile (work_counts.mla_decode_padding): FlashMLA runs a
sequence's query rows (heads a GPU x tokens decoded) in 64-row tiles on Hopper, a partly
empty tile at the cost of a full one."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from capsim.catalog.loader import load_catalog
from capsim.physics.deployment import Deployment, default_efficiency
from capsim.physics.speculative import parse_spec
from capsim.physics.step import build_step_model
from capsim.physics.work_counts import mla_decode_padding

CAT = load_catalog()


def sm(gpu="h200", tp=8, **dep):
    g = CAT.gpu(gpu)
    p = default_efficiency(g, CAT, CAT.engine("sglang"))
    return build_step_model(
        CAT, g, "deepseek-v3", Deployment(engine="sglang", tp=tp, quant="fp8", **dep), p
    )


@pytest.mark.parametrize(
    ("heads_tp", "rows_per_head", "padding"),
    [(8, 1, 4.0), (8, 2, 2.0), (8, 4, 1.0), (4, 1, 2.0), (1, 1, 1.0), (2, 1, 1.0)],
)
def test_deepseeks_heads_fill_the_tile_by_hand(heads_tp, rows_per_head, padding):
    """128 heads: 16 a GPU at TP 8 fill a quarter of a 64-row tile; two decoded tokens
    (MTP-1) half; TP 4's 32 heads half; TP 1's 128 two whole tiles."""
    model = CAT.model("deepseek-v3")
    assert mla_decode_padding(model, heads_tp, rows_per_head, 64) == padding


def test_no_tile_for_other_models_or_classes():
    assert mla_decode_padding(CAT.model("qwen3-8b"), 8, 1, 64) == 1.0
    assert mla_decode_padding(CAT.model("deepseek-v3"), 8, 1, 1) == 1.0
    assert sm("b200").mla_decode_padding == 1.0  # the class sets no tile
    assert sm("h200").params.mla_decode_row_tile == 64


def test_tp8_decode_attention_runs_four_times_the_flops_prefill_keeps_its_own():
    padded = sm()
    plain = build_step_model(
        CAT,
        CAT.gpu("h200"),
        "deepseek-v3",
        padded.deployment,
        padded.params.with_overrides({"mla_decode_row_tile": 1}),
    )
    assert padded.mla_decode_padding == 4.0 and plain.mla_decode_padding == 1.0
    contexts = np.full(64, 2000)
    a, b = padded.decode_step(contexts)[0], plain.decode_step(contexts)[0]
    assert a.attention_flops == pytest.approx(4 * b.attention_flops)
    assert a.t_attention_memory == b.t_attention_memory
    chunk = (np.array([4096]), np.array([8000]))
    pa, pb = padded.step(*chunk), plain.step(*chunk)
    assert pa.attention_flops == pytest.approx(pb.attention_flops)
    assert pa.t_total == pytest.approx(pb.t_total)


def test_data_parallel_attention_fills_the_tile():
    """DP 8 attention keeps all 128 heads on each GPU: no padding."""
    assert sm(dp_attention=8).mla_decode_padding == 1.0


def test_mtp_verify_rows_count_each_drafted_token():
    spec = parse_spec("mtp:1", "0.7")
    assert sm(spec=spec).mla_decode_padding == 2.0


def test_the_throttled_h20_is_bound_by_the_padded_attention():
    """On the H20 the tile's wasted FLOPs bind: at 64 sequences of 2,000 tokens the
    attention's compute time passes its cache read several times over; on the H200 they
    stay within 1.5x of it."""
    contexts = np.full(64, 2000)
    h20 = sm("h20").decode_step(contexts)[0]
    h200 = sm("h200").decode_step(contexts)[0]
    assert h20.t_attention_compute > 3 * h20.t_attention_memory
    assert h200.t_attention_compute < 1.5 * h200.t_attention_memory


@given(
    heads=st.integers(min_value=1, max_value=512),
    rows=st.integers(min_value=1, max_value=8),
    tile=st.integers(min_value=1, max_value=256),
)
def test_padding_is_at_least_one_and_below_a_tile(heads, rows, tile):
    model = CAT.model("deepseek-v3").model_copy(update={"num_attention_heads": heads})
    pad = mla_decode_padding(model, 1, rows, tile)
    assert 1.0 <= pad < tile + 1e-9
    assert pad * heads * rows == pytest.approx(-(-heads * rows // tile) * tile)
