"""Kernel-level layer measurements against the step model's GPU terms.

A kernel dataset (``calibration/kernels/*.json``, written by
``benchmarks/gpu/make_kernel_dataset.py`` from the output of ``benchmarks/gpu/decode_layers.py``
and ``prefill_layers.py``) holds the measured GPU time of dense decoder layers on one real
GPU, per tensor-parallel shard, batch size, new tokens per sequence (1 in a decode step, the
prompt in a prefill) and context length. Each row becomes a whole-model figure,
``num_layers x us_per_layer + lm_head_us`` (microseconds), compared with
``StepModel.kernel_seconds`` for the same model, format, TP size and step: the weights,
attention, elementwise and per-layer kernel-floor terms, without host overheads or
communication. Fitting those terms' efficiency parameters to the rows gives measured values
for a hardware class, with standard errors from the Jacobian.

The benchmark's elementwise kernels are its own, so each row is compared with what they
move: a ``fused`` dataset runs vLLM's fused kernels (two add-RMSNorms and SiLU-and-multiply,
with FP8 quantisation fused into them), costed by the step model's elementwise term at the
benchmark's byte count; an ``eager`` dataset runs PyTorch's separate kernels (RMSNorm,
residual adds, SiLU, multiply, FP8 casts), whose time is known from a kernel profile as each
kernel's share of peak bandwidth (``eager_elementwise_shares``) and added as measured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from capsim.calibration.compare import mape
from capsim.calibration.least_squares import bounds_and_start, check_fittable, jacobian_std
from capsim.catalog.loader import Catalog
from capsim.catalog.model_schema import Model
from capsim.errors import CapsimUserError
from capsim.files import loads_json, read_input_text
from capsim.physics.deployment import Deployment, default_efficiency
from capsim.physics.efficiency import EfficiencyParams
from capsim.physics.kv_layout import kv_heads_per_gpu
from capsim.physics.step import StepModel

KERNEL_FIT = (
    "bandwidth_efficiency",
    "kv_bandwidth_efficiency",
    "compute_efficiency",
    "layer_overhead_graph_us",
)
"""The step-model parameters a decode-layer measurement identifies."""

PREFILL_KERNEL_FIT = (
    "prefill_compute_efficiency",
    "attention_compute_efficiency",
    "elementwise_bandwidth_efficiency",
)
"""What prefill rows add: large-M GEMMs, prefill attention and the elementwise kernels."""

DatasetT = TypeVar("DatasetT", bound=BaseModel)

SHORT_CONTEXT = 16
"""Contexts up to this many tokens leave attention negligible (tokens)."""


MAX_KERNEL_US = 1e9
"""Longest kernel time a row may give, microseconds (about 17 minutes): 1e300 was
fitted, and the fit reported a 100% error."""

ACHIEVED_TOLERANCE = 0.01
"""How far a row's stated achieved_gb_s may lie from its bytes over its time (relative):
the benchmark writes it from the same figures, unrounded."""

MAX_BANDWIDTH_FACTOR = 2.0
"""How far above its GPU's datasheet bandwidth a layer row's bytes over its time may lie
(the measured rows reach 0.77-0.90 of it; a layer's weights held in L2 between steps could
pass it a little): a row beyond moves more bytes than the memory can deliver."""

MAX_KERNEL_ROWS = 5_000
"""Most rows a kernel file may hold: a fit simulates every row at every evaluation (the
largest measured files hold 432; 7,480 rows took minutes)."""

MAX_KERNEL_FILE_BYTES = 8 * 2**20
"""Largest kernel or fused-MoE file read, bytes: MAX_KERNEL_ROWS rows of a few hundred
bytes each (the largest stored file, 432 rows, is 240 kB) fit in 8 MiB, and a 64 MiB
file was parsed for seconds before its row count was refused."""


def no_control_characters(value):
    """``value`` (a text, or a list or map of texts) when none holds a control character,
    else a ValueError quoting it: a dataset's name is a table's title, and an escape
    sequence in it reached the terminal (issue 47)."""
    from capsim.catalog.schemas import CONTROL

    if isinstance(value, dict):
        for part in value.values():
            no_control_characters(part)
    elif isinstance(value, list):
        for part in value:
            no_control_characters(part)
    elif isinstance(value, str) and (found := CONTROL.search(value)):
        start = max(0, found.start() - 20)
        raise ValueError(f"holds a control character ({value[start : found.end() + 20]!r})")
    return value


class KernelRow(BaseModel):
    """One measured configuration; times in microseconds, sizes in bytes."""

    model_config = ConfigDict(extra="forbid")

    model: str
    weights: str
    tp_shard: int = Field(ge=1, le=1024)
    batch: int = Field(ge=1, le=1_000_000)
    new_tokens: int = Field(1, ge=1, le=10_000_000)
    context: int = Field(ge=0, le=10_000_000)
    layers_built: int = Field(ge=1, le=10_000)
    us_per_layer: float = Field(gt=0, le=MAX_KERNEL_US, allow_inf_nan=False)
    lm_head_us: float = Field(ge=0, le=MAX_KERNEL_US, allow_inf_nan=False)
    weight_bytes_per_layer: float = Field(ge=0, allow_inf_nan=False)
    kv_bytes_per_layer: float = Field(0.0, ge=0, allow_inf_nan=False)
    achieved_gb_s: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="The layer's bytes over its time, GB/s: (weight_bytes_per_layer + "
        "kv_bytes_per_layer) / us_per_layer, as benchmarks/gpu/decode_layers.py writes it",
    )
    attention_backend: str | None = None
    run: int = Field(ge=0)

    @property
    def bytes_gb_s(self) -> float:
        """The layer's weight and KV bytes over its time, GB/s."""
        return (self.weight_bytes_per_layer + self.kv_bytes_per_layer) / self.us_per_layer / 1e3

    @model_validator(mode="after")
    def _achieved_is_bytes_over_time(self):
        """A stated achieved_gb_s is the row's own bytes over its time (1e12 GB/s beside
        a row that gives 3,000 was taken without a word)."""
        stated, computed = self.achieved_gb_s, self.bytes_gb_s
        if stated is not None and abs(stated - computed) > ACHIEVED_TOLERANCE * computed:
            raise ValueError(
                f"achieved_gb_s is {stated:.6g} GB/s, yet (weight_bytes_per_layer + "
                f"kv_bytes_per_layer) / us_per_layer gives {computed:.6g} GB/s: they must "
                f"agree within {ACHIEVED_TOLERANCE:.0%}"
            )
        return self


