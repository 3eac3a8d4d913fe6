"""Published measurements as data (calibration/published/*.yaml), and their schema.

Each file is one source: its quotes, the workload it measured, what it leaves unknown,
and scenarios (hardware, deployment, engine flags) with measured points. A point names a
capsim metric (see capsim.metrics) and quotes the text it was read from.
"""

from __future__ import annotations

import math
from collections.abc import Container
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from capsim.calibration.paths import calibration_dir
from capsim.calibration.point_order import check_point_order
from capsim.catalog.loader import (
    annotation_kinds,
    format_validation_error,
    load_yaml_text,
    stands_for_a_number,
)
from capsim.catalog.schemas import Source
from capsim.engine.lengths import length_field
from capsim.engine.limits import MAX_CONTEXT_TOKENS, MAX_ENGINE_COUNT, MAX_GPUS
from capsim.engine.workloads import GAMMA_CV_RANGE
from capsim.errors import CapsimUserError, close_matches

POINT_METRICS = (
    "output_tok_s",
    "per_request_output_tok_s",
    "total_tok_s",
    "request_throughput_rps",
    "ttft_s",
    "tpot_s",
    "itl_s",
    "e2e_s",
    "decode_tok_s",
    "prompt_tok_s",
)
"""What a published point can measure: capsim level metrics (tokens/s, requests/s), TTFT,
TPOT, ITL and end-to-end latency in seconds (with a ``statistic``), a request's decode rate
(1 / TPOT) and its prompt rate (input tokens / TTFT)."""

STATISTICS = ("mean", "median", "p90", "p99")
"""Which statistic of a per-request latency a point quotes."""

ENGINES = ("vllm", "sglang", "llama.cpp", "trt-llm", "other")
"""Serving engines a measured scenario can name."""


def one_of(value: str, allowed: tuple[str, ...], what: str) -> str:
    """``value`` if it is one of ``allowed``, else a validation error naming them."""
    if value not in allowed:
        raise ValueError(f"unknown {what} '{value}'; known: {', '.join(allowed)}")
    return value


MIN_MEASURED = 1e-6
"""Smallest measured value a point may hold, in its metric's unit (tok/s, s, requests/s):
no published figure comes near a millionth, and 1e-300 tok/s made an error of 1e300%."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, value, info):
        """A YAML true or false where a number goes is refused: pydantic reads true as 1, so
        'value: true' was a measurement of 1.0 and 'tp: true' ran at TP 1 (issue 47)."""
        if isinstance(value, bool) and stands_for_a_number(
            value, annotation_kinds(cls.model_fields[info.field_name].annotation)
        ):
            raise ValueError(
                "a boolean where a number goes (YAML reads true and false, yes and no as "
                "booleans): write the number"
            )
        return value


def short_text(text: str, most: int = 24) -> str:
    """``text`` as an error quotes it: cut to ``most`` characters with '...' (a 400-digit
    number filled the terminal)."""
    return text if len(text) <= most else text[: most - 3] + "..."


LATENCY_POINT_METRICS = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
"""Point metrics that are per-request latencies, the ones a statistic other than the mean
applies to."""


class MeasuredPoint(Strict):
    concurrency: int = Field(
        strict=True,  # 'concurrency: true' read as 1
        ge=1,
        le=100_000,  # predict's -c limit
        description="The load level: clients of a closed loop, or an open workload's "
        "arrival rate (requests per second, a whole number)",
    )
    metric: str
    value: float = Field(ge=MIN_MEASURED, le=1e12, allow_inf_nan=False)
    statistic: str = Field(
        "mean", description="For latencies: which statistic the source quotes (see STATISTICS)"
    )
    quote: str
    note: str | None = None

    @field_validator("statistic")
    @classmethod
    def _known_statistic(cls, v: str) -> str:
        return one_of(v, STATISTICS, "statistic")

    @field_validator("metric")
    @classmethod
    def _known(cls, v: str) -> str:
        return one_of(v, POINT_METRICS, "metric")

    @model_validator(mode="after")
    def _statistic_of_a_latency(self) -> MeasuredPoint:
        """A median or a p99 is a statistic of per-request latencies; a throughput is one
        figure for the run (p99 on output_tok_s was taken as its mean)."""
        if self.statistic != "mean" and self.metric not in LATENCY_POINT_METRICS:
            raise ValueError(
                f"statistic {self.statistic} applies to a latency "
                f"({', '.join(LATENCY_POINT_METRICS)}), not to {self.metric}"
            )
        return self


WORKLOAD_KINDS = ("batch", "closed", "agents", "open", "trace")
"""What a dataset's workload.kind can be (engine.workloads.WorkloadKind)."""


