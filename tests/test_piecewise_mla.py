"""vLLM V1's piecewise CUDA graphs (the default before 0.11) launch every MLA layer's
attention op from the host between the graph pieces: mla_attention_eager_us a layer
(216 us before 0.9, 149 us from it, vLLM PR 17668), overlapping the GPU's work."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capsim.catalog.loader import load_catalog
from capsim.engine.setup import engine_deployment
from capsim.physics.deployment import default_efficiency
from capsim.physics.step import build_step_model

CAT = load_catalog()
DEEPSEEK_LAYERS = 61


def step_model(engine: str, model: str = "deepseek-r1", quant: str = "fp8", tp: int = 8, **dep):
    eng, gpu, m = CAT.engine(engine), CAT.gpu("h100-sxm"), CAT.model(model)
    deployment = engine_deployment(eng, gpu, tp=tp, quant=quant, max_num_seqs=256, **dep)
    return build_step_model(CAT, gpu, m, deployment, default_efficiency(gpu, CAT, eng))


@pytest.mark.parametrize(
    ("release", "us"),
    [
        ("vllm@0.8.0", 216.0),
        ("vllm@0.8.5.post1", 216.0),
        ("vllm@0.9.0", 149.0),
        ("vllm@0.9.2", 149.0),
        ("vllm@0.10.2", 149.0),
        ("vllm@0.11.0", 0.0),  # FULL_AND_PIECEWISE: a decode step replays one full graph
        ("vllm@0.13.0", 0.0),
        ("vllm", 0.0),
        ("vllm@0.7.3", 0.0),  # V0 runs the attention inside its decode graphs
        ("sglang", 0.0),
    ],
)
def test_the_releases_that_launch_mla_attention_outside_the_graphs(release, us):
    sm = step_model(release)
    assert sm.params.mla_attention_eager_us == us
    assert sm.mla_attention_outside_us == pytest.approx(DEEPSEEK_LAYERS * us)


def test_a_graphed_decode_step_launches_61_attention_ops_from_the_host():
    """Hand-computed: 61 x 149 us = 9.089 ms of launches at 0.9, 61 x 216 = 13.176 ms at
    0.8; a step that small on 8x H100 is shorter on the GPU, so the launches set it."""
    for release, launches_s in (("vllm@0.9.2", 9.089e-3), ("vllm@0.8.5", 13.176e-3)):
        sm = step_model(release, quant="awq-int4")
        assert sm.dispatch_seconds(1) == pytest.approx(launches_s, rel=1e-12)
        newer = step_model("vllm@0.11.0", quant="awq-int4")
        assert newer.dispatch_seconds(1) == 0.0
        gpu_and_host = newer.step_time([1], [200])  # no async scheduling in either
        assert gpu_and_host < launches_s
        # the launches overlap the GPU: the step is the longer of the two, plus the host
        host = sm.host_seconds(1)
        assert sm.step_time([1], [200]) == pytest.approx(launches_s + host, rel=1e-9)


def test_a_model_without_mla_and_an_eager_engine_add_nothing():
    dense = step_model("vllm@0.9.2", model="llama-3.1-8b", quant="bf16", tp=1)
    assert dense.mla_attention_outside_us == 0.0
    assert dense.dispatch_seconds(8) == 0.0
    eager = step_model("vllm@0.9.2", enforce_eager=True)
    # without graphs the eager layer's launches (layer_overhead_eager_mla_us) hold it
    assert eager.dispatch_seconds(8) == pytest.approx(
        eager.layers * eager.params.layer_overhead_eager_mla_us * 1e-6
        + eager.allreduces_per_step * eager.params.allreduce_eager_launch_us * 1e-6,
        rel=1e-9,
    )


def test_a_step_above_the_graphs_adds_the_attention_to_the_compiled_launches():
    sm = step_model("vllm@0.9.2")
    tokens = sm.graph_max_tokens + 1
    compiled = sm.layers * sm.params.layer_overhead_compiled_us
    allreduces = sm.allreduces_per_step * sm.params.allreduce_eager_launch_us
    expected = (compiled + allreduces + DEEPSEEK_LAYERS * 149.0) * 1e-6
    assert sm.dispatch_seconds(tokens) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 256),
    context=st.integers(1, 32_768),
    release=st.sampled_from(["vllm@0.8.2", "vllm@0.9.2", "vllm@0.10.1"]),
)
def test_piecewise_releases_never_decode_faster_than_full_graphs(batch, context, release):
    """The piecewise releases differ from 0.11-0.13 only by the launches, which can only
    lengthen a step (both run their host work unhidden)."""
    piecewise, full = step_model(release), step_model("vllm@0.12.0")
    assert piecewise.step_time([1] * batch, [context] * batch) >= full.step_time(
        [1] * batch, [context] * batch
    ) * (1 - 1e-12)
