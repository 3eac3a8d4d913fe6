"""Expert parallelism within the TP group (issue 49 item 1): whole experts on each GPU, the
busiest GPU's reads and pairs, and the combinations that are refused."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from capsim.catalog.loader import load_catalog
from capsim.cli.main import app
from capsim.errors import CapsimUserError
from capsim.physics.deployment import Deployment, default_efficiency
from capsim.physics.step import StepModel

CAT = load_catalog()


def step_model(gpu="h200", model="deepseek-r1", quant="fp8", tp=8, ep=True) -> StepModel:
    g = CAT.gpu(gpu)
    return StepModel(
        g,
        CAT.model(model),
        CAT.quant(quant),
        Deployment(tp=tp, expert_parallel=ep),
        default_efficiency(g, CAT),
    )


def expected_max_by_enumeration(per_gpu: int, q: float, gpus: int) -> float:
    """E[max of ``gpus`` independent Binomial(per_gpu, q)] over every outcome."""
    pmf = [math.comb(per_gpu, j) * q**j * (1 - q) ** (per_gpu - j) for j in range(per_gpu + 1)]
    total = 0.0
    for counts in itertools.product(range(per_gpu + 1), repeat=gpus):
        total += max(counts) * math.prod(pmf[c] for c in counts)
    return total


def test_the_busiest_gpu_by_hand():
    """Mixtral at TP2 with EP: 4 whole experts a GPU. One token touches 2 of 8 experts
    (q = 1/4 each): the busiest GPU runs E[max of two Binomial(4, 1/4)] whole experts,
    that many x 2 TP slices read; its pairs exceed the mean by sqrt(2 ln 2 x 1/2 x 2 / 2)."""
    sm = step_model("h100-sxm", "mixtral-8x7b", "bf16", tp=2)
    read, pipelines, pairs = sm.expert_parallel_load(1.0, 2.0)
    busiest = expected_max_by_enumeration(4, 0.25, 2)
    assert pipelines == pytest.approx(busiest)
    assert read == pytest.approx(2 * busiest)
    assert pairs == pytest.approx(1 + math.sqrt(2 * math.log(2) * 0.5 * 2 / 2))
    # without expert parallelism every GPU reads a slice of each touched expert
    assert step_model("h100-sxm", "mixtral-8x7b", "bf16", tp=2, ep=False).expert_parallel_load(
        1.0, 2.0
    ) == (2.0, 2.0, 1.0)


@settings(max_examples=60, deadline=None)
@given(tokens=st.integers(1, 4096), tp=st.sampled_from([2, 4, 8]))
def test_the_busiest_gpu_never_reads_less_than_the_even_share(tokens, tp):
    sm = step_model(tp=tp)
    touched = sm.experts_touched_scalar(tokens)
    read, pipelines, pairs = sm.expert_parallel_load(float(tokens), touched)
    assert read >= touched * (1 - 1e-9)
    assert pipelines * tp == pytest.approx(read)
    assert pipelines <= CAT.model("deepseek-r1").moe.num_experts / tp + 1e-9
    assert 1.0 <= pairs <= tp


def test_ep_costs_more_at_one_token_and_nothing_once_every_expert_is_touched():
    ep, tp = step_model(), step_model(ep=False)
    one = ep.step(np.ones(4), np.full(4, 2000.0))
    one_tp = tp.step(np.ones(4), np.full(4, 2000.0))
    assert one.expert_bytes > 1.5 * one_tp.expert_bytes  # 6.6 whole experts against 3.8
    assert one.t_total > one_tp.t_total
    many = ep.step(np.ones(4096), np.full(4096, 2000.0))
    many_tp = tp.step(np.ones(4096), np.full(4096, 2000.0))
    assert many.expert_bytes == pytest.approx(many_tp.expert_bytes)
    assert many.ep_pair_load < 1.05 and many_tp.ep_pair_load == 1.0
    # at TP1 expert parallelism has one rank: the same step
    solo, plain = step_model("h200", "qwen3-30b-a3b", "bf16", tp=1), None
    plain = step_model("h200", "qwen3-30b-a3b", "bf16", tp=1, ep=False)
    assert (
        solo.step(np.ones(8), np.full(8, 500.0)).t_total
        == plain.step(np.ones(8), np.full(8, 500.0)).t_total
    )


def test_refused_where_vllm_refuses_or_capsim_does_not_model_it():
    with pytest.raises(CapsimUserError, match="dense"):
        step_model("h100-sxm", "llama-3.1-8b", "bf16", tp=2)
    with pytest.raises(CapsimUserError, match="does not divide mixtral-8x7b's 8 routed"):
        step_model("h100-sxm", "mixtral-8x7b", "bf16", tp=16)
    g = CAT.gpu("rtx3090")
    with pytest.raises(CapsimUserError, match="--n-cpu-moe"):
        StepModel(
            g,
            CAT.model("qwen3-coder-30b-a3b"),
            CAT.quant("bf16"),
            Deployment(tp=2, expert_parallel=True, cpu_moe_layers=4, host_memory_bandwidth_gbs=60),
            default_efficiency(g, CAT),
        )
    r = CliRunner().invoke(
        app,
        ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--enable-expert-parallel"],
    )
    assert r.exit_code == 2 and "dense" in r.output and "Traceback" not in r.output


def test_predict_and_explain_take_the_flag():
    runner = CliRunner()
    args = ["--gpu", "h200", "--model", "qwen3-30b-a3b", "--tp", "2"]
    r = runner.invoke(app, ["explain", *args, "--batch", "4", "--enable-expert-parallel"])
    assert r.exit_code == 0, r.output
    assert "expert parallel, busiest GPU" in r.output
    r = runner.invoke(app, ["predict", *args, "-c", "2", "--enable-expert-parallel", "--json"])
    assert r.exit_code == 0, r.output
    assert '"expert_parallel": true' in r.output


def test_fit_takes_the_flag_with_the_same_bytes_and_the_engines_refusals():
    # whole experts a GPU hold what a slice of each did: the same fit, said in the title;
    # a dense model or an expert count the TP group does not divide exits 2 as in predict
    import json

    runner = CliRunner()
    args = ["fit", "--gpu", "h200", "--model", "qwen3-30b-a3b", "--tp", "2", "--json"]
    plain = json.loads(runner.invoke(app, args).output)
    r = runner.invoke(app, [*args, "--enable-expert-parallel"])
    assert r.exit_code == 0, r.output
    ep = json.loads(r.output)
    assert ep["expert_parallel"] is True and plain["expert_parallel"] is False
    assert ep["weight_bytes"] == plain["weight_bytes"]
    assert ep["kv_capacity_tokens"] == plain["kv_capacity_tokens"]
    r = runner.invoke(app, [*args[:-1], "--enable-expert-parallel"])
    assert r.exit_code == 0 and "expert parallel: FITS" in r.output
    for model, tp, said in (
        ("qwen3-30b-a3b", "3", "does not divide"),
        ("llama-3.1-8b", "2", "dense"),
    ):
        r = runner.invoke(
            app, ["fit", "--gpu", "h200", "--model", model, "--tp", tp, "--enable-expert-parallel"]
        )
        assert r.exit_code == 2 and said in r.output and "Traceback" not in r.output


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 256),
    context=st.integers(0, 8192),
    prefill=st.integers(0, 8192),
    gpu_tp=st.sampled_from([("rtx3090", 2), ("h100-sxm", 2), ("h100-sxm", 4), ("h100-sxm", 8)]),
    model=st.sampled_from(["qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-120b"]),
)
def test_a_faster_interconnect_never_slows_expert_parallelism(
    batch, context, prefill, gpu_tp, model
):
    """Issue 49: GPUs joined by NVLink (bridges, or a switch) or by PCIe alone, with the
    experts split whole over the TP group; the faster link never gives a longer step."""
    gpu, tp = gpu_tp
    g, m = CAT.gpu(gpu), CAT.model(model)
    params = default_efficiency(g, CAT)

    def step_time(link: str) -> float:
        dep = Deployment(tp=tp, expert_parallel=True, interconnect=link, quant="awq-int4")
        sm = StepModel(g, m, CAT.quant("awq-int4"), dep, params)
        tokens = [1] * batch + ([prefill] if prefill else [])
        contexts = [context] * batch + ([0] if prefill else [])
        return sm.step(tokens, contexts).t_total

    assert step_time("nvlink") <= step_time("pcie") * (1 + 1e-12)


def test_vllms_data_parallelism_with_expert_parallelism_is_one_ep_group_of_attention_ranks():
    """vLLM's --data-parallel-size N --enable-expert-parallel on an MoE: one expert-parallel
    group of tp x N GPUs ("the expert parallel size is TP x DP") whose attention runs in N
    ranks, each with its own KV cache: simulated as SGLang's --tp 8 --dp 8
    --enable-dp-attention with EP, so DeepSeek-R1 on 8 H200s fits (TP1 alone cannot) and
    holds a copy of the latent cache a rank, not a GPU. A dense model keeps --dp as
    replicas."""
    from capsim.engine.config import PredictConfig
    from capsim.engine.setup import build_setup

    base = dict(gpu="h200", model="deepseek-r1", profile="none")
    vllm = build_setup(PredictConfig(**base, dp=8, expert_parallel=True), CAT)
    tensor_parallel = build_setup(PredictConfig(**base, tp=8), CAT)
    assert (vllm.config.tp, vllm.config.dp_attention, vllm.dp) == (8, 8, 1)
    # MLA's latent cache: one copy a rank, not one a GPU of the TP group
    assert vllm.num_blocks > 5 * tensor_parallel.num_blocks
    halves = build_setup(PredictConfig(**base, tp=4, dp=2, expert_parallel=True), CAT)
    assert (halves.config.tp, halves.config.dp_attention) == (8, 2)
    dense = build_setup(
        PredictConfig(gpu="h100-sxm", model="llama-3.1-8b", dp=2, profile="none"), CAT
    )
    assert (dense.config.tp, dense.dp) == (1, 2)
    r = CliRunner().invoke(
        app,
        [
            "predict",
            "--gpu",
            "h200",
            "--model",
            "deepseek-r1",
            "--data-parallel-size",
            "8",
            "--enable-expert-parallel",
            "-c",
            "4",
            "--requests",
            "8",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)["results"][0]
    assert result["tp"] == 8 and "dp-attention 8 EP" in result["label"]


def test_an_expert_parallel_group_beyond_one_server_is_refused():
    """vLLM's --data-parallel-size 16 --enable-expert-parallel would make one EP group of 16
    GPUs whose dispatch crosses the network (DeepEP, pplx): not modelled, so refused rather
    than run as an all-reduce over PCIe."""
    from capsim.engine.config import PredictConfig
    from capsim.engine.setup import build_setup

    config = PredictConfig(gpu="h200", model="deepseek-r1", dp=16, expert_parallel=True)
    with pytest.raises(CapsimUserError, match="across servers"):
        build_setup(config, CAT)


@settings(max_examples=15, deadline=None)
@given(low=st.floats(0.0, 1.5), more=st.floats(0.01, 1.0))
def test_skewed_routing_never_shortens_a_compute_bound_ep_step(low, more):
    """Property (issue 49): balanced routing is never slower than skewed where the experts'
    GEMMs bind (a prefill of 8,192 tokens on DeepSeek-R1 EP8 touches every expert): hot
    experts load the GPUs that hold them (moe.placement_load_cv), so the busiest GPU has
    more pairs the more skewed the routing."""
    from capsim.physics.moe import placement_load_cv

    def step(skew: float) -> float:
        sm = step_model()
        params = sm.params.with_overrides({"moe_routing_skew": skew})
        sm = StepModel(
            CAT.gpu("h200"), CAT.model("deepseek-r1"), CAT.quant("fp8"), sm.deployment, params
        )
        return sm.step([8192], [0]).t_total

    assert step(low + more) >= step(low) * (1 - 1e-9)
    assert placement_load_cv(256, 8, low + more) >= placement_load_cv(256, 8, low)


def test_vllms_ranks_hold_the_dense_layers_and_shared_experts_whole():
    """vLLM's DP+EP runs each rank as a replica but for the routed experts: DeepSeek-R1's
    three dense MLP layers and its shared experts are whole on every GPU (SGLang's DP
    attention splits them over the group), 7/8 of their FP8 bytes more a GPU, read every
    step."""
    from capsim.engine.config import PredictConfig
    from capsim.engine.setup import build_setup
    from capsim.physics.parameters import parameter_breakdown

    base = dict(gpu="h200", model="deepseek-r1", profile="none", expert_parallel=True)
    vllm = build_setup(PredictConfig(**base, dp=8), CAT)
    sglang = build_setup(PredictConfig(**base, tp=8, dp_attention=8, engine="sglang"), CAT)
    p = parameter_breakdown(CAT.model("deepseek-r1"))
    fmt = CAT.quant("fp8")
    extra = (p.mlp + p.shared_experts) * fmt.bits_per_weight / 8 * (1 - 1 / 8)
    assert vllm.fit.weight_bytes - sglang.fit.weight_bytes == pytest.approx(extra, rel=0.02)
    assert vllm.step_model.dense_weight_bytes - sglang.step_model.dense_weight_bytes == (
        pytest.approx(extra, rel=0.02)
    )
    assert vllm.step_model.routed_bytes_all == pytest.approx(sglang.step_model.routed_bytes_all)


def test_vllm_dp_ep_is_one_group_in_every_command_and_mismatches_are_refused():
    """vLLM's --dp N --enable-expert-parallel: fit and explain take it as predict does (one
    expert-parallel group of tp x N GPUs); what contradicts it exits 2 (issue 47's fifth
    audit: fit/explain refused it, a --gpus that disagreed was silently obeyed, --router
    was ignored)."""
    from typer.testing import CliRunner

    from capsim.cli.main import app

    run = CliRunner().invoke
    base = ["--gpu", "h200", "--model", "deepseek-r1", "--enable-expert-parallel"]
    r = run(app, ["fit", *base, "--dp", "8"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "8x h200" in r.output.replace("8 x", "8x"), r.output
    r = run(app, ["explain", *base, "--dp", "8", "--batch", "64"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "data-parallel attention" in r.output, r.output
    assert "8 ranks of 1 GPU" in " ".join(r.output.split())
    r = run(app, ["fit", *base, "--dp", "16"])
    assert r.exit_code == 2 and "beyond one server's 8" in r.output
    r = run(app, ["predict", *base, "--gpus", "8", "--dp", "16", "-c", "2", "--requests", "2"])
    assert r.exit_code == 2 and "--data-parallel-size 16" in r.output, r.output
    r = run(app, ["predict", *base, "--dp", "8", "--router", "random", "-c", "2"])
    assert r.exit_code == 2 and "--router" in r.output, r.output
    r = run(app, ["fit", "--gpu", "h200", "--model", "deepseek-r1", "--dp", "0"])
    assert r.exit_code == 2 and "--dp must be at least 1" in r.output


def test_offload_past_the_weights_says_so_and_prefill_instances_are_bounded():
    from typer.testing import CliRunner

    from capsim.cli.main import app

    run = CliRunner().invoke
    args = ["predict", "--gpu", "rtx3090", "--model", "llama-3.1-8b", "-c", "1", "--requests", "2"]
    r = run(app, [*args, "--cpu-offload-gb", "99999"], env={"COLUMNS": "200"})
    text = " ".join(r.output.split())
    assert r.exit_code == 0 and "is more than a GPU's 14.96 GiB of weights" in text, r.output
    r = run(app, [*args, "--cpu-offload-gb", "4"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "is more than a GPU's" not in " ".join(r.output.split())
    r = run(
        app, ["predict", "--gpu", "h200", "--model", "llama-3.1-8b", "--prefill-replicas", "2000"]
    )
    assert r.exit_code == 2 and "1024" in r.output
