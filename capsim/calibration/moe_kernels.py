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

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from capsim.calibration.kernels import (
    MAX_KERNEL_ROWS,
    MAX_KERNEL_US,
    KernelFit,
    KernelPoint,
    fit_points,
    load_json_dataset,
    no_control_characters,
    refuse_repeated_rows,
)
from capsim.catalog.loader import Catalog
from capsim.errors import CapsimUserError
from capsim.files import loads_json, read_input_text
from capsim.physics.deployment import Deployment, default_efficiency
from capsim.physics.efficiency import EfficiencyParams
from capsim.physics.step import StepModel

MOE_KERNEL_FIT = ("moe_bandwidth_efficiency", "moe_layer_overhead_us", "moe_expert_overhead_us")
"""The step-model parameters fused-MoE timings at decode batches identify."""


MIN_MOE_KERNEL_US = 1.0
"""Shortest fused-MoE call a row may give, microseconds: the call is several kernels
(routing, alignment, two grouped GEMMs, the sum), and the published ones take 14.9 us or
more; 1e-300 us was fitted, and the fit reported a MAPE of 1e300%."""

MAX_MOE_SHAPES = 250
"""Most distinct (GPU, model, format, TP shard) shapes a fused-MoE file may hold: a fit
builds a step model for each at every evaluation (about 1 ms each), and 5,000 shapes took
two minutes, 300 about 10 s on two shared cores; the largest stored file has 196."""


class MoeKernelRow(BaseModel):
    """One published timing: one MoE layer's fused-experts call, microseconds. Numbers are
    numbers (strict: 'batch: true' was a batch of 1, '"us": "40"' 40 us)."""

    model_config = ConfigDict(extra="forbid")

    gpu: str
    model: str
    weights: str
    tp_shard: int = Field(strict=True, ge=1, le=1024)
    batch: int = Field(strict=True, ge=1, le=1_000_000)
    us: float = Field(strict=True, ge=MIN_MOE_KERNEL_US, le=MAX_KERNEL_US, allow_inf_nan=False)
    source: int = Field(strict=True, ge=0)  # index into the dataset's sources


class MoeKernelDataset(BaseModel):
    """A fused-MoE timing file: its sources (with quotes), caveats and rows."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: Literal["fused_moe"]
    sources: list[dict[str, str]] = Field(min_length=1)
    caveats: list[str]
    rows: list[MoeKernelRow] = Field(min_length=1, max_length=MAX_KERNEL_ROWS)

    @field_validator("name", "caveats", "sources")
    @classmethod
    def _plain_text(cls, value):
        return no_control_characters(value)

    @model_validator(mode="after")
    def _rows_name_their_sources_once(self):
        """Each row's source is one of ``sources`` (an index past them was taken without a
        word) and no row is given twice (a copy would count twice in the fit)."""
        for i, row in enumerate(self.rows):
            if row.source >= len(self.sources):
                raise ValueError(
                    f"row {i} names source {row.source}, and the file lists "
                    f"{len(self.sources)} source(s) (rows count them from 0)"
                )
        refuse_repeated_rows(self.rows)
        return self


DATASET_KINDS = ("fused_moe",)
"""The values a kernel file's ``kind`` takes (a layer dataset has none)."""


def is_moe_dataset(path: Path) -> bool:
    """Whether a kernel dataset file holds fused-MoE timings; a ``kind`` capsim has no
    reader for is refused naming it (a typo was read as a layer dataset and listed 360
    missing fields)."""
    from capsim.errors import close_matches

    try:
        data = loads_json(read_input_text(path, "kernel dataset"))
    except (CapsimUserError, ValueError):
        return False
    if not isinstance(data, dict) or "kind" not in data:
        return False
    kind = data["kind"]
    if kind not in DATASET_KINDS:
        raise CapsimUserError(
            f"{path}: kind {kind!r} is no kind of kernel dataset capsim reads",
            hint=f"kinds: {', '.join(DATASET_KINDS)}; a layer dataset has no kind",
            suggestions=close_matches(kind, DATASET_KINDS) if isinstance(kind, str) else [],
        )
    return True


def load_moe_dataset(path: Path) -> MoeKernelDataset:
    """Read and validate a fused-MoE dataset (JSON)."""
    return load_json_dataset(path, MoeKernelDataset, "fused-MoE dataset")


def check_moe_rows(ds: MoeKernelDataset, catalog: Catalog, path: Path) -> None:
    """Refuse a row of ``ds`` (read from ``path``) the step model cannot time, naming the
    file, the row and its field: a GPU, model or format the catalog does not have, a model
    without routed experts (a ValueError traceback), a TP shard its heads do not divide; a
    row of another hardware class than the first row's (a fit takes one class's priors);
    and a file of more shapes than MAX_MOE_SHAPES."""
    shapes: dict[tuple[str, str, str, int], int] = {}
    first_class: tuple[int, str] | None = None
    for i, row in enumerate(ds.rows):
        key = (row.gpu, row.model, row.weights, row.tp_shard)
        if key in shapes:
            continue
        shapes[key] = i
        if len(shapes) > MAX_MOE_SHAPES:
            raise CapsimUserError(
                f"{path}: more than {MAX_MOE_SHAPES} shapes (GPU, model, weights, tp_shard) "
                f"by row {i}: a fit builds a step model for each at every evaluation",
                hint="split the file by GPU or model",
            )
        field = "gpu"
        try:
            gpu = catalog.gpu(row.gpu)
            field = "model"
            model = catalog.model(row.model)
            field = "weights"
            fmt = catalog.quant(row.weights)
            if model.moe is None:
                field = "model"
                raise CapsimUserError(
                    f"{model.name} has no routed experts, so no fused-MoE call",
                    hint="name an MoE model (capsim models lists them)",
                )
            field = "tp_shard"
            StepModel(gpu, model, fmt, Deployment(tp=row.tp_shard))
        except CapsimUserError as exc:
            raise CapsimUserError(
                f"{path}: rows.{i}.{field}: {exc.message}",
                hint=exc.hint,
                suggestions=exc.suggestions,
            ) from None
        if first_class is None:
            first_class = (i, gpu.hardware_class)
        elif gpu.hardware_class != first_class[1]:
            raise CapsimUserError(
                f"{path}: rows.{i}.gpu: {gpu.name} is a {gpu.hardware_class} GPU, and row "
                f"{first_class[0]}'s is {first_class[1]}: a fit takes one class's priors",
                hint="split the file by hardware class (capsim gpus shows each GPU's)",
            )


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
