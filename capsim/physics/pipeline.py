"""Pipeline parallelism (vLLM's and SGLang's ``--pipeline-parallel-size``): the model's
layers split into ``pp`` stages, each a TP group of its own.

Memory: a GPU holds its stage's layers (the busiest stage has ceil(layers / pp) of them)
and its KV cache for those layers only, plus the first stage's embeddings (and vision
tower) or the last stage's output head (and MTP module), whichever is larger.

Time: a batch passes the stages one after another, so one step of one batch takes the
whole model's work at the TP size (the step model's time, unchanged) plus the activations
handed from stage to stage: ``(pp - 1) x (hop latency + tokens x hidden x 2 bytes / link)``
(``PipelineTerms``). The engine keeps ``pp`` batches in flight (vLLM V1's batch queue:
``max_concurrent_batches`` = pp), so the stages work on different batches at once:
capsim runs a PP group as ``pp`` engines of its TP size that share its KV cache and
sequence limit in equal parts (engine/setup.py), each step a full pass of the pipeline. One
request alone gains nothing from PP (a pass is as long as at TP alone, plus the hand-offs);
many gain the stages' concurrency.
"""

from __future__ import annotations

import math

from capsim.catalog.gpu_schema import GPU
from capsim.catalog.model_schema import Model
from capsim.errors import CapsimUserError
from capsim.physics.dtypes import ACTIVATION_BYTES
from capsim.physics.kv_layout import KVLayout
from capsim.physics.kv_transfer import kv_transfer_link

LAYER_PARTS = (
    "attention",
    "linear_attention",
    "mlp",
    "experts",
    "router",
    "norms",
    "per_layer_embeddings",
)
"""Weight parts (memory.weight_bytes) that belong to the decoder layers and split over the
stages."""


def check_pipeline(model: Model, pp: int) -> None:
    """A pipeline of more stages than the model has layers is refused."""
    if pp > model.num_layers:
        raise CapsimUserError(
            f"--pipeline-parallel-size {pp} is more stages than {model.name}'s "
            f"{model.num_layers} layers",
            hint=f"at most {model.num_layers}",
        )


def stage_share(model: Model, pp: int) -> float:
    """Share of the decoder layers the busiest stage holds."""
    return math.ceil(model.num_layers / pp) / model.num_layers


def stage_weight_parts(parts: dict[str, float], model: Model, pp: int) -> dict[str, float]:
    """The busiest stage's weight bytes per GPU by component: its share of the layers, and
    the first stage's embeddings and vision tower or the last stage's head, MTP module and
    drafter, whichever weigh more."""
    if pp == 1:
        return parts
    share = stage_share(model, pp)
    out = {k: v * share if k in LAYER_PARTS else v for k, v in parts.items()}
    first = out.get("embeddings", 0.0) + out.get("vision", 0.0)
    last = out.get("lm_head", 0.0) + out.get("mtp", 0.0) + out.get("drafter", 0.0)
    dropped = ("lm_head", "mtp", "drafter") if first >= last else ("embeddings", "vision")
    for key in dropped:
        if key in out:
            out[key] = 0.0
    return out


def stage_layout(layout: KVLayout, model: Model, pp: int) -> KVLayout:
    """The busiest stage's KV layout per GPU: its share of the layers' bytes per token and
    state per sequence (one layer's figures unchanged)."""
    if pp == 1:
        return layout
    share = stage_share(model, pp)
    return KVLayout(
        layout.full_bytes_per_token * share,
        layout.sliding_bytes_per_token * share,
        layout.sliding_window,
        layout.state_bytes_per_sequence * share,
        layout.per_layer_type,
    )


class PipelineTerms:
    """The hand-offs between pipeline stages (mixed into ``StepModel``)."""

    def _init_pipeline(self) -> None:
        dep, p = self.deployment, self.params
        self.pp = dep.pp
        self.pipeline_link_gb_s = 0.0
        self.pipeline_hop_us = 0.0
        if self.pp == 1:
            return
        gpu: GPU = self.gpu
        check_pipeline_link(gpu, self.pp)
        link = kv_transfer_link(gpu, dep.tp * dep.pp)
        self.pipeline_link_gb_s = link.gb_s * p.allreduce_efficiency
        self.pipeline_hop_us = (
            p.hop_latency_nvlink_us if link.kind == "nvlink" else p.hop_latency_pcie_us
        )

    def pipeline_seconds(self, tokens: float) -> float:
        """The activations of ``tokens`` tokens handed over pp - 1 times, seconds."""
        if self.pp == 1:
            return 0.0
        nbytes = tokens * self.model.hidden_size * ACTIVATION_BYTES
        per_hop = self.pipeline_hop_us * 1e-6 + nbytes / (self.pipeline_link_gb_s * 1e9)
        return (self.pp - 1) * per_hop


def check_pipeline_link(gpu: GPU, pp: int) -> None:
    """Pipeline stages hand activations from GPU to GPU: a part that lists no link between
    GPUs (one package sharing its memory with the CPU) cannot run them."""
    if (
        pp > 1
        and gpu.interconnect("pcie") is None
        and not any(link.kind == "nvlink" for link in gpu.interconnects)
    ):
        raise CapsimUserError(
            f"--pipeline-parallel-size {pp} hands each step's activations from one GPU to "
            f"the next, and {gpu.name} lists no link between GPUs in the catalog "
            f"({gpu.memory_type or 'one package'})",
            hint="leave --pipeline-parallel-size out",
        )
