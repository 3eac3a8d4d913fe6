"""Every name the public API exports resolves to what it names (kv_bytes_per_token and
kv_layout pointed at a module that does not define them: an AttributeError on first use,
found by the second fuzzing round of 2026-12-02)."""

from __future__ import annotations

import pytest

import capsim


@pytest.mark.parametrize("name", capsim.__all__)
def test_every_exported_name_resolves(name):
    assert getattr(capsim, name) is not None


def test_kv_bytes_per_token_is_the_layouts():
    cat = capsim.load_catalog()
    model = cat.model("llama-3.1-8b")
    # 32 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes (bf16)
    assert capsim.kv_bytes_per_token(model) == 32 * 8 * 128 * 2 * 2
    assert capsim.kv_layout(model, "auto", 1).bytes_per_token == 131072


NAN = float("nan")


@pytest.mark.parametrize(
    "call",
    [
        lambda c: capsim.predict(gpu="h100-sxm", model="llama-3.1-8b", router_latency_s=-1),
        lambda c: capsim.predict(gpu="h100-sxm", model="llama-3.1-8b", router_latency_s=NAN),
        lambda c: capsim.predict(gpu="h100-sxm", model="llama-3.1-8b", concurrency=[]),
        lambda c: capsim.predict(gpu="h100-sxm", model="llama-3.1-8b", concurrency=[10**12]),
        lambda c: capsim.plan(models=("llama-3.1-8b",), agents=4, nodes=(0,)),
        lambda c: capsim.plan(models=("llama-3.1-8b",), agents=4, spec_acceptance=NAN),
        lambda c: capsim.memory_fit(
            c.gpu("h100-sxm"), c.model("llama-3.1-8b"), c.quant("bf16"), pp=0
        ),
        lambda c: capsim.kv_layout(c.model("llama-3.1-8b"), "auto", 0),
    ],
)
def test_the_api_refuses_bad_arguments_with_its_own_error(call):
    """Each was a ZeroDivisionError, a SimPy or pydantic error from deep inside, or ran
    out of memory (the second fuzzing round of 2026-12-02)."""
    with pytest.raises(capsim.CapsimUserError):
        call(capsim.load_catalog())


def test_the_api_takes_path_strings():
    points, _ = capsim.validate(["calibration/published/seed000-b70-qwen-27b-swarm.yaml"])
    assert points
