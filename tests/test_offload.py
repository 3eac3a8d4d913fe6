"""Routed experts kept in system RAM (issue 49 item 5: llama.cpp's --n-cpu-moe): memory,
the step's offload term on each of llama.cpp's two paths, and the flags."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from capsim.catalog.loader import load_catalog
from capsim.cli.main import app
from capsim.engine.setup import engine_fit_options
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
    # streamed at host_read_efficiency (llama.cpp issue 26484: 84-91%) of the bandwidth given
    expected = 26 * touched * sm.expert_slice_bytes / (50e9 * sm.params.host_read_efficiency)
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
        (["--host-memory-bandwidth", "60"], "applies to --n-cpu-moe"),
    ],
)
def test_offload_flags_that_cannot_work_exit_2(args, words):
    base = ["predict", "--gpu", "rtx3090", "--model", "gpt-oss-120b", "-c", "1"]
    r = runner.invoke(app, [*base, "--requests", "2", "--output-tokens", "8", *args])
    assert r.exit_code == 2 and words in r.output, r.output


def test_fit_proposes_the_offload_configurations_that_fit_with_their_speed():
    """Issue 49: a MoE model too large for the GPU is answered with the llama.cpp
    configurations that fit (exit 0), each with one request's decode speed at the
    catalog's measured hosts and the user's own, and the command that simulates it."""
    r = runner.invoke(app, [*FIT, "--host-memory-bandwidth", "80"], terminal_width=120)
    assert r.exit_code == 0, r.output
    assert "does not fit on 1x rtx3090 alone" in r.output
    for host in CAT.hosts:
        assert host.display_name in r.output and f"{host.read_bandwidth_gbs:g} GB/s" in r.output
    assert "yours (80 GB/s)" in r.output and "24 of 36" in r.output and "36 of 36" in r.output
    assert "--engine llama.cpp --n-cpu-moe 24 --host-memory-bandwidth 80" in r.output
    # and that proposal does fit
    r = runner.invoke(
        app,
        [*FIT, "--quant", "gguf-mxfp4", "--engine", "llama.cpp", "--n-cpu-moe", "24"],
    )
    assert r.exit_code == 0 and "FITS" in r.output, r.output


def test_the_fewest_offloaded_layers_are_the_fewest_that_fit_and_speeds_order():
    from capsim.planner.offload import USER_HOST, propose_offload

    g, m, fmt = CAT.gpu("rtx3090"), CAT.model("gpt-oss-120b"), CAT.quant("mxfp4")
    proposal = propose_offload(CAT, g, m, fmt, 1, {}, host_memory_bandwidth=40.0)
    assert proposal is not None and proposal.quant == "gguf-mxfp4"
    fewest = proposal.fewest.n_cpu_moe
    gguf = CAT.quant("gguf-mxfp4")
    llama = engine_fit_options(CAT.engine("llama.cpp"), g)  # llama.cpp's own memory rules
    assert memory_fit(g, m, gguf, **{**llama, "cpu_moe_layers": fewest}).fits
    assert not memory_fit(g, m, gguf, **{**llama, "cpu_moe_layers": fewest - 1}).fits
    layers = parameter_breakdown(m).moe_layers
    assert [o.n_cpu_moe for o in proposal.options] == [fewest, (fewest + layers + 1) // 2, layers]
    hosts = sorted(proposal.hosts, key=proposal.hosts.get)
    assert hosts[0] == USER_HOST  # 40 GB/s, below every reference host
    for option in proposal.options:
        speeds = [option.decode_tok_s[h] for h in hosts]
        assert speeds == sorted(speeds) and speeds[0] < speeds[-1]  # more bandwidth, faster
        assert option.context_tokens == min(4096, option.kv_capacity_tokens)
    for host in hosts:  # more layers in system RAM: slower, and more room for KV
        speeds = [o.decode_tok_s[host] for o in proposal.options]
        assert speeds == sorted(speeds, reverse=True)
    kv = [o.kv_capacity_tokens for o in proposal.options]
    assert kv == sorted(kv) and kv[0] < kv[-1]


def test_fit_json_carries_the_offload_options_and_a_dense_model_still_exits_2():
    import json

    r = runner.invoke(app, [*FIT, "--json"])
    assert r.exit_code == 0, r.output
    proposal = json.loads(r.stdout)["offload_proposal"]
    assert proposal["options"][0]["n_cpu_moe"] == 24
    assert set(proposal["options"][0]["decode_tok_s"]) == {h.name for h in CAT.hosts}
    r = runner.invoke(app, ["fit", "--gpu", "rtx3060-12g", "--model", "llama-3.3-70b"])
    assert r.exit_code == 2 and "does not fit" in r.output, r.output


def test_a_host_entry_without_a_measured_bandwidth_and_source_is_refused(tmp_path):
    (tmp_path / "hosts").mkdir()
    (tmp_path / "hosts" / "guess.yaml").write_text(
        "name: guess\ndisplay_name: Guess\nmemory: DDR5\nread_bandwidth_gbs: -1\n"
        "measured_with: nothing\nsources: []\n"
    )
    r = runner.invoke(app, ["--db", str(tmp_path), *FIT])
    assert r.exit_code == 2 and "read_bandwidth_gbs" in r.output and "Traceback" not in r.output


def test_every_reference_host_is_a_measurement_with_its_quote():
    assert len(CAT.hosts) >= 3
    for host in CAT.hosts:
        assert host.sources and all(s.quote and s.url for s in host.sources), host.name
        assert f"{host.read_bandwidth_gbs:g}" in " ".join(s.quote for s in host.sources) or (
            f"{host.read_bandwidth_gbs:g}GB/s" in " ".join(s.quote for s in host.sources)
        ), host.name


@pytest.mark.parametrize("gpu", ["gb10", "ryzen-ai-max-395", "apple-m3-ultra"])
def test_offload_on_a_unified_memory_part_exits_2(gpu):
    """Issue 49: the CPU and the GPU share one memory, so there is no system RAM apart to
    keep experts in: refused naming the part, and fit proposes no offload there."""
    from capsim.planner.offload import propose_offload

    args = ["--model", "gpt-oss-120b", "--engine", "llama.cpp", "--n-cpu-moe", "4"]
    r = runner.invoke(
        app, ["predict", "--gpu", gpu, *args, "--host-memory-bandwidth", "60", "-c", "1"]
    )
    assert r.exit_code == 2 and "shares one memory" in r.output and gpu in r.output, r.output
    assert "Traceback" not in r.output
    g, m = CAT.gpu(gpu), CAT.model("gpt-oss-120b")
    assert propose_offload(CAT, g, m, CAT.quant("mxfp4"), 1, {}) is None


def test_without_quant_offload_uses_a_4_bit_gguf_and_only_where_no_format_fits():
    """A release in BF16 is offloaded as llama.cpp users run it (Q4_K_M), not as 186 GiB
    of BF16 experts; where a smaller format fits the GPU whole, that is the answer."""
    r = runner.invoke(app, ["fit", "--gpu", "rtx3090", "--model", "glm-4.5-air"])
    assert r.exit_code == 0 and "llama.cpp (gguf-q4_k_m)" in r.output, r.output
    r = runner.invoke(app, ["fit", "--gpu", "rtx3090", "--model", "qwen3-coder-30b-a3b"])
    assert r.exit_code == 2 and "these formats fit" in r.output and "n-cpu-moe" not in r.output
    # a format the user names is offloaded as named
    args = ["fit", "--gpu", "rtx3090", "--model", "qwen3-coder-30b-a3b", "--quant", "bf16"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0 and "llama.cpp (bf16)" in r.output, r.output


def test_capacity_and_serve_take_the_offload_flags():
    """Issue 49: every command takes the engines' flags. capacity answers an offloaded
    deployment and names the experts in system RAM as what binds it; serve takes the
    flags, with predict's refusals."""
    args = ["--gpu", "rtx3090", "--model", "gpt-oss-120b", "--engine", "llamacpp"]
    offload = ["--n-cpu-moe", "30", "--host-memory-bandwidth", "60"]
    r = runner.invoke(
        app, ["capacity", *args, *offload, "--min-agent-tok-s", "5", "--output-tokens", "64"]
    )
    assert r.exit_code == 0, r.output
    assert "system RAM" in r.output
    r = runner.invoke(app, ["capacity", *args, "--n-cpu-moe", "30", "--min-agent-tok-s", "5"])
    assert r.exit_code == 2 and "--host-memory-bandwidth" in r.output
    r = runner.invoke(app, ["serve", *args, "--n-cpu-moe", "30"])
    assert r.exit_code == 2 and "--host-memory-bandwidth" in r.output


