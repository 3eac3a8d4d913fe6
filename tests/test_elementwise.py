"""The layers' elementwise kernels: bytes by hand, and their time in a step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from capsim.catalog.loader import load_catalog
from capsim.physics.deployment import Deployment, default_efficiency
from capsim.physics.elementwise import elementwise_bytes_per_token
from capsim.physics.step import build_step_model

CAT = load_catalog()


def test_dense_layer_bytes_by_hand():
    # llama-3.1-8b: h 4096, 32 query heads and 8 KV heads of 128, FFN 14336, 32 layers.
    # Per layer and token: two add-RMSNorms 8h, rotary on q and k 2(q + k), the cache
    # write's read of k and v 2k, SiLU-and-multiply 3f; 2 bytes an element
    h, q, k, f = 4096, 4096, 1024, 14336
    per_layer = 8 * h + 2 * (q + k) + 2 * k + 3 * f
    assert elementwise_bytes_per_token(CAT.model("llama-3.1-8b"), 1) == 32 * 2 * per_layer
    # TP=8 splits heads and FFN, not the replicated hidden state: q 512, k 128, f 1792
    per_layer_tp8 = 8 * h + 2 * (512 + 128) + 2 * 128 + 3 * 1792
    assert elementwise_bytes_per_token(CAT.model("llama-3.1-8b"), 8) == 32 * 2 * per_layer_tp8


def test_moe_layer_bytes_by_hand():
    # qwen3-coder-30b-a3b: h 2048, 32 / 4 heads of 128, 48 MoE layers of 128 experts, top-8
    # of width 768: the activation on each of the 8 expert slices (3 x 8 x 768) and the sum
    # reading 8 expert outputs and writing one (9h)
    h, q, k = 2048, 4096, 512
    per_layer = 8 * h + 2 * (q + k) + 2 * k + 3 * 8 * 768 + 9 * h
    assert elementwise_bytes_per_token(CAT.model("qwen3-coder-30b-a3b"), 1) == 48 * 2 * per_layer


@given(tp=st.sampled_from([1, 2, 4, 8]))
def test_bytes_shrink_with_tp_but_never_below_the_replicated_norms(tp):
    m = CAT.model("llama-3.3-70b")
    norms = m.num_layers * 8 * m.hidden_size * 2
    here = elementwise_bytes_per_token(m, tp)
    assert norms < here <= elementwise_bytes_per_token(m, 1)


def test_elementwise_time_adds_to_the_prefill_step_at_its_own_bandwidth():
    dep = Deployment(tp=8, quant="bf16")
    base = default_efficiency(CAT.gpu("h200"), CAT)
    sm = build_step_model(CAT, "h200", "llama-3.3-70b", dep, base)
    tokens = np.array([8192])
    bd = sm.step(tokens, np.zeros(1))
    want_bytes = 8192 * elementwise_bytes_per_token(CAT.model("llama-3.3-70b"), 8)
    assert bd.activation_bytes == pytest.approx(want_bytes)
    bw = CAT.gpu("h200").memory_bandwidth_gb_s * 1e9 * base.elementwise_bandwidth_efficiency
    assert bd.t_elementwise == pytest.approx(want_bytes / bw)
    # the kernels cannot hide under the GEMMs' compute: halving their bandwidth adds
    # exactly their time again to the compute-bound step
    slow = build_step_model(
        CAT,
        "h200",
        "llama-3.3-70b",
        dep,
        base.with_overrides(
            {"elementwise_bandwidth_efficiency": base.elementwise_bandwidth_efficiency / 2}
        ),
    )
    assert bd.bound == "compute"
    assert slow.step(tokens, np.zeros(1)).t_total - bd.t_total == pytest.approx(
        bd.t_elementwise, rel=1e-6
    )
    # and the scheduled-step fast path agrees with the term-by-term step
    assert sm.step_time(tokens, np.zeros(1)) == pytest.approx(bd.t_total)