def refuse_repeated_rows(rows) -> None:
    """A ValueError naming the first two rows of ``rows`` (pydantic models) with every field
    alike: a copy would count twice in a fit."""
    seen: dict[tuple, int] = {}
    for i, row in enumerate(rows):
        key = tuple(row.model_dump().values())
        if key in seen:
            raise ValueError(
                f"rows {seen[key]} and {i} are the same measurement (every field alike): "
                "a copy would count twice in the fit"
            )
        seen[key] = i


class KernelDataset(BaseModel):
    """A kernel measurement file: where it came from, its caveats, its runs and rows."""

    model_config = ConfigDict(extra="forbid")

    name: str
    gpu: str
    source: dict[str, str]
    caveats: list[str]
    runs: list[dict]
    elementwise: Literal["eager", "fused"] = "eager"
    eager_elementwise_shares: dict[str, float] | None = None
    eager_extra_floor_us: dict[str, float] | None = None
    rows: list[KernelRow] = Field(min_length=1, max_length=MAX_KERNEL_ROWS)
    gemms: list[dict] = []
    attention: list[dict] = []
    profiles: list[dict] = []

    @field_validator("name", "gpu", "source", "caveats")
    @classmethod
    def _plain_text(cls, value):
        return no_control_characters(value)

    @model_validator(mode="after")
    def _eager_terms(self):
        """The eager benchmark's shares name its elementwise kernels, each a share of the
        peak bandwidth (above 0, at most 1), and its extra floors are microseconds of 0 or
        more: a share of an unknown kernel ended in a KeyError, a NaN or negative floor in
        SciPy's 'residuals are not finite'."""
        shares = self.eager_elementwise_shares or {}
        missing = [op for op in EAGER_OPS if shares and op not in shares]
        unknown = sorted(set(shares) - set(EAGER_OPS))
        if unknown or missing:
            raise ValueError(
                f"eager_elementwise_shares names {', '.join(unknown) or 'no'} unknown kernel "
                f"and lacks {', '.join(missing) or 'none'}; it gives one share each of "
                f"{', '.join(EAGER_OPS)}"
            )
        for op, share in shares.items():
            if not (isinstance(share, int | float) and 0 < share <= 1):
                raise ValueError(f"eager_elementwise_shares {op} is {share!r}: a share in (0, 1]")
        for weights, floor in (self.eager_extra_floor_us or {}).items():
            if not (isinstance(floor, int | float) and 0 <= floor <= MAX_KERNEL_US):
                raise ValueError(
                    f"eager_extra_floor_us {weights} is {floor!r}: microseconds from 0 to "
                    f"{MAX_KERNEL_US:g}"
                )
        return self

    @model_validator(mode="after")
    def _runs_of_rows(self):
        """Each row's run is one of ``runs`` (an index past them was an IndexError)."""
        for i, row in enumerate(self.rows):
            if row.run >= len(self.runs):
                raise ValueError(
                    f"row {i} names run {row.run}, and the file lists {len(self.runs)} run(s) "
                    "(rows count their run from 0)"
                )
        return self

    @model_validator(mode="after")
    def _rows_once(self):
        """A row given twice (every field alike, its run too) would count twice in the fit."""
        refuse_repeated_rows(self.rows)
        return self


