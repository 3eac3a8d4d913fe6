"""Published fused-MoE kernel timings against the step model's MoE terms.

A fused-MoE dataset (``calibration/kernels/*fused-moe*.json``, ``kind: fused_moe``) holds the
times that vLLM's ``benchmarks/kernels/benchmark_moe.py`` and SGLang's
``tuning_fused_moe_triton.py`` print for one MoE layer's fused-experts call at a batch of
tokens (CUDA-graph replays on one GPU), copied from public pull requests with their quotes.
Each row is compared with ``StepModel.fused_moe_seconds`` for the same GPU, model, format and
TP shard: the routed experts' weight read and per-expert cost against their FLOPs, their
elementwise kernels and the call's fixed cost. Fitting the MoE parameters to rows from
several shapes separates them: a few large experts (Mixtral's) pin the read bandwidth, many
small ones (Qwen3-Next's 512 at TP=4) the per-expert cost.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from capsim.calibration.kernels import (
    MAX_KERNEL_ROWS,
    MAX_KERNEL_US,
    KernelFit,
    KernelPoint,
    fit_points,
    load_json_dataset,
)
from capsim.catalog.loader import Catalog
from capsim.errors import CapsimUserError
from capsim.files import loads_json, read_input_text
from capsim.physics.deployment import Deployment, default_efficiency
from capsim.physics.efficiency import EfficiencyParams
from capsim.physics.step import StepModel

MOE_KERNEL_FIT = ("moe_bandwidth_efficiency", "moe_layer_overhead_us", "moe_expert_overhead_us")
"""The step-model parameters fused-MoE timings at decode batches identify."""


class MoeKernelRow(BaseModel):
    """One published timing: one MoE layer's fused-experts call, microseconds."""

    model_config = ConfigDict(extra="forbid")

    gpu: str
    model: str
    weights: str
    tp_shard: int = Field(ge=1, le=1024)
    batch: int = Field(ge=1, le=1_000_000)
    us: float = Field(gt=0, le=MAX_KERNEL_US, allow_inf_nan=False)
    source: int = Field(ge=0)  # index into the dataset's sources


class MoeKernelDataset(BaseModel):
    """A fused-MoE timing file: its sources (with quotes), caveats and rows."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: Literal["fused_moe"]
    sources: list[dict[str, str]]
    caveats: list[str]
    rows: list[MoeKernelRow] = Field(min_length=1, max_length=MAX_KERNEL_ROWS)


def is_moe_dataset(path: Path) -> bool:
    """Whether a kernel dataset file holds fused-MoE timings."""
    try:
        return loads_json(read_input_text(path, "kernel dataset")).get("kind") == "fused_moe"
    except (CapsimUserError, ValueError, AttributeError):
        return False


def load_moe_dataset(path: Path) -> MoeKernelDataset:
    """Read and validate a fused-MoE dataset (JSON)."""
    return load_json_dataset(path, MoeKernelDataset, "fused-MoE dataset")


def hardware_class(ds: MoeKernelDataset, catalog: Catalog) -> str:
    """The one hardware class of a dataset's GPUs (a fit needs one set of priors)."""
    classes = {catalog.gpu(r.gpu).hardware_class for r in ds.rows}
    if len(classes) != 1:
        raise CapsimUserError(f"{ds.name} mixes hardware classes {sorted(classes)}")
    return classes.pop()


def compare_moe_kernels(
    ds: MoeKernelDataset, catalog: Catalog, params: EfficiencyParams | None = None
) -> list[KernelPoint]:
    """Predicted vs measured for every row (params: each GPU's class defaults)."""
    models: dict[tuple[str, str, str, int], StepModel] = {}
    points = []
    for row in ds.rows:
        key = (row.gpu, row.model, row.weights, row.tp_shard)
        if key not in models:
            gpu = catalog.gpu(row.gpu)
            models[key] = StepModel(
                gpu,
                catalog.model(row.model),
                catalog.quant(row.weights),
                Deployment(tp=row.tp_shard),
                params or default_efficiency(gpu, catalog),
            )
        predicted = models[key].fused_moe_seconds(row.batch) * 1e6
        points.append(KernelPoint(row, row.us, predicted))
    return points


def fit_moe_kernel_params(
    ds: MoeKernelDataset,
    catalog: Catalog,
    names: tuple[str, ...] = MOE_KERNEL_FIT,
    base: EfficiencyParams | None = None,
) -> KernelFit:
    """Least-squares fit of ``names`` to every row, on log residuals, from ``base`` (the
    class's priors by default); standard errors from the Jacobian."""
    if base is None:
        hw = hardware_class(ds, catalog)
        base = default_efficiency(next(g for g in catalog.gpus if g.hardware_class == hw), catalog)
    return fit_points(names, base, lambda params: compare_moe_kernels(ds, catalog, params))
