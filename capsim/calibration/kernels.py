"""Kernel-level decode measurements against the step model's GPU terms.

A kernel dataset (``calibration/kernels/*.json``, written from the output of
``benchmarks/gpu/decode_layers.py``) holds the measured GPU time of dense decoder layers in a
decode step on one real GPU, per tensor-parallel shard, batch size and context length. Each
row becomes a whole-model figure, ``num_layers x us_per_layer + lm_head_us`` (microseconds),
compared with ``StepModel.kernel_seconds`` for the same model, format, TP size, batch and
context: the weights, attention and per-layer kernel-floor terms, without host overheads or
communication. Fitting those terms' efficiency parameters to the rows gives measured values
for a hardware class, with standard errors from the Jacobian.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from capsim.calibration.compare import mape
from capsim.calibration.fit import bounds_and_start, check_fittable, jacobian_std
from capsim.catalog.loader import Catalog
from capsim.errors import CapsimUserError
from capsim.physics.efficiency import EfficiencyParams
from capsim.physics.memory import kv_heads_per_gpu
from capsim.physics.step import Deployment, StepModel, default_efficiency

KERNEL_FIT = (
    "bandwidth_efficiency",
    "kv_bandwidth_efficiency",
    "compute_efficiency",
    "layer_overhead_graph_us",
)
"""The step-model parameters a decode-layer measurement identifies."""

SHORT_CONTEXT = 16
"""Contexts up to this many tokens leave attention negligible (tokens)."""


class KernelRow(BaseModel):
    """One measured configuration; times in microseconds, sizes in bytes."""

    model_config = ConfigDict(extra="forbid")

    model: str
    weights: str
    tp_shard: int
    batch: int
    context: int
    layers_built: int
    us_per_layer: float
    lm_head_us: float
    weight_bytes_per_layer: float
    kv_bytes_per_layer: float
    achieved_gb_s: float
    run: int


class KernelDataset(BaseModel):
    """A kernel measurement file: where it came from, its caveats, its runs and rows."""

    model_config = ConfigDict(extra="forbid")

    name: str
    gpu: str
    source: dict[str, str]
    caveats: list[str]
    runs: list[dict]
    rows: list[KernelRow]


def load_kernel_dataset(path: Path) -> KernelDataset:
    """Read and validate a kernel dataset (JSON)."""
    try:
        return KernelDataset.model_validate(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        raise CapsimUserError(
            f"no kernel dataset at {path}", hint="see calibration/kernels/"
        ) from None
    except (ValueError, json.JSONDecodeError) as exc:
        raise CapsimUserError(f"{path} is not a valid kernel dataset: {exc}") from None


def usable(row: KernelRow, ds: KernelDataset, catalog: Catalog) -> bool:
    """Whether a row measures the hardware rather than the benchmark's attention kernel.

    The benchmark's attention (torch SDPA) has no split-KV path, so it runs one block per
    (sequence, KV head); with fewer of those than the GPU's multiprocessors and a real
    context, it leaves most of the GPU idle in a way vLLM's decode kernels do not.
    """
    if row.context <= SHORT_CONTEXT:
        return True
    sm_count = ds.runs[row.run].get("sm_count", 0)
    return row.batch * kv_heads_per_gpu(catalog.model(row.model), row.tp_shard) >= sm_count


def measured_step_us(row: KernelRow, catalog: Catalog) -> float:
    """Whole-model decode-step GPU time of a row, microseconds."""
    return catalog.model(row.model).num_layers * row.us_per_layer + row.lm_head_us


@dataclass(frozen=True)
class KernelPoint:
    row: KernelRow
    measured_us: float
    predicted_us: float

    @property
    def error(self) -> float:
        """predicted / measured - 1."""
        return self.predicted_us / self.measured_us - 1.0


def compare_kernels(
    ds: KernelDataset, catalog: Catalog, params: EfficiencyParams | None = None
) -> list[KernelPoint]:
    """Predicted vs measured for every usable row (params: the GPU's class defaults)."""
    gpu = catalog.gpu(ds.gpu)
    p = params or default_efficiency(gpu, catalog)
    models: dict[tuple[str, str, int], StepModel] = {}
    points = []
    for row in ds.rows:
        if not usable(row, ds, catalog):
            continue
        key = (row.model, row.weights, row.tp_shard)
        if key not in models:
            models[key] = StepModel(
                gpu,
                catalog.model(row.model),
                catalog.quant(row.weights),
                Deployment(tp=row.tp_shard),
                p,
            )
        ones = np.ones(row.batch, dtype=int)
        predicted = models[key].kernel_seconds(ones, np.full(row.batch, row.context)) * 1e6
        points.append(KernelPoint(row, measured_step_us(row, catalog), predicted))
    return points


@dataclass(frozen=True)
class KernelFit:
    values: dict[str, float]
    std: dict[str, float]
    prior: dict[str, float]
    mape_prior: float
    mape_fitted: float
    points: list[KernelPoint]


def fit_kernel_params(
    ds: KernelDataset,
    catalog: Catalog,
    names: tuple[str, ...] = KERNEL_FIT,
    weights: tuple[str, ...] | None = None,
) -> KernelFit:
    """Least-squares fit of ``names`` to the usable rows (optionally only some weight
    formats), on log residuals; standard errors from the Jacobian."""
    check_fittable(names)
    sub = ds
    if weights is not None:
        sub = ds.model_copy(update={"rows": [r for r in ds.rows if r.weights in weights]})
    base = default_efficiency(catalog.gpu(ds.gpu), catalog)
    lower, upper, x0 = bounds_and_start(names, base)

    def params_for(x) -> EfficiencyParams:
        return base.with_overrides(dict(zip(names, map(float, x), strict=True)))

    def residuals(x) -> np.ndarray:
        pts = compare_kernels(sub, catalog, params_for(x))
        return np.array([np.log(p.predicted_us / p.measured_us) for p in pts])

    from scipy.optimize import least_squares  # heavy: imported where fits run

    result = least_squares(residuals, x0, bounds=(lower, upper), x_scale=upper - lower)
    std = jacobian_std(result.jac, result.fun)
    fitted = compare_kernels(sub, catalog, params_for(result.x))
    return KernelFit(
        values=dict(zip(names, map(float, result.x), strict=True)),
        std=dict(zip(names, map(float, std), strict=True)),
        prior=dict(zip(names, map(float, x0), strict=True)),
        mape_prior=mape(compare_kernels(sub, catalog, base)),
        mape_fitted=mape(fitted),
        points=fitted,
    )