def load_kernel_dataset(path: Path) -> KernelDataset:
    """Read and validate a kernel dataset (JSON)."""
    return load_json_dataset(path, KernelDataset, "kernel dataset")


def check_row_bandwidths(ds: KernelDataset, catalog: Catalog, path: Path) -> None:
    """Refuse a row of ``ds`` (read from ``path``) whose bytes over its time exceed
    MAX_BANDWIDTH_FACTOR times the datasheet bandwidth of the dataset's GPU (GB/s)."""
    gpu = catalog.gpu(ds.gpu)
    most = MAX_BANDWIDTH_FACTOR * gpu.memory_bandwidth_gb_s
    for i, row in enumerate(ds.rows):
        if row.bytes_gb_s > most:
            field = "achieved_gb_s" if row.achieved_gb_s is not None else "us_per_layer"
            raise CapsimUserError(
                f"{path}: rows.{i}.{field}: the row moves {row.bytes_gb_s:.6g} GB/s "
                f"((weight_bytes_per_layer + kv_bytes_per_layer) / us_per_layer), above "
                f"{MAX_BANDWIDTH_FACTOR:g} x {gpu.name}'s {gpu.memory_bandwidth_gb_s:g} GB/s "
                f"(at most {most:g} GB/s)",
                hint="a layer's time is at least its bytes over the memory's bandwidth",
            )


def load_json_dataset(path: Path, schema: type[DatasetT], what: str) -> DatasetT:
    """Read a JSON file and validate it as ``schema``; a missing or invalid file is a user
    error naming ``what`` it should have been."""
    from pydantic import ValidationError

    from capsim.catalog.loader import format_validation_error

    try:
        text = read_input_text(path, what, max_bytes=MAX_KERNEL_FILE_BYTES)
        return schema.model_validate(loads_json(text))
    except ValidationError as exc:  # one line: the file, the field, the problem
        raise CapsimUserError(f"not a valid {what}: {format_validation_error(path, exc)}") from None
    except ValueError as exc:  # bad JSON (JSONDecodeError)
        raise CapsimUserError(f"{path} is not a valid {what}: {exc}") from None


