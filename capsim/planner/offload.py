"""What to run when a MoE model does not fit a GPU: llama.cpp keeping the routed experts of
some MoE layers in system RAM (its ``--n-cpu-moe N``), each configuration priced at
measured host memory systems.

``capsim fit`` asks this when the model does not fit on its own. The proposal lists the
fewest offloaded layers that fit (the fastest), every MoE layer offloaded (the most room
for context) and one between, each with the KV cache it leaves and the decode speed of
one request on the reference hosts of the catalog (hardware_db/hosts/, measured figures
with sources) and on the user's own host when ``--host-memory-bandwidth`` gives it. capsim
never guesses the user's host: the reference columns say what a common desktop reaches.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from capsim.catalog.gpu_schema import GPU
from capsim.catalog.host_schema import HostMemory
from capsim.catalog.loader import Catalog
from capsim.catalog.model_schema import Model, QuantFormat

PRICED_CONTEXT_TOKENS = 4096
"""Tokens in the KV cache of the one request a proposal's decode speed is priced at (fewer
where the configuration holds fewer): a short conversation, where the offloaded experts'
reads dominate the step."""


@dataclass
class OffloadOption:
    """One configuration that fits: ``n_cpu_moe`` of ``moe_layers`` MoE layers keep their
    routed experts in system RAM (``experts_in_system_ram_bytes``, bytes); the KV cache it
    leaves on the GPU (tokens); one request's decode speed (tokens/s) by host name (the
    user's own under ``USER_HOST``)."""

    n_cpu_moe: int
    moe_layers: int
    experts_in_system_ram_bytes: float
    kv_capacity_tokens: int
    context_tokens: int
    decode_tok_s: dict[str, float] = field(default_factory=dict)
    command: str = ""


COMMON_GGUF = "gguf-q4_k_m"
"""The weight format an offload proposal uses where the user named none and the release
format has no GGUF form of its own: Q4_K_M, which llama.cpp's GGUF conversion script lists
as "Q4_K_M: medium, balanced quality - recommended" (ggml-org/llama.cpp,
examples/make-ggml.py; the table most published GGUF repositories copy)."""

USER_HOST = "yours"
"""Key of the user's own host (``--host-memory-bandwidth``) in ``decode_tok_s``."""


@dataclass
class OffloadProposal:
    """The configurations that fit, fastest first, the weight format llama.cpp runs, and
    the hosts they are priced at (name -> measured read bandwidth, GB/s)."""

    quant: str
    options: list[OffloadOption]
    hosts: dict[str, float]
    host_labels: dict[str, str]

    @property
    def fewest(self) -> OffloadOption:
        return self.options[0]

    def to_dict(self) -> dict:
        return {
            "quant": self.quant,
            "hosts_gbs": self.hosts,
            "host_labels": self.host_labels,
            "options": [asdict(o) for o in self.options],
            "units": "decode_tok_s: output tokens/s of one request; bandwidths GB/s; bytes",
        }


def offload_layers_to_try(fewest: int, layers: int) -> list[int]:
    """``--n-cpu-moe`` values a proposal shows: the fewest that fit, every MoE layer, and
    the one halfway between (no repeats)."""
    return sorted({fewest, (fewest + layers + 1) // 2, layers})


def propose_offload(
    cat: Catalog,
    gpu: GPU,
    model: Model,
    fmt: QuantFormat,
    tp: int,
    fit_options: dict,
    host_memory_bandwidth: float | None = None,
    chosen: bool = True,
) -> OffloadProposal | None:
    """The llama.cpp offload configurations that fit ``model`` on ``gpu`` (TP ``tp``), in
    the GGUF form of ``fmt`` where the catalog has one; where it has none, ``fmt`` itself
    when the user ``chosen`` it, else llama.cpp's common 4-bit GGUF (``COMMON_GGUF``).
    None when the model has no routed experts, the GPU shares its memory with the CPU, or
    even every MoE layer offloaded does not fit. ``fit_options`` are memory_fit's options
    as the user gave them (KV dtype, context, limits)."""
    from capsim.engine.setup import engine_deployment, engine_fit_options
    from capsim.physics.memory import memory_fit
    from capsim.physics.parameters import parameter_breakdown
    from capsim.physics.step import build_step_model

    if not model.moe or gpu.unified_memory:  # one memory: nothing to keep elsewhere
        return None
    llama = cat.engine("llama.cpp")
    if not fmt.name.startswith("gguf-"):
        gguf = f"gguf-{fmt.name}"  # llama.cpp runs the GGUF file of a format where one exists
        if gguf in cat.quant_formats.entries:
            fmt = cat.quant(gguf)
        elif not chosen and COMMON_GGUF in cat.quant_formats.entries:
            fmt = cat.quant(COMMON_GGUF)
    options = engine_fit_options(llama, gpu, **{**fit_options, "cpu_moe_layers": 0})
    layers = parameter_breakdown(model).moe_layers

    def fit_with(n: int):
        return memory_fit(gpu, model, fmt, tp=tp, **{**options, "cpu_moe_layers": n})

    fits = {}  # memory fits by offloaded layers, the fewest that fit found first
    for n in range(1, layers + 1):
        fits[n] = fit_with(n)
        if fits[n].fits:
            break
    else:
        return None
    fewest = n
    hosts = {h.name: h.read_bandwidth_gbs for h in sorted(cat.hosts, key=_by_bandwidth)}
    labels = {h.name: h.display_name for h in cat.hosts}
    if host_memory_bandwidth:
        hosts = {USER_HOST: host_memory_bandwidth, **hosts}
        labels[USER_HOST] = f"yours ({host_memory_bandwidth:g} GB/s)"
    # the command's bandwidth: the user's, else the middle reference host's (a figure to
    # replace with the host's own), else a placeholder
    reference = sorted(b for name, b in hosts.items() if name != USER_HOST)
    bandwidth = host_memory_bandwidth or (reference[len(reference) // 2] if reference else None)
    command_bandwidth = f"{bandwidth:g}" if bandwidth else "GB/s"
    result = []
    for n in offload_layers_to_try(fewest, layers):
        fit = fits[n] if n in fits else fit_with(n)
        context = min(PRICED_CONTEXT_TOKENS, fit.kv_capacity_tokens)
        speeds = {}
        for name, host_gbs in hosts.items():
            deployment = engine_deployment(
                llama,
                gpu,
                tp=tp,
                quant=fmt.name,
                cpu_moe_layers=n,
                host_memory_bandwidth_gbs=host_gbs,
            )
            step = build_step_model(cat, gpu, model, deployment)
            speeds[name] = 1.0 / step.step_time([1], [context])
        result.append(
            OffloadOption(
                n_cpu_moe=n,
                moe_layers=layers,
                experts_in_system_ram_bytes=fit.experts_in_system_ram_bytes,
                kv_capacity_tokens=fit.kv_capacity_tokens,
                context_tokens=context,
                decode_tok_s=speeds,
                command=(
                    f"capsim predict --gpu {gpu.name} --model {model.name} --quant {fmt.name} "
                    f"--engine llama.cpp --n-cpu-moe {n} --host-memory-bandwidth "
                    f"{command_bandwidth}"
                ),
            )
        )
    return OffloadProposal(quant=fmt.name, options=result, hosts=hosts, host_labels=labels)


def _by_bandwidth(host: HostMemory) -> tuple[float, str]:
    return host.read_bandwidth_gbs, host.name
