"""Data-parallel attention (SGLang's --enable-dp-attention, issue 49): attention ranks
inside the TP group, each with its own sequences and KV cache, the attention weights split
over a rank's GPUs only, the MLP and MoE layers over all of them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from capsim.catalog.loader import load_catalog
from capsim.cli.main import app
from capsim.errors import CapsimUserError
from capsim.physics.deployment import Deployment, default_efficiency
from capsim.physics.kv_layout import kv_layout
from capsim.physics.memory import memory_fit, weight_bytes
from capsim.physics.step import StepModel

CAT = load_catalog()
H200 = CAT.gpu("h200")
DSR1 = CAT.model("deepseek-r1")
FP8 = CAT.quant("fp8")
SGLANG = default_efficiency(H200, CAT, CAT.engine("sglang"))
runner = CliRunner()


def step_model(model=DSR1, fmt=FP8, tp: int = 8, ranks: int = 1) -> StepModel:
    return StepModel(H200, model, fmt, Deployment(tp=tp, dp_attention=ranks), SGLANG)


def test_mla_kv_is_not_replicated_per_rank():
    """DeepSeek's MLA cache (576 values a token and layer, 61 layers, bf16: 70,272 bytes)
    is the same on every GPU of a TP group, so TP8 keeps eight copies of every token; with
    eight attention ranks a GPU holds and reads only its rank's sequences: an eighth."""
    assert kv_layout(DSR1, "auto", 8).full_bytes_per_token == 576 * 2 * 61
    tp8, dp8 = step_model(), step_model(ranks=8)
    assert dp8.kv.full_bytes_per_token == pytest.approx(tp8.kv.full_bytes_per_token / 8)
    # a GPU reads its rank's whole attention, not an eighth of it
    attention = weight_bytes(DSR1, FP8, 1)["attention"]
    extra = attention - weight_bytes(DSR1, FP8, 8)["attention"]
    assert dp8.dense_weight_bytes - tp8.dense_weight_bytes == pytest.approx(extra)
    # the q/kv down-projections (7,168 x 2,112 a layer) are whole on every GPU either way
    replicated = 7168 * (1536 + 512 + 64) * 61 * FP8.bits_per_weight / 8
    assert extra == pytest.approx((attention - replicated) * 7 / 8)
    # FLOPs a GPU computes are the same for the split weights: 1/8 of the tokens, all of
    # the heads (executed in FlashMLA's 64-row tiles, TP8's 16 heads a GPU pad each tile
    # four times over, a rank's 128 fill two: physics/work_counts.py, mla_decode_padding);
    # the replicated down-projections a TP8 GPU runs on every token, a rank's on its eighth
    down_flops = 2 * 7168 * 2112 * 61
    assert tp8.dense_flops_per_token - dp8.dense_flops_per_token == pytest.approx(
        down_flops * 7 / 8
    )
    assert (tp8.mla_decode_padding, dp8.mla_decode_padding) == (4.0, 1.0)
    assert dp8.full_pair_flops * 4 == pytest.approx(tp8.full_pair_flops)


