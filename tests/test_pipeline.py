"""Pipeline parallelism (--pipeline-parallel-size): a stage's memory, the hand-offs in a
step, the batches in flight, and the combinations refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from capsim.catalog.loader import load_catalog
from capsim.cli.main import app
from capsim.engine.config import PredictConfig
from capsim.engine.setup import build_setup
from capsim.engine.simulate import predict
from capsim.errors import CapsimUserError
from capsim.physics.memory import memory_fit, weight_bytes

CAT = load_catalog()


def config(**extra) -> PredictConfig:
    base = dict(gpu="h100-sxm", model="llama-3.1-70b", tp=4, profile="none", requests=8)
    return PredictConfig(**{**base, **extra})


def test_a_gpu_holds_its_stages_layers_and_their_kv_cache():
    """Llama-3.1-70B (80 layers) at TP4 over two stages: a GPU holds 40 layers' weights and
    KV, and the larger of the first stage's embeddings and the last stage's head (equal
    here: 128,256 x 8,192 each)."""
    g, m, fmt = CAT.gpu("h100-sxm"), CAT.model("llama-3.1-70b"), CAT.quant("bf16")
    one = memory_fit(g, m, fmt, tp=4)
    two = memory_fit(g, m, fmt, tp=4, pp=2)
    assert two.kv_bytes_per_token == pytest.approx(one.kv_bytes_per_token / 2)
    parts = weight_bytes(m, fmt, 4)
    ends = parts["embeddings"] + parts["lm_head"]
    layers = sum(parts.values()) - ends
    assert two.weight_bytes == pytest.approx(layers / 2 + parts["lm_head"])
    assert one.weight_bytes == pytest.approx(layers + ends)
    assert two.kv_capacity_tokens > 2.5 * one.kv_capacity_tokens  # more memory, half a token
    assert two.pp == 2


def test_one_request_passes_every_stage_and_the_hand_offs():
    """At one client a pipeline is as fast as its TP group alone plus one hand-off a step:
    decode steps of one token lose (pp - 1) x (hop latency + 8,192 x 2 bytes over NVLink)."""
    alone = build_setup(config(), CAT)
    piped = build_setup(config(pp=2), CAT)
    context = np.array([2048.0])
    tokens = np.array([1.0])
    sm = piped.step_model
    hop = sm.params.hop_latency_nvlink_us * 1e-6 + 8192 * 2 / (
        450e9 * sm.params.allreduce_efficiency
    )
    assert sm.scheduled_step_time(tokens, context) == pytest.approx(
        alone.step_model.scheduled_step_time(tokens, context) + hop, rel=1e-9
    )
    one = predict(config(pp=2, concurrency=[1]), workers=1).levels[0].metrics
    ref = predict(config(concurrency=[1]), workers=1).levels[0].metrics
    assert one.tpot_ms.mean >= ref.tpot_ms.mean


def test_the_stages_keep_batches_in_flight():
    """Many clients: two stages of TP4 serve about what two TP4 replicas serve (the same
    GPUs, a batch a stage), far above one TP4 group; the pipeline's engines share its KV
    cache and sequence limit."""
    load = dict(concurrency=[128], requests=512, input_tokens="1024", output_tokens="256")
    piped = predict(config(pp=2, **load), workers=1)
    replicas = predict(config(dp=2, **load), workers=1).levels[0].metrics.output_tok_s
    group = predict(config(**load), workers=1).levels[0].metrics.output_tok_s
    got = piped.levels[0].metrics.output_tok_s
    assert got == pytest.approx(replicas, rel=0.15) and got > 1.3 * group
    setup = build_setup(config(pp=2), CAT)
    assert setup.engines == 2 and setup.gpus == 8
    assert setup.num_blocks * 16 * 2 <= piped.kv_capacity_tokens + 32


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (dict(engine="llama.cpp", gpu="rtx3090", model="qwen3-8b", tp=1), "llama.cpp splits"),
        (dict(model="qwen3-8b", tp=1, pp=40), "more stages than qwen3-8b's 36 layers"),
        (dict(pp=2, prefill_replicas=1), "with --prefill-replicas is not modelled"),
        (dict(pp=2, gpus=12), "not a multiple of --tp 4 x --pipeline-parallel-size 2"),
    ],
)
def test_what_a_pipeline_does_not_combine_with_is_refused(extra, message):
    with pytest.raises(CapsimUserError, match=message):
        build_setup(config(**{"pp": 2, **extra}), CAT)


def test_predict_takes_the_engines_flag_and_says_pp():
    r = CliRunner().invoke(
        app,
        [
            "predict",
            "--gpu",
            "h100-sxm",
            "--model",
            "llama-3.1-70b",
            "--tp",
            "4",
            "--pipeline-parallel-size",
            "2",
            "-c",
            "2",
            "--requests",
            "4",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)["results"][0]
    assert "4xh100-sxm PP2" in result["label"] and result["config"]["pp"] == 2


def test_explain_shows_the_hand_offs_with_the_communication():
    def decode(*extra):
        args = ["explain", "--gpu", "h100-sxm", "--model", "llama-3.1-70b", "--tp", "4"]
        r = CliRunner().invoke(app, [*args, *extra, "--json"])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    one, two = decode(), decode("--pp", "2")
    assert two["deployment"]["pp"] == 2
    added = two["decode"]["t_communication"] - one["decode"]["t_communication"]
    assert 0 < added < 1e-4  # one hand-off of one token's activations
    text = CliRunner().invoke(
        app, ["explain", "--gpu", "h100-sxm", "--model", "llama-3.1-70b", "--tp", "4", "--pp", "2"]
    )
    assert "pipeline hand-offs" in text.output and "x PP2" in text.output