SCENARIO_FLAGS: dict[str, type] = {
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "max_model_len": int,
    "gpu_memory_utilization": float,
    "enforce_eager": bool,
    "async_scheduling": bool,
    "disable_custom_all_reduce": bool,
    "offline": bool,
    "ubatch_tokens": int,
    "cpu_moe_layers": int,
    "enable_expert_parallel": bool,
    "enable_dp_attention": bool,
    "host_memory_bandwidth_gbs": float,
    "scheduler_recv_interval": int,
    "enable_mixed_chunk": bool,
    "schedule_conservativeness": float,
    "prefill_replicas": int,
    "prefill_tp": int,
    "kv_transfer_gbs": float,
    "attention_backend": str,
    "flash_attn": bool,
}
"""The server flags a scenario may record, as compare.scenario_config applies them, and the
kind of value each takes (a flag capsim does not simulate was dropped without a word, and
max_num_seqs 2.5 ran as 2)."""

MAX_POWER_LIMIT_W = 10_000.0
"""Largest board power limit a scenario may state, W (the largest GPU's TDP is about 1.4 kW)."""

MAX_DATASET_REQUESTS = 50_000
"""Most requests per level a dataset may state: validate simulates every one, and 10
million at each level ran for hours (issue 47); the corpus's largest is 5,400, and a
measured level's median and mean settle long before 50,000."""

OutputMean = Annotated[float, Field(gt=0, le=MAX_CONTEXT_TOKENS, allow_inf_nan=False)]
"""A mean output length, tokens: positive and at most the longest context."""


