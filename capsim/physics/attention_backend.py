"""Which attention kernels a step runs, and what a Triton attention backend costs beyond an
engine's default kernels.

SGLang and vLLM take ``--attention-backend``; without it they choose per model and GPU
(hardware_db/engines/*.yaml, ``attention_backends``): SGLang serves Gemma 4 with its Triton
backend except on SM100 Blackwell, where it takes trtllm_mha (SGLang PR 25006), because
Gemma 4's 512-wide global heads are beyond FA3's and FlashInfer's kernels. capsim's
attention terms are the default kernels' (``kv_bandwidth_efficiency``,
``attention_compute_efficiency``, the layer floor). A backend the engine's data lists as
Triton reads the KV cache at ``triton_attention_kv_share`` of that bandwidth (a decode step
is bound by those reads) and pays ``triton_attention_layer_us`` more for each softmax
attention layer and step (its split-KV decode kernel and the reduction after it); both are
engine parameters from published A/B runs of the two backends (SGLang's in
hardware_db/engines/sglang.yaml; vLLM's Triton kernels are at parity with its FlashAttention
ones, so vLLM keeps 1 and 0). Prefill attention keeps the default kernels' rate: no
published A/B isolates it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from capsim.errors import CapsimUserError, close_matches

if TYPE_CHECKING:
    from capsim.catalog.engine_schema import AttentionBackends, Engine
    from capsim.catalog.gpu_schema import GPU
    from capsim.catalog.model_schema import Model


def _backends(engine: Engine | None) -> AttentionBackends | None:
    return engine.attention_backends if engine is not None else None


def attention_backend(
    engine: Engine | None, model: Model, gpu: GPU, asked: str | None
) -> str | None:
    """The backend a step runs: ``asked`` (checked against the engine's names), else the
    engine's default for this model type and GPU class; None: the engine's default
    kernels."""
    if asked is not None:
        check_attention_backend(engine, asked)
        check_backend_fits(engine, asked, model, gpu)
        return asked
    backends = _backends(engine)
    if backends is None:
        return None
    return backends.default_for(model.architecture, gpu.hardware_class)


def check_attention_backend(engine: Engine | None, asked: str) -> None:
    """Refuse a backend name the engine's flag does not take (or an engine without the
    flag), naming the flag and the values it takes."""
    backends = _backends(engine)
    name = engine.name if engine is not None else "this engine"
    if backends is None:
        raise CapsimUserError(
            f"--attention-backend: {name} has no attention-backend flag",
            hint="SGLang and vLLM take --attention-backend; llama.cpp picks its kernels "
            "itself (-fa turns flash attention on or off)",
        )
    if asked not in backends.names:
        raise CapsimUserError(
            f"--attention-backend {asked!r} is not one of {name}'s backends",
            hint=f"{backends.flag} takes {', '.join(backends.names)}",
            suggestions=close_matches(asked, backends.names),
        )


def check_backend_fits(engine: Engine, asked: str, model: Model, gpu: GPU) -> None:
    """Refuse a backend whose kernels do not run on this GPU's vendor, an MLA backend for a
    model without multi-head latent attention, or the reverse: the engines refuse them at
    start-up, and capsim costed them as if they ran (issue 47's fuzzing)."""
    backends = engine.attention_backends
    flag = backends.flag
    vendors = backends.vendors.get(asked)
    if vendors is not None and gpu.vendor not in vendors:
        raise CapsimUserError(
            f"{flag} {asked}: {engine.name}'s {asked} kernels run on {', '.join(vendors)} "
            f"GPUs, not on the {gpu.vendor} {gpu.name}",
            hint=f"leave {flag} out for {engine.name}'s own choice on this GPU",
        )
    classes = backends.hardware_classes.get(asked)
    if classes is not None and gpu.hardware_class not in classes:
        raise CapsimUserError(
            f"{flag} {asked}: {engine.name}'s {asked} kernels are built for "
            f"{', '.join(classes)} GPUs, not the {gpu.name} ({gpu.hardware_class})",
            hint=f"leave {flag} out for {engine.name}'s own choice on this GPU",
        )
    mla = model.mla is not None
    if mla and asked in backends.not_mla:
        raise CapsimUserError(
            f"{flag} {asked} cannot run {model.name}'s multi-head latent attention",
            hint=f"one of its MLA backends ({', '.join(backends.mla_only)}), or leave {flag} out",
        )
    if not mla and asked in backends.mla_only:
        raise CapsimUserError(
            f"{flag} {asked} is for models with multi-head latent attention (DeepSeek, "
            f"Kimi); {model.name} has none",
            hint=f"leave {flag} out for {engine.name}'s own choice",
        )


def runs_triton(engine: Engine | None, backend: str | None) -> bool:
    """Whether ``backend`` is one of the engine's Triton attention backends."""
    backends = _backends(engine)
    return backend is not None and backends is not None and backend in backends.triton
