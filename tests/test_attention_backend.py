"""Attention backends (physics/attention_backend.py): the engine's own choice per model and
GPU, the --attention-backend flag, and what SGLang's Triton backend costs beyond its
default kernels."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from capsim.calibration.published import Scenario
from capsim.catalog.loader import load_catalog
from capsim.cli.main import app
from capsim.physics.deployment import Deployment, default_efficiency
from capsim.physics.step import build_step_model

CAT = load_catalog()
runner = CliRunner()


def step_model(gpu: str, model: str, engine: str, backend: str | None = None, **params):
    g = CAT.gpu(gpu)
    p = default_efficiency(g, CAT, CAT.engine(engine))
    if params:
        p = p.with_overrides(params)
    dep = Deployment(engine=engine, attention_backend=backend)
    return build_step_model(CAT, g, model, dep, p)


@pytest.mark.parametrize(
    ("gpu", "model", "engine", "backend", "triton"),
    [
        ("h200", "gemma-4-e4b", "sglang", "triton", True),  # PR 25006: triton off SM100
        ("rtx5090", "gemma-4-31b", "sglang", "triton", True),  # SM120 is not SM100
        ("b200", "gemma-4-e4b", "sglang", "trtllm_mha", False),
        ("b300", "gemma-4-31b", "sglang", "trtllm_mha", False),
        ("h200", "qwen3-8b", "sglang", None, False),  # the default kernels
        ("h200", "gemma-4-e4b", "vllm", None, False),
    ],
)
def test_the_engine_picks_its_backend_per_model_and_gpu(gpu, model, engine, backend, triton):
    dep = step_model(gpu, model, engine).deployment
    assert dep.attention_backend == backend
    assert dep.triton_attention is triton


def test_sglangs_triton_backend_reads_the_cache_at_its_share_and_adds_its_layers():
    """By hand: the attention memory term is the default kernels' / 0.4 (no recurrent
    state in Gemma 4), and the floor grows by 16 us for each of the 42 attention layers."""
    triton = step_model("h200", "gemma-4-e4b", "sglang")
    fa3 = step_model("h200", "gemma-4-e4b", "sglang", "fa3")
    assert triton.deployment.triton_attention and not fa3.deployment.triton_attention
    contexts = np.full(256, 9000)
    t, f = triton.decode_step(contexts)[0], fa3.decode_step(contexts)[0]
    assert t.t_attention_memory == pytest.approx(f.t_attention_memory / 0.4, rel=1e-9)
    assert triton.triton_attention_floor_us == pytest.approx(42 * 16.0)
    assert fa3.triton_attention_floor_us == 0.0
    assert triton.kernel_floor_us(256) - fa3.kernel_floor_us(256) == pytest.approx(42 * 16.0)
    assert t.t_total > 1.5 * f.t_total  # a decode step of long contexts is bound by the reads


def test_vllms_triton_kernels_cost_as_its_flash_attention_ones():
    tri = step_model("h100-sxm", "qwen3-8b", "vllm", "TRITON_ATTN")
    fa = step_model("h100-sxm", "qwen3-8b", "vllm", "FLASH_ATTN")
    assert tri.deployment.triton_attention
    contexts = np.full(64, 4096)
    assert tri.decode_step(contexts)[0].t_total == fa.decode_step(contexts)[0].t_total


@settings(max_examples=40, deadline=None)
@given(
    share=st.floats(min_value=0.05, max_value=1.0),
    less=st.floats(min_value=0.1, max_value=1.0),
    batch=st.integers(min_value=1, max_value=512),
    context=st.integers(min_value=1, max_value=32_000),
)
def test_a_slower_triton_read_never_shortens_a_step(share, less, batch, context):
    a = step_model("h200", "gemma-4-e4b", "sglang", triton_attention_kv_share=share)
    b = step_model("h200", "gemma-4-e4b", "sglang", triton_attention_kv_share=share * less)
    contexts = np.full(batch, context)
    assert b.decode_step(contexts)[0].t_total >= a.decode_step(contexts)[0].t_total * (1 - 1e-12)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--engine", "sglang", "--attention-backend", "tritn"], "did you mean: triton"),
        (["--engine", "llama.cpp", "--attention-backend", "triton"], "has no attention-backend"),
        (
            ["--engine", "vllm", "--attention-backend", "triton"],
            "did you mean: TRITON_MLA, TRITON_ATTN",
        ),
    ],
)
def test_a_backend_the_engine_does_not_take_is_refused(args, words):
    r = runner.invoke(
        app,
        ["predict", "--gpu", "h200", "--model", "qwen3-8b", "--requests", "4", *args],
    )
    assert r.exit_code == 2, r.output
    assert words in " ".join(r.output.split())


def test_explain_shows_the_backend_and_its_terms():
    base = ["explain", "--gpu", "h200", "--model", "gemma-4-e4b", "--engine", "sglang"]
    r = runner.invoke(app, base)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "attention backend: triton (sglang's choice for gemma-4-e4b on h200)" in text
    assert "0.40 of the default kernels' rate" in text and "16 us" in text
    r = runner.invoke(app, [*base, "--attention-backend", "fa3", "--json"])
    assert r.exit_code == 0, r.output
    backend = json.loads(r.output)["attention_backend"]
    assert backend == {
        "name": "fa3",
        "triton": False,
        "kv_read_share": 1.0,
        "extra_us_per_step": 0.0,
    }


def test_predict_with_the_triton_backend_is_slower_than_with_fa3():
    """64 clients decoding after 8K-token prompts: the steps between tokens (ITL median)
    are bound by the cache reads, about 1.8 times longer on Triton."""

    def itl_p50(backend):
        r = runner.invoke(
            app,
            [
                "predict", "--gpu", "h200", "--model", "gemma-4-e4b", "--engine", "sglang",
                "--concurrency", "64", "--requests", "64", "--input-tokens", "8000",
                "--output-tokens", "512", "--attention-backend", backend, "--json",
            ],
        )  # fmt: skip
        assert r.exit_code == 0, r.output
        return json.loads(r.output)["results"][0]["points"][0]["itl_ms"]["p50"]

    assert itl_p50("triton") > 1.5 * itl_p50("fa3")


def test_a_scenario_records_the_backend_by_name():
    base = {
        "name": "s",
        "engine": "sglang",
        "gpu": "b300",
        "model": "gemma-4-e4b",
        "quant": "bf16",
        "tp": 1,
        "points": [{"concurrency": 1, "metric": "tpot_s", "value": 0.01, "quote": "q"}],
    }
    sc = Scenario.model_validate({**base, "flags": {"attention_backend": "triton"}})
    assert sc.flags["attention_backend"] == "triton"
    for bad in (3, True, "  "):
        with pytest.raises(ValueError, match="attention_backend"):
            Scenario.model_validate({**base, "flags": {"attention_backend": bad}})


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["--gpu", "mi300x", "--model", "qwen3-8b", "--attention-backend", "FLASHINFER"],
            "run on nvidia GPUs, not on the amd mi300x",
        ),
        (
            ["--gpu", "h100-sxm", "--model", "qwen3-8b", "--attention-backend", "ROCM_ATTN"],
            "run on amd GPUs, not on the nvidia h100-sxm",
        ),
        (
            ["--gpu", "h100-sxm", "--model", "qwen3-8b", "--attention-backend", "TRITON_MLA"],
            "is for models with multi-head latent attention",
        ),
        (
            [
                "--gpu",
                "h200",
                "--model",
                "deepseek-v3",
                "--tp",
                "8",
                "--attention-backend",
                "FLASH_ATTN",
            ],
            "cannot run deepseek-v3's multi-head latent attention",
        ),
        (
            [
                "--gpu",
                "h200",
                "--model",
                "deepseek-v3",
                "--tp",
                "8",
                "--attention-backend",
                "CUTLASS_MLA",
            ],
            "built for datacenter-blackwell GPUs",
        ),
        (
            [
                "--gpu",
                "mi300x",
                "--model",
                "qwen3-8b",
                "--engine",
                "sglang",
                "--attention-backend",
                "fa3",
            ],
            "run on nvidia GPUs",
        ),
        (
            [
                "--gpu",
                "rtx3090",
                "--model",
                "qwen3-8b",
                "--engine",
                "sglang",
                "--attention-backend",
                "trtllm_mha",
            ],
            "built for datacenter-blackwell GPUs",
        ),
    ],
)
def test_a_backend_the_engine_would_refuse_on_this_gpu_or_model_is_exit_2(args, words):
    """Issue 47's fuzzing: a ROCm backend on an H100, FlashInfer on an MI300X, an MLA
    backend for a model without MLA (and the reverse) and SM100 kernels on an RTX 3090 were
    costed as if they ran; vLLM and SGLang refuse them at start-up."""
    r = runner.invoke(
        app, ["predict", "-c", "1", "--requests", "4", "--output-tokens", "16", *args]
    )
    assert r.exit_code == 2, r.output
    assert words in " ".join(r.output.split())


@pytest.mark.parametrize(
    "args",
    [
        ["--gpu", "h200", "--model", "deepseek-v3", "--tp", "8", "--attention-backend", "FLASHMLA"],
        ["--gpu", "mi300x", "--model", "qwen3-8b", "--attention-backend", "ROCM_AITER_FA"],
        ["--gpu", "h100-sxm", "--model", "qwen3-8b", "--attention-backend", "TRITON_ATTN"],
        [
            "--gpu",
            "b200",
            "--model",
            "gemma-4-e4b",
            "--engine",
            "sglang",
            "--attention-backend",
            "trtllm_mha",
        ],
    ],
)
def test_a_backend_that_runs_there_is_taken(args):
    r = runner.invoke(
        app, ["predict", "-c", "1", "--requests", "4", "--output-tokens", "16", *args]
    )
    assert r.exit_code == 0, r.output