class Scenario(Strict):
    name: str = Field(min_length=1, max_length=200, pattern=r"\S")
    engine: str = Field("vllm", description="Serving engine that was measured (see ENGINES)")
    engine_version: str | None = None
    backend: str | None = Field(
        None,
        min_length=1,
        max_length=40,
        description="The compute backend the engine was built for where it has a choice "
        "(llama.cpp: vulkan, cuda, rocm, sycl, metal; as --engine ENGINE:BACKEND); None: "
        "the GPU vendor's own",
    )
    input_tokens: str | None = Field(
        None, description="This scenario's prompt length where it differs from the workload's"
    )
    output_tokens: str | None = Field(
        None, description="This scenario's output length where it differs from the workload's"
    )
    gpu: str
    model: str
    quant: str
    tp: int = Field(1, ge=1, le=MAX_GPUS)
    dp: int = Field(1, ge=1, le=MAX_GPUS)
    interconnect: str = "auto"
    kv_dtype: str = "auto"
    spec: str | None = None
    spec_acceptance: float | list[float] | None = Field(
        None, description="Acceptance rate, or one per draft position (as --spec-acceptance)"
    )
    power_limit_w: float | None = Field(None, gt=0, le=MAX_POWER_LIMIT_W, allow_inf_nan=False)
    flags: dict[str, float | int | bool | str] = Field(default_factory=dict)
    output_mean_tokens: OutputMean | None = None
    output_mean_tokens_by_level: dict[int, OutputMean] = Field(
        default_factory=dict,
        description="Mean output per request at particular concurrency levels, where the "
        "source's figures give it (else output_mean_tokens)",
    )
    kv_capacity_tokens: int | None = Field(
        None,
        ge=1,
        le=MAX_ENGINE_COUNT,
        description="The server's KV cache size when known (e.g. from a probe)",
    )
    router: str | None = Field(
        None,
        description="How the source spread requests over its replicas (as --router: "
        "round_robin, random for a Kubernetes ClusterIP Service, least_outstanding, "
        "prefix_aware); None: round_robin",
    )
    output_note: str | None = None
    points: list[MeasuredPoint] = Field(min_length=1)  # an empty list was dropped unsaid

    @model_validator(mode="after")
    def _output_means_of_measured_levels(self) -> Scenario:
        """output_mean_tokens_by_level names levels this scenario measured (a key of -4,
        true or a level never measured took the place of the real one without a word)."""
        measured = {p.concurrency for p in self.points}
        if not measured:  # no point at all: validate says so for the whole dataset
            return self
        stray = sorted(set(self.output_mean_tokens_by_level) - measured, key=str)
        if stray:
            raise ValueError(
                f"output_mean_tokens_by_level names level(s) "
                f"{', '.join(short_text(str(v)) for v in stray)} that "
                f"no point measures (levels: {', '.join(map(str, sorted(measured)))})"
            )
        return self

    @model_validator(mode="after")
    def _latencies_in_order(self) -> Scenario:
        """Percentiles in order and TTFT by E2E at each level (calibration/point_order)."""
        check_point_order(self.name, self.points)
        return self

    @field_validator("output_mean_tokens_by_level", mode="before")
    @classmethod
    def _levels_are_numbers(cls, v):
        """Keys are concurrency levels written as numbers: a quoted '4' beside 4 was read
        as the same level, one value silently replacing the other."""
        if isinstance(v, dict):
            for key in v:
                if isinstance(key, bool) or not isinstance(key, int):
                    raise ValueError(
                        f"level {short_text(repr(key))} is not a whole number; write the "
                        "concurrency level unquoted, e.g. 4: 180.5"
                    )
        return v

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, v: str) -> str:
        return one_of(v, ENGINES, "engine")

    @field_validator("router")
    @classmethod
    def _known_router(cls, v: str | None) -> str | None:
        from capsim.engine.router import ROUTER_POLICIES

        return v if v is None else one_of(v, ROUTER_POLICIES, "router")

    @field_validator("input_tokens", "output_tokens")
    @classmethod
    def _length(cls, v: str | None, info) -> str | None:
        return length_field(v, f"the scenario's {info.field_name}")

    @model_validator(mode="after")
    def _router_needs_replicas(self) -> Scenario:
        """A router spreads requests over replicas: on a scenario of one it would change
        nothing, as --router on one replica is refused."""
        if self.router is not None and self.dp < 2:
            raise ValueError(f"router: {self.router} needs replicas (dp 2 or more), dp is 1")
        return self

    @field_validator("flags")
    @classmethod
    def _known_flags(cls, flags: dict) -> dict:
        for name, value in flags.items():
            kind = SCENARIO_FLAGS.get(name)
            if kind is None:
                near = close_matches(name, list(SCENARIO_FLAGS))
                raise ValueError(
                    f"unknown server flag '{name}'"
                    + (f" (did you mean {near[0]}?)" if near else "")
                    + f"; capsim simulates {', '.join(sorted(SCENARIO_FLAGS))}"
                )
            if kind is bool and not isinstance(value, bool):
                raise ValueError(f"flag {name} is true or false, not {value!r}")
            number = isinstance(value, int | float) and not isinstance(value, bool)
            finite = number and math.isfinite(value)
            if kind is int and not (finite and float(value).is_integer()):
                raise ValueError(f"flag {name} is a whole number, not {value!r}")
            if kind is float and not finite:
                raise ValueError(f"flag {name} is a finite number, not {value!r}")
            if kind is str and not (isinstance(value, str) and value.strip()):
                raise ValueError(f"flag {name} is a name, not {value!r}")
        return flags

    @model_validator(mode="after")
    def _acceptance_needs_a_drafter(self) -> Scenario:
        if self.spec_acceptance is not None and self.spec is None:
            raise ValueError("spec_acceptance is given without a spec (the drafter it rates)")
        return self

    @field_validator("spec")
    @classmethod
    def _spec(cls, v: str | None) -> str | None:
        if v is not None:
            from capsim.physics.speculative import parse_spec

            try:
                parse_spec(v, what="spec")
            except CapsimUserError as exc:
                raise ValueError(exc.message) from None
        return v


