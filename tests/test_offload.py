"""Routed experts kept in system RAM (issue 49 item 5: llama.cpp's --n-cpu-moe): memory,
the step's offload term on each of llama.cpp's two paths, and the flags."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from capsim.catalog.loader import load_catalog
from capsim.cli.main import app
from capsim.errors import CapsimUserError
from capsim.physics.deployment import Deployment
from capsim.physics.memory import memory_fit
from capsim.physics.offload_terms import OP_OFFLOAD_MIN_BATCH
from capsim.physics.parameters import parameter_breakdown
from capsim.physics.step import build_step_model

CAT = load_catalog()
runner = CliRunner()
FIT = ["fit", "--gpu", "rtx3090", "--model", "gpt-oss-120b"]


def offloaded(n: int, host: float = 60.0, **extra):
    dep = Deployment(
        quant="gguf-mxfp4",
        engine="llama.cpp",
        cpu_moe_layers=n,
        host_memory_bandwidth_gbs=host,
        ubatch_tokens=512,
        cuda_graphs=False,
        **extra,
    )
    return build_step_model(CAT, "rtx3090", "gpt-oss-120b", dep)


def test_the_offloaded_layers_experts_leave_gpu_memory():
    g, m, fmt = CAT.gpu("rtx3090"), CAT.model("gpt-oss-120b"), CAT.quant("gguf-mxfp4")
    base = memory_fit(g, m, fmt)
    fit = memory_fit(g, m, fmt, cpu_moe_layers=9)
    b = parameter_breakdown(m)
    routed = b.routed_experts * fmt.bits_per_weight / 8
    assert base.weight_bytes - fit.weight_bytes == pytest.approx(
        routed * 9 / b.moe_layers, rel=0.02
    )
    assert fit.experts_in_system_ram_bytes == pytest.approx(base.weight_bytes - fit.weight_bytes)
    with pytest.raises(CapsimUserError, match="no routed experts"):
        memory_fit(g, CAT.model("llama-3.1-8b"), CAT.quant("bf16"), cpu_moe_layers=4)


def test_a_small_pass_streams_the_touched_experts_from_system_ram():
    sm = offloaded(26, host=50.0)
    step = sm.step([1], [512])
    touched = sm.experts_touched_scalar(1.0)  # 4 of 128 for one token
    assert touched == pytest.approx(4.0)
    expected = 26 * touched * sm.expert_slice_bytes / 50e9
    assert step.t_offload == pytest.approx(expected) and step.offload_path == "cpu"
    # the GPU reads only the other ten layers' experts
    gpu_only = offloaded(0)
    assert step.expert_bytes == pytest.approx(gpu_only.step([1], [512]).expert_bytes * 10 / 36)


def test_a_prompt_ubatch_copies_the_touched_experts_over_the_host_link():
    sm = offloaded(26)
    step = sm.step([512], [0])
    link = CAT.gpu("rtx3090").interconnect("pcie").bandwidth_gb_s_per_direction * 1e9
    copy = 26 * sm.experts_touched_scalar(512.0) * sm.expert_slice_bytes
    assert step.offload_path == "copy"
    assert step.t_offload == pytest.approx(copy / (link * sm.params.host_link_efficiency))
    # and the GPU multiplies every layer's experts itself
    assert step.expert_bytes == pytest.approx(offloaded(0).step([512], [0]).expert_bytes)
    assert sm.offload_path(OP_OFFLOAD_MIN_BATCH - 1) == "cpu"
    assert sm.offload_path(OP_OFFLOAD_MIN_BATCH) == "copy"


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 36),
    tokens=st.integers(1, 2048),
    low=st.floats(5.0, 200.0),
    factor=st.floats(1.0, 4.0),
)
def test_more_system_ram_bandwidth_or_fewer_offloaded_layers_never_slow_a_step(
    n, tokens, low, factor
):
    slow, fast = offloaded(n, host=low), offloaded(n, host=low * factor)
    assert fast.step_time([tokens], [0]) <= slow.step_time([tokens], [0]) * (1 + 1e-12)
    fewer = offloaded(n - 1, host=low)
    assert fewer.step_time([tokens], [0]) <= slow.step_time([tokens], [0]) * (1 + 1e-12)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--n-cpu-moe", "4"], "--n-cpu-moe is llama.cpp's"),
        (
            ["--engine", "llama.cpp", "--quant", "gguf-mxfp4", "--n-cpu-moe", "30"],
            "needs --host-memory-bandwidth",
        ),
        (["--host-memory-bandwidth", "60"], "apply to --n-cpu-moe"),
    ],
)
def test_offload_flags_that_cannot_work_exit_2(args, words):
    base = ["predict", "--gpu", "rtx3090", "--model", "gpt-oss-120b", "-c", "1"]
    r = runner.invoke(app, [*base, "--requests", "2", "--output-tokens", "8", *args])
    assert r.exit_code == 2 and words in r.output, r.output


def test_fit_proposes_the_fewest_offloaded_layers_that_fit_with_their_speed():
    r = runner.invoke(
        app, ["fit", "--gpu", "rtx3090", "--model", "gpt-oss-120b", "--host-memory-bandwidth", "60"]
    )
    assert r.exit_code == 2
    assert "--engine llama.cpp --n-cpu-moe 24" in r.output and "tok/s for one request" in r.output
    # and that proposal does fit
    r = runner.invoke(
        app,
        [*FIT, "--quant", "gguf-mxfp4", "--engine", "llama.cpp", "--n-cpu-moe", "24"],
    )
    assert r.exit_code == 0 and "FITS" in r.output, r.output