def test_kv_capacity_is_the_ranks_pools_together():
    tp8 = memory_fit(H200, DSR1, FP8, tp=8, gpu_memory_utilization=0.88)
    dp8 = memory_fit(H200, DSR1, FP8, tp=8, gpu_memory_utilization=0.88, dp_attention=8)
    extra = weight_bytes(DSR1, FP8, 1)["attention"] - weight_bytes(DSR1, FP8, 8)["attention"]
    assert dp8.weight_bytes - tp8.weight_bytes == pytest.approx(extra)
    per_rank = int((tp8.kv_budget_bytes - extra) // dp8.kv_bytes_per_token)
    per_rank -= per_rank % 16
    assert dp8.kv_capacity_tokens == 8 * per_rank
    assert dp8.kv_capacity_tokens > 6 * tp8.kv_capacity_tokens
    assert dp8.max_model_len_limit <= tp8.max_model_len_limit  # one sequence, one rank


def test_gqa_kv_split_over_heads_reads_the_same():
    """Llama-3.1-70B's eight KV heads split over TP8 already: each GPU holds one head of
    every sequence, or with eight ranks all heads of an eighth of them, the same bytes;
    the decode step only reads more attention weights, so it is slower."""
    llama = CAT.model("llama-3.1-70b")
    fmt = CAT.quant("fp8")
    tp8, dp8 = step_model(llama, fmt), step_model(llama, fmt, ranks=8)
    assert dp8.kv.full_bytes_per_token == pytest.approx(tp8.kv.full_bytes_per_token)
    assert dp8.step_time([1] * 64, [2000] * 64) > tp8.step_time([1] * 64, [2000] * 64)


@settings(max_examples=40, deadline=None)
@given(
    model=st.sampled_from(["deepseek-r1", "qwen3-30b-a3b", "llama-3.1-70b", "glm-4.5-air"]),
    tp=st.sampled_from([2, 4, 8]),
    split=st.sampled_from([2, 4, 8]),
)
def test_ranks_never_read_more_kv_per_gpu(model, tp, split):
    """For any model and rank count dividing the TP size: the KV bytes per token a GPU
    reads never rise (replicated KV heads shrink, split ones stay), and the weights it
    reads never fall."""
    if split > tp:
        return
    m = CAT.model(model)
    fmt = CAT.quant("fp8")
    try:
        tp_only, ranked = step_model(m, fmt, tp), step_model(m, fmt, tp, split)
    except CapsimUserError:  # a TP size the model's heads do not allow
        return
    assert ranked.kv.bytes_per_token <= tp_only.kv.bytes_per_token * (1 + 1e-12)
    assert ranked.dense_weight_bytes >= tp_only.dense_weight_bytes


def predict_json(*flags: str) -> dict:
    args = ["predict", "--gpu", "h200", "--model", "deepseek-r1", "--tp", "8", "--json"]
    r = runner.invoke(app, [*args, "--engine", "sglang", *flags])
    assert r.exit_code == 0, r.output
    (result,) = json.loads(r.stdout)["results"]
    return {p["concurrency"]: p for p in result["points"]} | {"config": result["config"]}


def test_dp_attention_serves_a_full_kv_cache_faster_and_one_client_slower():
    """SGLang's guidance: DP attention for throughput at high concurrency, where TP8's
    replicated MLA cache runs out; at one client the extra attention weights cost time."""
    common = ["--concurrency", "1,256", "--input-tokens", "3200", "--output-tokens", "400"]
    common += ["--requests", "512"]
    tp8 = predict_json(*common)
    dp8 = predict_json(*common, "--dp", "8", "--enable-dp-attention")
    assert dp8["config"]["dp_attention"] == 8 and dp8["config"]["dp"] in (None, 1)
    assert dp8[256]["output_tok_s"] > 1.1 * tp8[256]["output_tok_s"]
    assert dp8[1]["output_tok_s"] < tp8[1]["output_tok_s"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dp", "8", "--enable-dp-attention"], "SGLang's"),
        (["--engine", "sglang", "--enable-dp-attention"], "needs --dp N above 1"),
        (["--engine", "sglang", "--dp", "3", "--enable-dp-attention"], "does not divide --tp 8"),
    ],
)
def test_bad_dp_attention_deployments_exit_2(flags, message):
    args = ["predict", "--gpu", "h200", "--model", "deepseek-r1", "--tp", "8", *flags]
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "Traceback" not in r.output


def test_fit_and_explain_show_the_ranks():
    args = ["--gpu", "h200", "--model", "deepseek-r1", "--tp", "8", "--engine", "sglang"]
    args += ["--dp", "8", "--enable-dp-attention"]
    fit = runner.invoke(app, ["fit", *args, "--json"])
    assert fit.exit_code == 0, fit.output
    assert json.loads(fit.stdout)["dp_attention"] == 8
    explain = runner.invoke(app, ["explain", *args, "--batch", "64", "--context", "3000"])
    assert explain.exit_code == 0, explain.output
    assert "data-parallel attention" in explain.output
    assert "8 ranks of 1 GPU" in " ".join(explain.output.split())


def test_each_rank_schedules_samples_and_captures_its_own_batch():
    """SGLang runs a scheduler per attention rank: the default ceiling on running requests
    is one per rank, a GPU samples only its rank's sequences (the logits it holds), and a
    rank pads its own decode batch to its CUDA graphs."""
    tp8 = memory_fit(H200, DSR1, FP8, tp=8, default_limits=(16384, 1024))
    dp8 = memory_fit(H200, DSR1, FP8, tp=8, default_limits=(16384, 1024), dp_attention=8)
    assert (tp8.max_num_seqs, dp8.max_num_seqs) == (1024, 8192)
    assert dp8.activation_bytes == pytest.approx(tp8.activation_bytes)
    dep = dict(tp=8, graph_capture="sglang", max_num_seqs=8192, cuda_graph_max_batch=512)
    one = StepModel(H200, DSR1, FP8, Deployment(**dep), SGLANG)
    ranks = StepModel(H200, DSR1, FP8, Deployment(**dep, dp_attention=8), SGLANG)
    assert ranks.graph_max_tokens == 8 * one.graph_max_tokens
    assert ranks.graph_sizes == one.graph_sizes  # padding as one group: zero rows


def test_a_prompt_runs_on_its_own_rank_in_the_ranks_chunks():
    """SGLang divides the chunked prefill among the ranks (chunked_prefill_size //
    dp_size) and a prompt runs on its own rank: one 3,200-token prompt on 8 H200s with 8
    ranks goes in four chunks of 1,024 (8,192 / 8), each a step that reads every expert,
    so its first token comes later than TP8's one step."""
    from capsim.engine.scheduler import SchedulerConfig

    assert SchedulerConfig(request_chunk_tokens=1024).chunk(3200, 8192) == 1024
    assert SchedulerConfig().chunk(3200, 8192) == 3200
    common = ["--concurrency", "1", "--input-tokens", "3200", "--output-tokens", "64"]
    common += ["--requests", "8"]
    tp8 = predict_json(*common)[1]["ttft_ms"]["p50"]
    dp8 = predict_json(*common, "--dp", "8", "--enable-dp-attention")[1]["ttft_ms"]["p50"]
    assert dp8 > 1.5 * tp8