class WorkloadDescription(Strict):
    kind: str
    rounds_per_level: int | None = Field(None, ge=1, le=10_000)
    requests_per_level: int | None = Field(None, ge=1, le=MAX_DATASET_REQUESTS)
    input_tokens: str
    output_tokens: str | None = None
    arrival: Literal["poisson", "gamma"] = Field(
        "poisson", description="An open workload's arrivals (as --arrival)"
    )
    gamma_cv: float | None = Field(
        None,
        ge=GAMMA_CV_RANGE[0],
        le=GAMMA_CV_RANGE[1],
        description="With arrival gamma: the gaps' coefficient of variation (as --gamma-cv)",
    )
    decode_context_tokens: int | None = Field(
        None,
        strict=True,  # 'true' is not a token count
        ge=1,
        le=10_000_000,
        description="Where a source measured decoding apart from its prompts (llama-bench's "
        "tg test generates from an empty context, its pp test prefills alone): the prompt "
        "its decode metrics (decode_tok_s) are simulated after, in place of input_tokens; a "
        "scenario with input_tokens of its own (a depth) keeps them",
    )
    quotes: list[str] = Field(default_factory=list)
    unknowns: dict[str, str] = Field(default_factory=dict)

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        return one_of(v, WORKLOAD_KINDS, "workload kind")

    @field_validator("input_tokens", "output_tokens")
    @classmethod
    def _length(cls, v: str | None, info) -> str | None:
        return length_field(v, f"the workload's {info.field_name}")

    @model_validator(mode="after")
    def _arrivals_apply(self) -> WorkloadDescription:
        """arrival and gamma_cv describe an open workload's arrivals, as --arrival and
        --gamma-cv do: given where they change nothing, refused as the flags are."""
        if self.arrival == "gamma" and self.kind != "open":
            raise ValueError(
                f"arrival: gamma describes an open workload's arrivals, not {self.kind}"
            )
        if self.gamma_cv is not None and self.arrival != "gamma":
            raise ValueError("gamma_cv applies to arrival: gamma (poisson gaps have a CV of 1)")
        return self


class PublishedDataset(Strict):
    name: str = Field(min_length=1, max_length=200, pattern=r"\S")
    source: Source
    more_sources: list[Source] = Field(
        default_factory=list, description="Other texts by or about the same measurements"
    )
    workload: WorkloadDescription
    metric_definition: str
    flags_quote: str | None = None
    power_table: dict | None = None
    claims: list[dict] = Field(default_factory=list)
    reference_only: str | None = Field(
        None,
        description="Why this source is shown but left out of the corpus's error summaries "
        "(e.g. an engine generation capsim does not model); None = scored",
    )
    scenarios: list[Scenario]

    @field_validator("scenarios")
    @classmethod
    def _distinct_names(cls, scenarios: list[Scenario]) -> list[Scenario]:
        seen: set[str] = set()
        for sc in scenarios:
            if sc.name in seen:
                raise ValueError(f"scenario '{sc.name}' is listed twice (names tell them apart)")
            seen.add(sc.name)
        return scenarios

    def at_levels(self, levels: Container[int]) -> PublishedDataset:
        """This dataset with only the points measured at ``levels`` (concurrency), e.g. a
        probe's low levels to calibrate on and its high ones to check the prediction."""
        scenarios = [
            s.model_copy(update={"points": [p for p in s.points if p.concurrency in levels]})
            for s in self.scenarios
        ]
        return self.model_copy(update={"scenarios": scenarios})


def published_dir() -> Path:
    return calibration_dir() / "published"


