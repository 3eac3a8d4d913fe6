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


@pytest.mark.parametrize(
    "call, says",
    [
        (lambda c: c.gpu(None), "the gpu name: takes a name or alias"),
        (lambda c: c.model(5), "the model name: takes a name or alias"),
        (lambda c: c.engine(None), "the engine name"),
        (lambda c: capsim.load_catalog(5), "extra_dirs: takes a path or a list of paths"),
        (
            lambda c: capsim.memory_fit("h100-sxm", c.model("llama-3.1-8b"), c.quant("bf16")),
            "gpu: takes a GPU",
        ),
        (
            lambda c: capsim.memory_fit(c.gpu("h100-sxm"), c.model("llama-3.1-8b"), None),
            "fmt: takes a QuantFormat",
        ),
        (lambda c: capsim.kv_bytes_per_token("llama-3.1-8b"), "model: takes a Model"),
        (lambda c: capsim.kv_layout(c.model("llama-3.1-8b"), 5, 1), "kv_dtype: takes a KV"),
        (lambda c: capsim.parameter_breakdown("llama-3.1-8b"), "model: takes a Model"),
        (lambda c: capsim.predict("h100-sxm"), "config: takes a PredictConfig"),
        (
            lambda c: capsim.predict(gpu="h100-sxm", model="llama-3.1-8b", catalog="x"),
            "catalog: takes a Catalog",
        ),
        (
            lambda c: capsim.predict(gpu="h100-sxm", model="llama-3.1-8b", progress=1),
            "progress: takes a function",
        ),
        (
            lambda c: capsim.capacity(gpu="h100-sxm", model="llama-3.1-8b", min_agent_tok_s="x"),
            "min_agent_tok_s: Input should be a valid number",
        ),
        (lambda c: capsim.plan("x"), "request: takes a PlanRequest"),
        (lambda c: capsim.plan(models=("llama-3.1-8b",), agents=4, cost=None), "cost: takes a"),
        (lambda c: capsim.plan(models="llama-3.1-8b", agents=4), "models: Input should be"),
        (lambda c: capsim.plan(models=("llama-3.1-8b",), agents="4"), "agents: Input should"),
        (lambda c: capsim.plan(models=("llama-3.1-8b",), agents=4, rank=5), "rank: takes a"),
        (lambda c: capsim.plan(models=("llama-3.1-8b",), agents=4, seed=1), "seed: not a field"),
        (lambda c: capsim.validate(5), "datasets: takes a path or a list of paths"),
        (lambda c: capsim.probe(url="http://x", model="m", out=None), "out: takes a path"),
    ],
)
def test_arguments_of_the_wrong_kind_are_refused_naming_the_argument(call, says):
    """Each leaked an AttributeError or TypeError from deep inside (a name where an entry
    is taken, None where a cost model is: the third fuzzing round of issue 47)."""
    with pytest.raises(capsim.CapsimUserError) as info:
        call(capsim.load_catalog())
    assert says in str(info.value)


def test_one_dataset_path_as_a_string_is_one_path_not_its_letters():
    """validate('x.yaml') read the string as a list of one-letter paths ('dataset 'c' does
    not exist')."""
    points, _ = capsim.validate("calibration/published/seed000-b70-qwen-27b-swarm.yaml")
    assert points