def test_vllms_cpu_offload_keeps_weights_in_system_ram_and_reads_them_every_pass():
    """--cpu-offload-gb 8 (vLLM, SGLang): 8 GiB of Qwen3-14B's BF16 weights leave the RTX
    3090, so the model fits (it does not without), and every decode step reads that share
    of what it reads of the weights over PCIe 4.0 x16 at host_link_efficiency: about 8 GiB
    / 25.2 GB/s (the embedding table, which a step hardly reads, holds some of the share)."""
    from capsim.engine.config import PredictConfig
    from capsim.engine.setup import build_setup

    g, m, fmt = CAT.gpu("rtx3090"), CAT.model("qwen3-14b"), CAT.quant("bf16")
    assert not memory_fit(g, m, fmt).fits
    fit = memory_fit(g, m, fmt, cpu_offload_gb=8)
    assert fit.fits and fit.weights_in_system_ram_bytes == 8 * 2**30
    assert fit.weight_bytes == pytest.approx(memory_fit(g, m, fmt).weight_bytes - 8 * 2**30)
    setup = build_setup(
        PredictConfig(gpu="rtx3090", model="qwen3-14b", quant="bf16", cpu_offload_gb=8), CAT
    )
    sm = setup.step_model
    link = g.interconnect("pcie").bandwidth_gb_s_per_direction * 1e9
    link *= sm.params.host_link_efficiency
    assert sm.weights_in_host_seconds(1e9) == pytest.approx(
        1e9 * sm.deployment.weights_in_host_share / link
    )
    step = sm.step([1], [1024])
    assert 0.9 * 8 * 2**30 / link <= step.t_offload <= 8 * 2**30 / link
    assert step.t_total > step.t_offload


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (dict(engine="llama.cpp", model="qwen3-8b"), "--cpu-offload-gb is vLLM's and SGLang's"),
        (dict(gpu="gb10", model="qwen3-8b"), "shares one memory between its CPU and GPU"),
    ],
)
def test_cpu_offload_where_it_cannot_apply_is_refused(extra, message):
    from capsim.engine.config import PredictConfig
    from capsim.engine.setup import build_setup

    config = PredictConfig(**{"gpu": "rtx3090", "model": "qwen3-14b", **extra}, cpu_offload_gb=4)
    with pytest.raises(CapsimUserError, match=message):
        build_setup(config, CAT)