def load_dataset(path: Path) -> PublishedDataset:
    import yaml

    from capsim.files import read_input_text

    text = read_input_text(path, "dataset")
    try:
        data = load_yaml_text(text)
    except yaml.YAMLError as exc:
        raise CapsimUserError(f"cannot read dataset '{path}': {exc}") from None
    try:
        return PublishedDataset.model_validate(data)
    except ValidationError as exc:
        raise CapsimUserError(format_validation_error(path, exc, text)) from None


RUN_METRICS = (
    ("output_tok_s", "mean"),
    ("total_tok_s", "mean"),
    ("ttft_s", "median"),
    ("ttft_s", "mean"),
    ("tpot_s", "mean"),
    ("itl_s", "mean"),
    ("e2e_s", "mean"),
)
"""What a probe run contributes per level: every metric it measured (throughput, and the
latencies of the completed requests as capsim.metrics computes them for the simulator)."""


def run_level_points(m, concurrency: int, run: int) -> list[MeasuredPoint]:
    """The points of one probed level (``m``: its LevelMetrics), one per RUN_METRICS entry
    the level measured."""
    from capsim.calibration.compare import point_value

    points = []
    for metric, statistic in RUN_METRICS:
        value = point_value(m, metric, statistic)
        if not (value > 0 and math.isfinite(value)):
            continue
        unit = "tok/s" if metric.endswith("tok_s") else "s"
        points.append(
            MeasuredPoint(
                concurrency=concurrency,
                metric=metric,
                statistic=statistic,
                value=value,
                quote=f"capsim probe, run {run}: {metric} {statistic} {value:.4g} {unit} "
                f"({m.completed} requests)",
            )
        )
    return points


def run_model_reference(served: str, server: dict, run_dir: Path | None = None) -> str:
    """What a probed model is simulated as: its served name where the catalog knows it,
    else the checkpoint the server reports it loaded (/v1/models 'root': a local folder
    with a config.json, or a Hugging Face id), which the simulator imports. Where that
    folder is not on this machine (a run stored in the repository and read elsewhere), a
    copy of its config.json kept beside the run stands in: ``run_dir/<served>.config.json``,
    else ``run_dir/config.json``."""
    from capsim.catalog.loader import load_catalog
    from capsim.catalog.resolve import looks_like_model_reference

    if load_catalog().models.find(served) is not None:
        return served
    for entry in server.get("models") or []:
        root = entry.get("root")
        if entry.get("id") == served and root and looks_like_model_reference(str(root)):
            return str(root)
    if run_dir is not None:
        for kept in (run_dir / f"{served}.config.json", run_dir / "config.json"):
            if kept.is_file():
                return str(kept)
    return served


FLOAT16_FORMATS = ("bf16", "fp16")
"""The unquantised 16-bit weight formats a server's ``--dtype`` chooses between."""


def served_float_format(engine_flags: dict, model_reference: str) -> str | None:
    """The 16-bit format the server cast an unquantised checkpoint to, where the run states
    the server's ``--dtype`` (as the probe's ``--engine-flag dtype=...`` records it:
    bfloat16, float16, half, bf16 or fp16; vLLM casts bf16/fp16/fp32 weights to it); None
    where it does not (or states float32, a format capsim does not simulate), where the
    checkpoint is quantised (``--dtype`` then sets only its activations) or where the model
    cannot be resolved (the comparison reports that)."""
    from capsim.catalog.hf_quant import DTYPE_NAMES
    from capsim.catalog.loader import load_catalog
    from capsim.catalog.resolve import resolve_into

    flags = {k.lstrip("-").replace("-", "_").lower(): str(v) for k, v in engine_flags.items()}
    raw = flags.get("dtype", "").lower()
    if raw == "float32":  # the server runs fp32, which capsim does not simulate
        return None
    fmt = raw if raw in FLOAT16_FORMATS else DTYPE_NAMES.get(raw)
    if fmt is None:
        return None
    try:
        catalog, (resolved,) = resolve_into(load_catalog(), [model_reference])
        release = catalog.model(resolved.name).dtype
    except CapsimUserError:
        return None
    if resolved.quant or release not in FLOAT16_FORMATS:
        return None
    return fmt