def usable(row: KernelRow, ds: KernelDataset, catalog: Catalog) -> bool:
    """Whether a row measures the hardware rather than the benchmark's attention kernel.

    The benchmark's attention (torch SDPA) has no split-KV path, so it runs one block per
    (sequence, KV head); with fewer of those than the GPU's multiprocessors and a real
    context, it leaves most of the GPU idle in a way vLLM's decode kernels do not.
    """
    if row.context <= SHORT_CONTEXT or row.new_tokens > 1:
        return True
    sm_count = ds.runs[row.run].get("sm_count", 0)
    return row.batch * kv_heads_per_gpu(catalog.model(row.model), row.tp_shard) >= sm_count


def measured_step_us(row: KernelRow, catalog: Catalog) -> float:
    """Whole-model decode-step GPU time of a row, microseconds."""
    return catalog.model(row.model).num_layers * row.us_per_layer + row.lm_head_us


EAGER_OPS = ("norm", "add", "silu_mul", "fp8_cast")
"""The eager benchmark's elementwise kernels, as named in ``eager_elementwise_shares``."""


def benchmark_elementwise_bytes(model: Model, tp: int, weights: str) -> dict[str, float]:
    """Bytes per token and layer each kind of elementwise kernel of the benchmark moves.

    Fused (``fused``): two add-RMSNorms reading the input and the residual and writing both
    (16 h bytes; with FP8 the normed copy is one byte, 14 h), SiLU-and-multiply reading both
    halves and writing one (6 f; 5 f with FP8) and, with FP8, the cast of attention's output
    (3 q). Eager: RMSNorm read and write (2 x 4 h), two residual adds (2 x 6 h), SiLU (4 f)
    then the multiply (6 f), and with FP8 a cast of each GEMM's input (3 bytes an element).
    h: hidden size, q: query width, f: FFN width, per GPU."""
    h = float(model.hidden_size)
    q = model.num_attention_heads / tp * model.head_dim
    f = (model.intermediate_size or 0) / tp
    fp8 = weights == "fp8"
    fused = (14 * h + 5 * f + 3 * q) if fp8 else (16 * h + 6 * f)
    return {
        "fused": fused,
        "norm": 8 * h,
        "add": 12 * h,
        "silu_mul": 10 * f,
        "fp8_cast": 3 * (2 * h + q + f) if fp8 else 0.0,
    }


def eager_elementwise_seconds(row: KernelRow, ds: KernelDataset, catalog: Catalog) -> float:
    """Time the eager benchmark's elementwise kernels take in a row's whole model (s): each
    kernel's bytes at its measured share of the GPU's peak bandwidth, and the fixed cost of
    the kernels it runs beyond the fused layer's (``eager_extra_floor_us`` a layer, by
    format), which the step model's kernel floor (fitted on fused layers) leaves out."""
    shares = ds.eager_elementwise_shares
    if ds.elementwise != "eager" or not shares:
        return 0.0
    model = catalog.model(row.model)
    per_token = benchmark_elementwise_bytes(model, row.tp_shard, row.weights)
    peak = catalog.gpu(ds.gpu).memory_bandwidth_gb_s * 1e9
    seconds = sum(per_token[op] / (peak * shares[op]) for op in EAGER_OPS if per_token[op])
    floor = (ds.eager_extra_floor_us or {}).get(row.weights, 0.0) * 1e-6
    return (seconds * row.batch * row.new_tokens + floor) * model.num_layers


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
            model = catalog.model(row.model)
            fused = ds.elementwise == "fused"
            per_layer = benchmark_elementwise_bytes(model, row.tp_shard, row.weights)["fused"]
            models[key] = StepModel(
                gpu,
                model,
                catalog.quant(row.weights),
                Deployment(tp=row.tp_shard),
                p,
                elementwise_bytes=per_layer * model.num_layers if fused else 0.0,
            )
        new = np.full(row.batch, row.new_tokens)
        seconds = models[key].kernel_seconds(new, np.full(row.batch, row.context))
        seconds += eager_elementwise_seconds(row, ds, catalog)
        points.append(KernelPoint(row, measured_step_us(row, catalog), seconds * 1e6))
    return points