def test_capacity_takes_the_ranks_and_dp_alone_is_refused_where_it_means_nothing():
    """capacity and serve take --dp only as attention ranks (--gpus sets replicas), so
    --dp without --enable-dp-attention is refused there, not ignored."""
    args = ["--gpu", "h200", "--model", "deepseek-r1", "--tp", "8", "--engine", "sglang"]
    ranks = ["--dp", "8", "--enable-dp-attention", "--max-ttft-p90", "30"]
    load = ["--input-tokens", "3200", "--output-tokens", "400", "--json"]
    r = runner.invoke(app, ["capacity", *args, *ranks, *load])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["answers"][0]["max_concurrency"] > 0
    for command in (["fit"], ["explain"], ["capacity", "--max-ttft-p90", "30"]):
        r = runner.invoke(app, [*command, *args, "--dp", "8"])
        assert r.exit_code == 2, r.output
        assert "only with --enable-dp-attention" in r.output


def test_the_busiest_rank_holds_the_longest_sequence():
    """A sequence runs on one rank: alone, its KV and query-key pairs cost that rank
    what the whole TP group shares without DP attention (ranks times the even split), and a
    decode run, step by step or at once, sees the same."""
    dp8 = step_model(ranks=8)
    even = dp8._even_sums(np.array([1.0]), np.array([30000.0]))
    busiest = dp8._sums(np.array([1.0]), np.array([30000.0]))
    assert busiest[2] == pytest.approx(8 * even[2]) and busiest[4] == pytest.approx(8 * even[4])
    # many equal sequences: the even split holds, nothing changes
    many = (np.ones(64), np.full(64, 3000.0))
    assert dp8._sums(*many) == dp8._even_sums(*many)
    assert not dp8.takes_moments
    for model in ("deepseek-r1", "gpt-oss-120b"):  # MLA; and sliding-window layers
        m = CAT.model(model)
        fmt = CAT.quant("fp8" if model == "deepseek-r1" else "mxfp4")
        sm = step_model(m, fmt, ranks=8)
        context = np.array([9000.0, 200.0, 50.0])
        run = sm.decode_run_times(context, 5)
        for j in range(5):
            step = sm.step_time(np.ones(3), context + j * sm.decode_advance)
            assert run[j] == pytest.approx(step, rel=1e-9)


def test_a_rank_count_out_of_range_names_the_flag_the_user_typed():
    args = ["predict", "--gpu", "h200", "--model", "deepseek-r1", "--tp", "8"]
    r = runner.invoke(app, [*args, "--engine", "sglang", "--dp", "99999", "--enable-dp-attention"])
    assert r.exit_code == 2, r.output
    assert "--dp (with --enable-dp-attention)" in r.output


def test_vllms_ranks_all_reduce_attention_only_over_their_own_gpus():
    """vLLM's DP+EP: a rank's attention all-reduces over its own GPUs (none at one GPU a
    rank) and the MoE layer's all-gather and reduce-scatter over the group (vLLM's default
    all2all backend) move what one all-reduce of all the tokens does: at dp 8 a layer
    makes one group all-reduce, not two; at dp 4 one plus one over each rank's 2 GPUs of its
    quarter of the tokens. SGLang's DP attention keeps two group all-reduces a layer (its
    gather onto the group, then the MLP's)."""
    from capsim.engine.config import PredictConfig
    from capsim.engine.setup import build_setup
    from capsim.physics.dtypes import ACTIVATION_BYTES

    def sm(**extra):
        return build_setup(
            PredictConfig(gpu="h200", model="deepseek-r1", profile="none", **extra), CAT
        ).step_model

    tp8, vllm8 = sm(tp=8), sm(dp=8, expert_parallel=True)
    vllm4 = sm(tp=2, dp=4, expert_parallel=True)
    sglang8 = sm(tp=8, dp_attention=8, engine="sglang")
    message = 256 * 7168 * ACTIVATION_BYTES
    layers = 61
    two = 2 * layers * float(tp8.allreduce_seconds(message))
    assert float(tp8.communication_seconds(256)) == pytest.approx(two)
    assert float(sglang8.communication_seconds(256)) == pytest.approx(two)
    assert float(vllm8.communication_seconds(256)) == pytest.approx(two / 2)
    assert float(vllm4.communication_seconds(256)) == pytest.approx(
        layers * float(vllm4.allreduce_seconds(message))
        + layers * float(vllm4.allreduce_seconds(message / 4, 2))
    )
    assert vllm8.allreduces_per_step == layers and vllm4.allreduces_per_step == 2 * layers