def server_version(server: dict) -> str | None:
    """The release a probed server reported at /version (vLLM: {"version": "0.24.0"}), when
    it is a string; validate and calibrate then simulate that release's engine generation."""
    reported = server.get("version")
    version = reported.get("version") if isinstance(reported, dict) else None
    return (version.strip() or None) if isinstance(version, str) else None


def dataset_from_run(path: Path, accept_failures: bool = False) -> PublishedDataset:
    """A probe run file as a dataset: points per level and run for every metric it
    measured (RUN_METRICS), with
    the deployment the user stated and the KV capacity the server reported. A run with a
    level where too many requests failed is refused unless ``accept_failures``
    (capsim.probe.runfile.check_failure_share)."""
    from capsim.probe.prometheus import acceptance_per_position
    from capsim.probe.runfile import (
        COUNTED_ENGINE_FLAGS,
        check_failure_share,
        engine_count,
        load_run,
    )

    summary, _ = load_run(path, events=False)
    check_failure_share(summary, path, accept_failures)
    h = summary.header
    dep = h.deployment
    if not dep.gpu:
        raise CapsimUserError(
            f"run '{path}' does not say which hardware it measured",
            hint="probe with --gpu NAME (a catalog GPU) so the run can be simulated",
        )

    def count(value, where: str) -> int:
        """A whole number of 1 or more the run file records, or a user error naming it."""
        number = engine_count(value)
        if number is None:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise CapsimUserError(
                f"run '{path}': {where} is {shown}, not a whole number from 1 to 2**31",
                hint="probe again with the engine's flags as the server was started",
            )
        return number

    flags: dict = {}
    for key, value in dep.engine_flags.items():
        name = key.replace("-", "_")
        if name in COUNTED_ENGINE_FLAGS:
            flags[name] = count(value, f"the engine flag {key}")
    cache = h.server.get("cache_config") or {}
    if not isinstance(cache, dict):
        cache = {}  # not vLLM's /metrics cache_config: no KV capacity reported
    capacity = None
    if cache.get("num_gpu_blocks") and cache.get("block_size"):
        capacity = count(cache["num_gpu_blocks"], "the server's num_gpu_blocks") * count(
            cache["block_size"], "the server's block_size"
        )
    if "max_model_len" not in flags and h.server.get("max_model_len"):
        flags["max_model_len"] = count(h.server["max_model_len"], "the server's max_model_len")
    points = [
        point
        for lv in summary.levels
        if lv.metrics.completed and lv.metrics.output_tok_s > 0
        for point in run_level_points(lv.metrics, lv.concurrency, lv.run)
    ]
    if not points:
        raise CapsimUserError(f"run '{path}' has no completed level to calibrate on")
    acceptance = None
    if dep.spec:
        # vLLM's counters over the whole run: accepted tokens at each draft position / drafts
        totals: dict[str, float] = {}
        for lv in summary.levels:
            for key, value in lv.server_deltas.items():
                totals[key] = totals.get(key, 0.0) + value
        acceptance = acceptance_per_position(totals)
    model = run_model_reference(h.model, h.server, path.parent)
    served_by = h.server.get("owned_by") if h.server.get("owned_by") in ENGINES else "vllm"
    try:
        return _run_dataset(path, h, dep, served_by, model, flags, capacity, points, acceptance)
    except ValidationError as exc:
        raise run_field_error(path, exc) from None