@dataclass(frozen=True)
class KernelFit:
    values: dict[str, float]
    std: dict[str, float]
    prior: dict[str, float]
    mape_prior: float
    mape_fitted: float
    points: list[KernelPoint]


def default_fit(ds: KernelDataset) -> tuple[str, ...]:
    """What a dataset's rows identify: the decode terms, and with prefill rows the prefill
    GEMM and attention rates, and the elementwise bandwidth where the benchmark's
    elementwise kernels are the fused ones the step model costs."""
    if not any(r.new_tokens > 1 for r in ds.rows):
        return KERNEL_FIT
    prefill = PREFILL_KERNEL_FIT
    if ds.elementwise != "fused":
        prefill = tuple(n for n in prefill if n != "elementwise_bandwidth_efficiency")
    return KERNEL_FIT + prefill


def fit_kernel_params(
    ds: KernelDataset,
    catalog: Catalog,
    names: tuple[str, ...] | None = None,
    weights: tuple[str, ...] | None = None,
) -> KernelFit:
    """Least-squares fit of ``names`` (default: ``default_fit``) to the usable rows
    (optionally only some weight formats), on log residuals; standard errors from the
    Jacobian."""
    names = default_fit(ds) if names is None else names
    sub = ds
    if weights is not None:
        sub = ds.model_copy(update={"rows": [r for r in ds.rows if r.weights in weights]})
    base = default_efficiency(catalog.gpu(ds.gpu), catalog)
    return fit_points(names, base, lambda params: compare_kernels(sub, catalog, params))


def fit_points(
    names: tuple[str, ...],
    base: EfficiencyParams,
    compare: Callable[[EfficiencyParams], list[KernelPoint]],
) -> KernelFit:
    """Least-squares fit of ``names`` from ``base`` to the points ``compare`` gives for a
    parameter set, on log residuals, within the calibration bounds; standard errors from
    the Jacobian."""
    check_fittable(names)
    lower, upper, x0 = bounds_and_start(names, base)
    rows = len(compare(base))
    if rows <= len(names):
        raise CapsimUserError(
            f"{rows} usable row{'s' if rows != 1 else ''} cannot pin {len(names)} parameters "
            f"({', '.join(names)}): a fit needs more rows than parameters (with as many it "
            "passes through every row and reports a false precision)",
            hint="measure more shapes, or fit fewer parameters with --fit",
        )

    def params_for(x) -> EfficiencyParams:
        return base.with_overrides(dict(zip(names, map(float, x), strict=True)))

    def residuals(x) -> np.ndarray:
        return np.array([np.log(p.predicted_us / p.measured_us) for p in compare(params_for(x))])

    from scipy.optimize import least_squares  # heavy: imported where fits run

    result = least_squares(residuals, x0, bounds=(lower, upper), x_scale=upper - lower)
    unseen = [n for n, column in zip(names, result.jac.T, strict=True) if not np.any(column)]
    if unseen:  # its column is 0: the fit reported its prior, with a standard error of 0
        raise CapsimUserError(
            f"no kernel row depends on {', '.join(unseen)} (--fit): these timings cannot say "
            "what it is",
            hint="fit the terms the kernels run (bandwidth, compute, layer and MoE terms); "
            "serving terms come from capsim calibrate on served measurements",
        )
    std = jacobian_std(result.jac, result.fun)
    fitted = compare(params_for(result.x))
    return KernelFit(
        values=dict(zip(names, map(float, result.x), strict=True)),
        std=dict(zip(names, map(float, std), strict=True)),
        prior=dict(zip(names, map(float, x0), strict=True)),
        mape_prior=mape(compare(base)),
        mape_fitted=mape(fitted),
        points=fitted,
    )