def _run_dataset(path, h, dep, served_by, model, flags, capacity, points, acceptance):
    """dataset_from_run's dataset, from what it read of the run."""
    return PublishedDataset(
        name=path.stem,
        source=Source(
            title=f"capsim probe run {path.name}", url=h.url, note=f"started {h.started}"
        ),
        workload=WorkloadDescription(
            kind=h.workload,
            requests_per_level=h.requests_per_level,
            input_tokens=str(h.input_tokens or 1024),
            output_tokens=str(h.output_tokens or 512),
        ),
        metric_definition="capsim's level metrics (capsim.metrics, shared with the simulator): "
        "output and total tok/s, TTFT median and mean, TPOT, ITL and end-to-end mean",
        scenarios=[
            Scenario(
                name=h.model,
                engine=served_by,
                engine_version=server_version(h.server) if served_by == "vllm" else None,
                gpu=dep.gpu,
                model=model,
                quant=dep.quant or served_float_format(dep.engine_flags, model) or "auto",
                tp=dep.tp or 1,
                kv_dtype=dep.kv_dtype or "auto",
                spec=dep.spec,
                spec_acceptance=acceptance,
                flags=flags,
                kv_capacity_tokens=capacity,
                points=points,
            )
        ],
    )


RUN_FIELDS = {
    "kind": "workload",
    "requests_per_level": "requests_per_level",
    "input_tokens": "input_tokens",
    "output_tokens": "output_tokens",
    "gpu": "deployment.gpu",
    "model": "model",
    "quant": "deployment.quant",
    "tp": "deployment.tp",
    "kv_dtype": "deployment.kv_dtype",
    "spec": "deployment.spec",
}
"""A dataset's field -> the run header's field it comes from (dataset_from_run)."""


def run_field_error(path: Path, exc: ValidationError) -> CapsimUserError:
    """A run whose header does not make a dataset: the header field and the problem, in
    the run file's terms (not the flags predict takes)."""
    first = exc.errors()[0]
    loc = [str(part) for part in first["loc"]]
    field = next((RUN_FIELDS[part] for part in reversed(loc) if part in RUN_FIELDS), None)
    where = f"header.{field}" if field else ".".join(loc)
    problem = first["msg"].removeprefix("Value error, ")
    return CapsimUserError(
        f"run '{path}': {where}: {problem[:1].lower() + problem[1:]}",
        hint="a run file is what capsim probe writes; probe again, or mend the field",
    )


def load_published(
    paths: list[Path] | None = None, accept_failures: bool = False
) -> list[PublishedDataset]:
    """Datasets from the given files or directories (default: calibration/published/);
    probe run files (.json) are read as datasets too (``accept_failures`` as
    dataset_from_run's), also from a directory, where a model's config.json kept beside its
    runs (``config.json``, ``NAME.config.json``) is not a run."""
    targets = paths or [published_dir()]
    files: list[Path] = []
    for target in targets:
        if target.is_dir():
            files += sorted(target.glob("*.yaml"))
            files += sorted(f for f in target.glob("*.json") if not f.name.endswith("config.json"))
        elif target.exists():
            files.append(target)
        elif target.is_symlink():
            raise CapsimUserError(
                f"dataset '{target}' is a link to nothing readable (a missing target, or a "
                "loop of links)"
            )
        else:
            raise CapsimUserError(f"dataset '{target}' does not exist")
    if not files:
        raise CapsimUserError("no published datasets found", hint="pass a YAML file or folder")
    seen: dict[Path, Path] = {}
    for f in files:  # a file named twice (or through a folder and by name) counted twice
        key = f.resolve()
        if key in seen:
            raise CapsimUserError(
                f"dataset '{f}' is given twice (also as '{seen[key]}'): its points would "
                "count twice",
                hint="name each file or folder once",
            )
        seen[key] = f
    loaded = [
        dataset_from_run(f, accept_failures) if f.suffix in (".json", ".jsonl") else load_dataset(f)
        for f in files
    ]
    named: dict[str, Path] = {}
    for f, ds in zip(files, loaded, strict=True):  # a copy under another file name
        if ds.name in named:
            raise CapsimUserError(
                f"dataset '{f}' has the name '{ds.name}' that '{named[ds.name]}' has: a "
                "dataset is known by its name (leave-one-source-out, profiles), and a copy's "
                "points would count twice",
                hint="give each dataset its own name: field, or pass one of the two",
            )
        named[ds.name] = f
    return loaded
