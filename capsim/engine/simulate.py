"""The prediction API: simulate a deployment under a workload at several load levels.

``predict(PredictConfig(...))`` returns typed results; the CLI only parses and prints.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import replace as dataclass_replace
from pathlib import Path
from typing import Literal

import numpy as np
import simpy
from pydantic import BaseModel, ConfigDict, Field, field_validator

from capsim.catalog.loader import Catalog, load_catalog, process_catalog, share_with_workers
from capsim.catalog.resolve import looks_like_model_reference, resolve_into
from capsim.catalog.schemas import GPU, Engine, Model, QuantFormat
from capsim.engine import request_log
from capsim.engine.bands import add_corpus_bands, add_profile_bands, propagation_plan
from capsim.engine.lengths import parse_length
from capsim.engine.partition import session_affine_groups
from capsim.engine.pool import worker_pool
from capsim.engine.progress import Progress
from capsim.engine.replica import Replica
from capsim.engine.replication import ReplicationJoin, folded_itl, part_seed, replication_parts
from capsim.engine.request_log import ItlLog, RequestLog
from capsim.engine.reruns import Reruns
from capsim.engine.router import Router, RouterPolicy, takes_time
from capsim.engine.saturation import derive_run, is_saturated, shares_service
from capsim.engine.scheduler import SchedulerConfig
from capsim.engine.workloads import Driver, Workload, WorkloadKind, read_trace
from capsim.errors import CapsimUserError
from capsim.metrics import LevelMetrics, RequestRecord, RequestSummary, RequestTable, level_metrics
from capsim.physics.efficiency import EfficiencyParams
from capsim.physics.memory import (
    BLOCK_SIZE_TOKENS,
    MemoryFit,
    auto_format,
    check_tensor_parallel,
    fit_hint,
    memory_fit,
    require_fit,
)
from capsim.physics.speculative import SpecConfig
from capsim.physics.step import Deployment, StepModel, build_step_model, default_efficiency
from capsim.streaming import LogSketch

MAX_TP = 72
"""The widest tensor-parallel group: the largest NVLink domain (GB200 NVL72)."""

MAX_GPUS = 16_384
"""The most GPUs one prediction simulates (every data-parallel replica is simulated)."""


class PredictConfig(BaseModel):
    """Everything one prediction needs; field names follow the CLI flags."""

    model_config = ConfigDict(extra="forbid")

    gpu: str
    model: str
    quant: str | None = None
    gpus: int | None = Field(None, ge=1, le=MAX_GPUS, description="GPUs in total (default tp x dp)")
    tp: int = Field(1, ge=1, le=MAX_TP)
    dp: int | None = Field(None, ge=1, le=MAX_GPUS, description="Replicas (default gpus / tp)")
    interconnect: str = "auto"
    kv_dtype: str = "auto"
    workload: WorkloadKind = "closed"
    concurrency: list[int] = Field(default_factory=lambda: [1])
    rates: list[float] = Field(default_factory=list, description="Open-loop arrival rates")
    requests: int | None = Field(None, ge=1, description="Requests per level")
    batch_rounds: int = Field(
        4, ge=1, description="Batch workload: rounds per level when --requests is not given"
    )
    input_tokens: str = "1024"
    output_tokens: str = "512"
    turns: int = 4
    think_time: str = "0"
    tool_tokens: str = "256"
    orchestrator: bool = False
    arrival: Literal["poisson", "gamma"] = "poisson"
    gamma_cv: float = 1.0
    trace: str | None = None
    max_num_seqs: int | None = Field(None, ge=1, description="Default: vLLM's for the GPU")
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="Default: vLLM's for the GPU"
    )
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Share of GPU memory the engine may use (None: its own)"
    )
    spec: SpecConfig | None = None
    prefix_caching: bool = True
    power_limit_w: float | None = None
    enforce_eager: bool = False
    async_scheduling: bool | None = Field(
        None,
        description="False = --no-async-scheduling (host work runs between steps); None: "
        "the engine's default",
    )
    custom_allreduce: bool | None = Field(
        None,
        description="False = --disable-custom-all-reduce (NCCL for every all-reduce); None: "
        "the engine's default",
    )
    engine: str = Field("vllm", description="Serving engine (hardware_db/engines/)")
    ubatch_tokens: int | None = Field(
        None, ge=1, description="Physical batch, tokens (llama.cpp's -ub; None: the engine's)"
    )
    scheduler_recv_interval: int = Field(
        1,
        ge=1,
        le=10_000,
        description="SGLang's --scheduler-recv-interval: decode steps between the "
        "scheduler's polls for new requests (1: every step)",
    )
    schedule_conservativeness: float | None = Field(
        None,
        ge=0,
        le=100,
        description="SGLang's --schedule-conservativeness: scales the admission reserve's "
        "starting ratio (0.7 x this, at most 1; 0 reserves nothing for running requests). "
        "None: SGLang's default, 1",
    )
    mixed_chunk: bool = Field(
        False,
        description="SGLang's --enable-mixed-chunk: its prefill chunks share a step with "
        "the decodes (as vLLM's always do) instead of running in batches of their own",
    )
    offline: bool = Field(
        False,
        description="Requests go straight to the engine (llama-bench, vllm bench "
        "throughput/latency, an in-process LLM.generate): no API server, tokenizer or "
        "streaming latency in TTFT and end-to-end time",
    )
    router: RouterPolicy = "round_robin"
    router_latency_s: float = 0.0
    router_capacity_rps: float | None = None
    seed: int = Field(0, ge=0, description="Random seed (a non-negative integer)")
    fast_forward: bool = True
    efficiency_overrides: dict[str, float] = Field(default_factory=dict)
    kv_capacity_tokens: int | None = Field(
        None, ge=BLOCK_SIZE_TOKENS, description="Pin the KV pool size (e.g. from a probe)"
    )
    profile: str = Field(
        "auto",
        description="Calibration profile: auto (the GPU class's, if any), none, a name or a path",
    )

    @field_validator("input_tokens", "output_tokens")
    @classmethod
    def _at_least_one_token(cls, value: str, info) -> str:
        parse_length(value, "--" + info.field_name.replace("_", "-"), minimum=1)
        return value

    def default_requests(self, level: int) -> int:
        """Requests per level when --requests is not given."""
        if self.workload == "batch":
            return self.batch_rounds * level
        return max(8 * level, 32)


@dataclass
class Setup:
    """A deployment ready to simulate: physics, memory fit and engine limits."""

    config: PredictConfig
    gpu: GPU
    model: Model
    fmt: QuantFormat
    step_model: StepModel
    fit: MemoryFit
    scheduler: SchedulerConfig
    num_blocks: int
    dp: int
    max_model_len: int
    quant_reason: str = ""
    profile: object = None  # the calibration Profile applied, if any
    base_params: EfficiencyParams | None = None  # before overrides: what a worker is given


def resolve_format(
    cat: Catalog, gpu: GPU, model: Model, quant: str | None, tp: int, **fit_options
) -> tuple[QuantFormat, str, MemoryFit]:
    """The weight format a deployment runs (``quant``, or with None or "auto" the release
    format if it fits, else the first that does), why, and its memory fit
    (``fit_options`` as memory_fit's)."""
    if quant in (None, "auto"):
        check_tensor_parallel(model, tp)
        fmt, reason = auto_format(gpu, model, cat.quant_formats.entries, tp, **fit_options)
    else:
        fmt, reason = cat.quant(quant), "as requested"
    return fmt, reason, memory_fit(gpu, model, fmt, tp=tp, **fit_options)


OFFLINE_OVERRIDES = {
    "frontend_request_ms": 0.0,
    "api_server_ms_per_request": 0.0,
    "tokenize_us_per_token": 0.0,
}
"""What an offline run (no API server) sets: no front-end latency."""


def resolve_params(
    cat: Catalog,
    gpu: GPU,
    overrides: dict[str, float] | None = None,
    params: EfficiencyParams | None = None,
    engine: Engine | None = None,
    offline: bool = False,
    profile=None,
) -> EfficiencyParams:
    """The efficiency parameters a prediction uses: ``params`` if given, else the
    calibration ``profile``'s (a Profile, resolved by the calibration layer), else the
    class defaults with the engine's priors laid over them; ``overrides`` laid over
    whichever it was, and with ``offline`` no front-end latency."""
    if params is None and profile is not None:
        params = profile.params(cat, gpu.name, engine)
    params = params or default_efficiency(gpu, cat, engine)
    if overrides:
        params = params.with_overrides(overrides)
    if offline:
        params = params.with_overrides(OFFLINE_OVERRIDES)
    return params


def engine_deployment(
    engine: Engine,
    gpu: GPU,
    *,
    tp: int,
    quant: str,
    kv_dtype: str = "auto",
    power_limit_w: float | None = None,
    interconnect: str = "auto",
    enforce_eager: bool = False,
    spec: SpecConfig | None = None,
    async_scheduling: bool | None = None,
    custom_allreduce: bool | None = None,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int | None = None,
    ubatch_tokens: int | None = None,
) -> Deployment:
    """The Deployment of a model served by ``engine`` on a TP group of ``gpu``: its CUDA-
    graph scheme and sizes, physical batch, and the async-scheduling and custom-all-reduce
    defaults the flags (None) leave to it."""
    row = engine.batch_limits(gpu.name, gpu.memory_gb)
    graph_batch = row.cuda_graph_max_batch
    if tp >= 4 and row.cuda_graph_max_batch_tp4 is not None:
        graph_batch = row.cuda_graph_max_batch_tp4
    return Deployment(
        tp=tp,
        quant=quant,
        kv_dtype=kv_dtype,
        power_limit_w=power_limit_w,
        interconnect=interconnect,
        cuda_graphs=not enforce_eager,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        spec=spec,
        async_scheduling=engine.async_scheduling if async_scheduling is None else async_scheduling,
        custom_allreduce=engine.custom_allreduce if custom_allreduce is None else custom_allreduce,
        engine=engine.name,
        graph_capture=engine.graph_capture,
        cuda_graph_max_batch=graph_batch,
        ubatch_tokens=ubatch_tokens or engine.ubatch_tokens,
    )


def engine_fit_options(
    engine: Engine,
    gpu: GPU,
    prefix_caching: bool = True,
    async_scheduling: bool | None = None,
    **options,
) -> dict:
    """memory_fit options with the engine's defaults where ``options`` leave them None:
    its memory share, its default token budget and sequence limit for this GPU, and where
    it keeps hybrid models' recurrent state (a state pool of its own holds one slot per
    request without prefix caching, and with it as many as the engine keeps with its
    overlap scheduler on or, ``async_scheduling`` False, off; None: the engine's default)."""
    row = engine.batch_limits(gpu.name, gpu.memory_gb)
    utilization = options.pop("gpu_memory_utilization", None)
    pool = engine.state_pool
    slots = pool.slots_per_sequence
    overlap = engine.async_scheduling if async_scheduling is None else async_scheduling
    if not overlap and pool.slots_per_sequence_without_overlap is not None:
        slots = pool.slots_per_sequence_without_overlap
    return dict(
        options,
        gpu_memory_utilization=engine.memory_utilization if utilization is None else utilization,
        default_limits=(row.max_num_batched_tokens, row.max_num_seqs),
        state_layout=pool.layout,
        state_share=pool.state_share,
        state_slots_per_sequence=slots if prefix_caching else 1,
    )


def sglang_flag_error(flag: str, engine: str, behaviour: str, leave: str = "out"):
    """The error for one of SGLang's flags given with another ``engine`` (which does
    ``behaviour`` instead)."""
    return CapsimUserError(
        f"{flag} is SGLang's flag; {engine} {behaviour}",
        hint=f"add --engine sglang, or leave {flag} {leave}",
    )


def build_setup(
    config: PredictConfig,
    catalog: Catalog | None = None,
    params: EfficiencyParams | None = None,
    profile=None,
) -> Setup:
    """Resolve names, fit memory and build the step model; reject what vLLM would reject.

    ``params`` replaces the GPU's default efficiency parameters, else the calibration
    ``profile``'s do (a Profile the calibration layer resolved from ``config.profile``;
    the engine does not look profiles up); ``config.efficiency_overrides`` then apply on
    top."""
    cat = catalog or load_catalog()
    if cat.models.find(config.model) is None and looks_like_model_reference(config.model):
        cat, resolved = resolve_into(cat, [config.model])
        config = config.model_copy(update={"model": resolved[0].name})
    gpu = cat.gpu(config.gpu)
    model = cat.model(config.model)
    tp = config.tp
    if config.gpus is not None:
        if config.gpus % tp:
            raise CapsimUserError(
                f"--gpus {config.gpus} is not a multiple of --tp {tp}",
                hint="each data-parallel replica is one TP group of --tp GPUs",
            )
        dp = config.gpus // tp
        if config.dp is not None and config.dp != dp:
            raise CapsimUserError(
                f"--gpus {config.gpus} with --tp {tp} makes {dp} replicas, not --dp {config.dp}"
            )
    else:
        dp = config.dp or 1
    spec = config.spec
    engine = cat.engine(config.engine)
    if config.scheduler_recv_interval > 1 and engine.name != "sglang":
        raise sglang_flag_error(
            "--scheduler-recv-interval", engine.name, "takes new requests every step", "at 1"
        )
    reserve = engine.admission_reserve
    if config.schedule_conservativeness is not None:
        if reserve is None:
            raise sglang_flag_error(
                "--schedule-conservativeness",
                engine.name,
                "admits a request when its prompt fits and reserves nothing for later tokens",
            )
        scaled = min(reserve.init_ratio * config.schedule_conservativeness, 1.0)
        reserve = reserve.model_copy(update={"init_ratio": scaled})
    if config.mixed_chunk and engine.mixes_prefill_and_decode:
        raise sglang_flag_error(
            "--enable-mixed-chunk",
            engine.name,
            "always carries prefill chunks and decodes in one step",
        )
    fit_options = engine_fit_options(
        engine,
        gpu,
        prefix_caching=config.prefix_caching,
        async_scheduling=config.async_scheduling,
        kv_dtype=config.kv_dtype,
        gpu_memory_utilization=config.gpu_memory_utilization,
        max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        enforce_eager=config.enforce_eager,
        include_mtp=spec is not None and spec.method == "mtp",
    )
    fmt, quant_reason, fit = resolve_format(cat, gpu, model, config.quant, tp, **fit_options)
    if not fit.fits:
        require_fit(fit, fit_hint(gpu, model, fmt, list(cat.quant_formats), tp, **fit_options))
    capacity = config.kv_capacity_tokens or fit.kv_capacity_tokens
    num_blocks = capacity // BLOCK_SIZE_TOKENS
    if params is None and profile is not None:
        params = profile.params(cat, gpu.name, engine)
    base_params = params
    params = resolve_params(
        cat, gpu, config.efficiency_overrides, base_params, engine, config.offline
    )
    dep = engine_deployment(
        engine,
        gpu,
        tp=tp,
        quant=fmt.name,
        kv_dtype=config.kv_dtype,
        power_limit_w=config.power_limit_w,
        interconnect=config.interconnect,
        enforce_eager=config.enforce_eager,
        spec=spec,
        async_scheduling=config.async_scheduling,
        custom_allreduce=config.custom_allreduce,
        max_num_seqs=fit.max_num_seqs,
        max_num_batched_tokens=fit.max_num_batched_tokens,
        ubatch_tokens=config.ubatch_tokens,
    )
    step_model = build_step_model(cat, gpu, model, dep, params)
    sched = SchedulerConfig(
        max_num_seqs=fit.max_num_seqs,
        max_num_batched_tokens=fit.max_num_batched_tokens,
        block_size=BLOCK_SIZE_TOKENS,
        decode_width=step_model.decode_width,
        decode_advance=step_model.decode_advance,
        state_blocks=fit.state_blocks_per_sequence,
        recv_interval_steps=config.scheduler_recv_interval,
        mixes_prefill_and_decode=engine.mixes_prefill_and_decode or config.mixed_chunk,
        reserve=reserve,
    )
    max_len = config.max_model_len or fit.max_model_len
    return Setup(
        config,
        gpu,
        model,
        fmt,
        step_model,
        fit,
        sched,
        num_blocks,
        dp,
        max_len,
        quant_reason,
        profile,
        base_params,
    )


def measured_setup(
    step_model,
    kv_capacity_tokens: int,
    max_model_len: int,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 2048,
    config: PredictConfig | None = None,
) -> Setup:
    """A deployment whose step times come from measurement (see
    capsim.calibration.step_table) rather than from the catalog's physics."""
    cfg = config or PredictConfig(gpu="(measured)", model="(measured)")
    sched = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=BLOCK_SIZE_TOKENS,
        decode_width=step_model.decode_width,
        decode_advance=step_model.decode_advance,
    )
    return Setup(
        cfg,
        None,
        None,
        None,
        step_model,
        None,
        sched,
        kv_capacity_tokens // BLOCK_SIZE_TOKENS,
        1,
        max_model_len,
        "measured step times",
    )


class LevelResult(BaseModel):
    """One load level: the shared metrics plus what only the simulator knows."""

    level: float
    metrics: LevelMetrics
    peak_kv_usage: float = Field(description="Highest fraction of KV blocks in use")
    preemptions: int
    prefix_cache_hit_rate: float | None
    steps: int
    events: int
    sim_seconds: float = Field(description="Wall time the simulation took")
    service_of: float | None = Field(
        None,
        description="The saturated level whose simulated service this closed-loop level "
        "shares (only send times differ; engine/saturation.py); None when simulated itself",
    )
    contention: float | None = Field(
        None, description="1 - per-request tok/s at this level / at concurrency 1"
    )
    speedup_vs_serial: float | None = Field(
        None, description="Time to run these requests one at a time / this level's wall clock"
    )
    band_80: dict[str, tuple[float, float]] | None = Field(
        None,
        description="80% prediction band per figure (throughput from a calibration profile "
        "where one applies; otherwise, and for latencies always, from the uncalibrated "
        "model's errors on the published corpus)",
    )
    band_50: dict[str, tuple[float, float]] | None = Field(
        None, description="50% prediction band per figure, from the same sources as band_80"
    )
    band_source: str | None = Field(None, description="Where each band comes from")
    records: list[RequestRecord] | None = None


def make_workload(config: PredictConfig, level: float) -> Workload:
    kind = config.workload
    trace = read_trace(Path(config.trace)) if kind == "trace" and config.trace else None
    concurrency = int(level) if kind in ("batch", "closed", "agents") else None
    requests = config.requests or (
        config.default_requests(int(level)) if concurrency else max(config.requests or 200, 1)
    )
    w = Workload(
        kind=kind,
        concurrency=concurrency,
        requests=requests,
        input=parse_length(config.input_tokens, "--input-tokens"),
        output=parse_length(config.output_tokens, "--output-tokens"),
        rate=float(level) if kind == "open" else None,
        arrival=config.arrival,
        gamma_cv=config.gamma_cv,
        turns=config.turns,
        think_time=parse_length(config.think_time, "--think-time"),
        tool_tokens=parse_length(config.tool_tokens, "--tool-tokens"),
        orchestrator=config.orchestrator,
        trace=trace,
    )
    w.validate()
    return w


def check_lengths(setup: Setup, workload: Workload) -> None:
    """Reject prompts vLLM would reject: longer than max_model_len, or than the KV pool."""
    longest = workload.max_prompt_tokens + workload.max_output_tokens
    limit = setup.max_model_len
    if workload.max_prompt_tokens >= limit:
        raise CapsimUserError(
            f"prompts of up to {workload.max_prompt_tokens:,.0f} tokens do not fit "
            f"max_model_len {limit:,}",
            hint="shorten --input-tokens (or --turns for agents), or raise --max-model-len "
            "if the KV cache allows",
        )
    if longest > setup.num_blocks * BLOCK_SIZE_TOKENS:
        raise CapsimUserError(
            f"one request of up to {longest:,.0f} tokens needs more KV cache than the "
            f"{setup.num_blocks * BLOCK_SIZE_TOKENS:,} tokens this deployment holds",
            hint="use --kv-dtype fp8, more GPUs (--tp) or shorter requests",
        )


@dataclass
class ReplicaRun:
    """What one simulation of some replicas leaves behind, in plain (picklable) data.

    Up to ``request_log.REQUEST_BUFFER`` requests (and ITL samples up to ITL_BUFFER)
    every one is kept: ``requests`` (the engine's times, in the order they were sent),
    ``itl_values`` and ``itl_weights``; beyond, ``summary`` (the client's times) and
    ``itl_sketch`` hold them folded, and the others are None."""

    requests: RequestTable | None
    summary: RequestSummary | None
    records: list[RequestRecord] | None
    itl_values: np.ndarray | None
    itl_weights: np.ndarray | None
    itl_sketch: LogSketch | None
    query_tokens: int
    hit_tokens: int
    peak_kv_usage: float
    preemptions: int
    steps: int
    events: int
    # one replica only: when its queue first ran dry (Scheduler.dry_at), and the indices
    # of ``requests`` in the order they finished (engine/saturation.py)
    dry_at: float | None = None
    finish_order: np.ndarray | None = None


def run_replicas(
    setup: Setup,
    workload: Workload,
    seed: int = 0,
    keep_records: bool = False,
    replica_indices: list[int] | None = None,
    agents: list[int] | None = None,
    first_rid: int = 0,
    progress: Progress | None = None,
) -> ReplicaRun:
    """Simulate ``replica_indices`` (all of the deployment's by default) under the
    workload, or only ``agents`` of an agents workload, to completion (``progress``
    counts the requests as they finish)."""
    cfg = setup.config
    env = simpy.Environment()
    indices = list(range(setup.dp)) if replica_indices is None else replica_indices
    itl = ItlLog(len(indices))
    replicas = [
        Replica(
            env,
            i,
            setup.step_model,
            setup.scheduler,
            setup.num_blocks,
            prefix_caching=cfg.prefix_caching,
            fast_forward=cfg.fast_forward,
            itl=itl,
            itl_slot=slot,
        )
        for slot, i in enumerate(indices)
    ]
    router = Router(
        env,
        replicas,
        cfg.router,
        cfg.router_latency_s,
        cfg.router_capacity_rps,
        setup.step_model.api_server_seconds,
    )
    # the log keeps the engine's times (the saturation derivation relies on them); the
    # front end's latency is added to what a client sees in measure_level, in the
    # records, and in requests folded past the buffer
    frontend = setup.step_model.frontend_parallel_seconds
    log = RequestLog(frontend, keep_records, first_rid)
    driver = Driver(env, router, workload, seed, log, agents, first_rid, progress)
    driver.start()
    for rep in replicas:
        rep.scheduler.on_finish = driver.finished
        rep.clients_react_at_once = driver.reacts_at_once
        if workload.kind == "closed":  # the first burst's arrivals (Scheduler.dry_counts_from)
            rep.scheduler.dry_counts_from = max(1, min(workload.concurrency, workload.requests))
        # as in the whole deployment, so a replica simulated apart counts the same events
        rep.settle_every_step = driver.reacts_at_once and setup.dp > 1
    env.run()
    for rep in replicas:
        rep.scheduler.sync_requests()
    logged = driver.close()
    itl_values, itl_weights, itl_sketch = itl.close()
    kvs = [rep.scheduler.kv for rep in replicas]
    alone = replicas[0].scheduler if len(replicas) == 1 else None
    return ReplicaRun(
        requests=logged.table,
        summary=logged.summary,
        records=logged.records,
        itl_values=itl_values,
        itl_weights=itl_weights,
        itl_sketch=itl_sketch,
        query_tokens=sum(kv.query_tokens for kv in kvs),
        hit_tokens=sum(kv.hit_tokens for kv in kvs),
        peak_kv_usage=max(kv.peak_used / kv.num_blocks for kv in kvs),
        preemptions=sum(rep.scheduler.preemptions for rep in replicas),
        steps=sum(rep.steps for rep in replicas),
        events=sum(rep.events for rep in replicas),
        dry_at=None if alone is None else alone.dry_at,
        finish_order=None if alone is None else logged.finish_order,
    )


def _run_group(args) -> ReplicaRun:
    """``run_replicas`` for one group of a partitioned level, in a worker process."""
    config, extra_dirs, params, workload, seed, keep_records, index, agents, first_rid = args
    setup = build_setup(config, process_catalog(extra_dirs), params)
    return run_replicas(setup, workload, seed, keep_records, [index], agents, first_rid)


def simulate_level(
    setup: Setup,
    workload: Workload,
    seed: int = 0,
    keep_records: bool = False,
    partition: bool = True,
    workers: int = 1,
    catalog: Catalog | None = None,
    progress: Progress | None = None,
) -> LevelResult:
    """Run one level to completion and measure it.

    Replicas that never interact (``partition.session_affine_groups``) are simulated
    apart, in up to ``workers`` processes (``catalog`` is the one ``setup`` came from);
    ``partition=False`` simulates them together. Both give the same results.
    ``progress`` counts the requests simulated in this process as they finish."""
    started = time.perf_counter()
    runs = level_runs(setup, workload, seed, keep_records, partition, workers, catalog, progress)
    return measure_level(
        runs, workload, keep_records, started, setup.step_model.frontend_parallel_seconds
    )


def level_runs(
    setup: Setup,
    workload: Workload,
    seed: int = 0,
    keep_records: bool = False,
    partition: bool = True,
    workers: int = 1,
    catalog: Catalog | None = None,
    progress: Progress | None = None,
) -> list[ReplicaRun]:
    """``simulate_level``'s simulations, before they are measured."""
    check_lengths(setup, workload)
    if keep_records and level_requests(workload) > request_log.REQUEST_BUFFER:
        raise CapsimUserError(
            f"per-request records are kept for at most {request_log.REQUEST_BUFFER:,} "
            f"requests a level, and this one sends {level_requests(workload):,}",
            hint="lower --requests (the metrics alone need no records)",
        )
    cfg = setup.config
    groups = None
    # one API server takes every replica's requests in turn: where its serial work
    # (Router api_server_s) is not zero, the replicas interact through it
    shared_api_server = takes_time(setup.step_model.api_server_seconds)
    if partition and not shared_api_server:
        groups = session_affine_groups(
            workload, setup.dp, cfg.router, cfg.router_latency_s, cfg.router_capacity_rps
        )
    if groups is None:
        parts = [workload.requests] if keep_records else level_parts(workload)
        if len(parts) > 1:
            runs = [replicated_run(setup, workload, parts, seed, workers, catalog, progress)]
        else:
            runs = [run_replicas(setup, workload, seed, keep_records, progress=progress)]
    else:
        # each group's request ids start after the turns of the groups before it
        turns = workload.turns
        firsts = np.cumsum([0] + [len(g) * turns for g in groups[:-1]]).tolist()
        jobs = [
            (index, agents, first)
            for index, (agents, first) in enumerate(zip(groups, firsts, strict=True))
        ]
        if workers > 1 and len(jobs) > 1:
            args = [
                (cfg, catalog_dirs(catalog), setup.base_params, workload, seed, keep_records, *j)
                for j in jobs
            ]
            with worker_pool(min(workers, len(jobs))) as pool:
                runs = list(pool.map(_run_group, args))
        else:
            runs = [
                run_replicas(setup, workload, seed, keep_records, [i], agents, first, progress)
                for i, agents, first in jobs
            ]
    return runs


def level_parts(workload: Workload) -> list[int]:
    """Request counts of the independent replications a level is simulated as (one: the
    level itself; engine/replication.py)."""
    return replication_parts(workload.kind, workload.requests, workload.concurrency)


def _run_part(args) -> ReplicaRun:
    """One replication of a level in a worker process, its ITL samples folded."""
    config, extra_dirs, params, workload, seed = args
    setup = build_setup(config, process_catalog(extra_dirs), params)
    run = folded_itl(run_replicas(setup, workload, seed))
    release_simulation()
    return run


def release_simulation() -> None:
    """Free a finished simulation now: its SimPy processes, replicas and logs hold each
    other in reference cycles that only the cyclic collector frees, and numpy's arrays do
    not count towards its thresholds, so part after part of a replicated level would pile
    up (about 100 bytes a request of every part) before it ran."""
    import gc

    gc.collect()


def replicated_run(
    setup: Setup,
    workload: Workload,
    parts: list[int],
    seed: int,
    workers: int = 1,
    catalog: Catalog | None = None,
    progress: Progress | None = None,
) -> ReplicaRun:
    """A long closed-loop level as independent replications of ``parts`` requests each,
    in up to ``workers`` processes, joined end to end (engine/replication.py)."""
    join = ReplicationJoin(workload.requests, setup.step_model.frontend_parallel_seconds)
    pieces = [
        (dataclass_replace(workload, requests=n), part_seed(seed, k)) for k, n in enumerate(parts)
    ]
    if workers > 1:
        dirs = catalog_dirs(catalog)
        with worker_pool(min(workers, len(pieces))) as pool:
            futures = deque(
                pool.submit(_run_part, (setup.config, dirs, setup.base_params, w, s))
                for w, s in pieces
            )
            for w, _ in pieces:  # in order: each part starts where the last one ended
                join.add(futures.popleft().result())  # and its result is let go
                if progress is not None:
                    progress.advance(w.requests)
    else:
        for w, s in pieces:
            join.add(run_replicas(setup, w, s, progress=progress))
            release_simulation()
    return join.run()


def concat_arrays(arrays: list[np.ndarray]) -> np.ndarray:
    """``arrays`` end to end (the one array itself, not a copy, when there is one)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def measure_level(
    runs: list[ReplicaRun],
    workload: Workload,
    keep_records: bool,
    started: float,
    frontend,
) -> LevelResult:
    """One level's result from the runs of its replicas (all together, or apart), as a
    client sees them: ``frontend(prompt tokens)``, the front end's latency in seconds (API
    server, tokenizer, streaming) less its serial part, which the router simulated as a
    queue, is added to each first token and finish. It does not hold a closed-loop client
    back (a few ms against a request's seconds).

    When every run kept every request and ITL sample, the figures are exact; when any
    run folded them (past request_log's buffers), all runs' are folded together."""
    requests: RequestTable | RequestSummary
    if all(run.requests is not None for run in runs):
        table = RequestTable.concat([run.requests for run in runs])
        requests = table.delayed(frontend(table.input_tokens))
    else:
        requests = RequestSummary()
        for run in runs:
            if run.summary is not None:
                requests.merge(run.summary)
            else:
                requests.add(run.requests.delayed(frontend(run.requests.input_tokens)))
    itl_values: np.ndarray | LogSketch
    itl_weights = None
    if all(run.itl_sketch is None for run in runs):
        itl_values = concat_arrays([run.itl_values for run in runs])
        itl_weights = concat_arrays([run.itl_weights for run in runs])
    else:
        itl_values = LogSketch(weighted=True)
        for run in runs:
            if run.itl_sketch is not None:
                itl_values.merge(run.itl_sketch)
            else:
                itl_values.add(run.itl_values, run.itl_weights)
    level = workload.concurrency if workload.concurrency is not None else workload.rate
    metrics = level_metrics(
        requests,
        concurrency=workload.concurrency,
        workload=workload.kind,
        itl_values=itl_values,
        itl_weights=itl_weights,
    )
    queried = sum(run.query_tokens for run in runs)
    hits = sum(run.hit_tokens for run in runs)
    return LevelResult(
        level=float(level or 0),
        metrics=metrics,
        peak_kv_usage=max(run.peak_kv_usage for run in runs),
        preemptions=sum(run.preemptions for run in runs),
        prefix_cache_hit_rate=hits / queried if queried else None,
        steps=sum(run.steps for run in runs),
        events=sum(run.events for run in runs),
        sim_seconds=time.perf_counter() - started,
        records=[r for run in runs for r in run.records] if keep_records else None,
    )


class PredictResult(BaseModel):
    """A sweep of levels for one configuration."""

    config: PredictConfig
    gpu: str
    model: str
    quant: str
    quant_reason: str
    profile: str | None = None
    profile_path: str | None = Field(None, description="The file the profile was read from")
    replicas: int
    kv_capacity_tokens: int
    max_model_len: int
    levels: list[LevelResult]
    notes: list[str] = Field(
        default_factory=list,
        description="What the reader should know about how far to trust these figures",
    )


def launch_bound_note(setup: Setup) -> str | None:
    """A warning when a single sequence's decode step is bound by the CPU's kernel launches
    (eager mode on a GPU): the per-layer launch cost is the host CPU's, which no GPU name
    tells, and it differs about 2x between published machines (EAGER_LAUNCH_SOURCES)."""
    sm = setup.step_model
    if not setup.config.enforce_eager or sm.params.launch_overlap <= 0:
        return None
    context = max(parse_length(setup.config.input_tokens).mean, 1.0)
    if sm.step([1], [int(context)]).bound != "CPU launches":
        return None
    us = sm.params.layer_overhead_eager_us
    fitted = setup.profile is not None and "layer_overhead_eager_us" in setup.profile.parameters
    origin = f"fitted in profile {setup.profile.name}" if fitted else "a prior"
    return (
        f"decode steps are bound by CPU kernel launches (eager mode, {us:.0f} us a layer, "
        f"{origin}); that cost belongs to the host CPU and differs about 2x between "
        "machines: probe your server and calibrate (capsim probe, capsim calibrate)"
    )


def state_cap_note(setup: Setup) -> str | None:
    """A note when the engine's recurrent-state pool (SGLang's Mamba pool for a hybrid
    model) caps running requests below the batch the flags allow and below the highest
    level asked for: requests above the cap queue."""
    fit = setup.fit
    if fit is None or not fit.state_caps_batch:
        return None
    cap = fit.state_sequence_cap
    levels = sweep_levels(setup.config)
    if setup.config.workload not in ("closed", "batch", "agents") or max(levels) <= cap:
        return None
    slots = fit.state_slots_per_sequence
    return (
        f"the engine's recurrent-state pool ({fit.state_pool_bytes / 2**30:.1f} GiB; a "
        f"request holds {slots} slot{'s' if slots != 1 else ''} of "
        f"{fit.state_bytes_per_sequence / 2**20:.0f} MiB) caps running requests at {cap} "
        "per replica; requests above it queue"
    )


PARALLEL_MIN_REQUESTS = 1_000
"""A sweep with at least this many requests in all runs its levels in parallel processes
(below it, starting processes costs more than it saves). Forked workers start in tens of
milliseconds: on this project's 2-core machine an RTX 3090 sweep of 6 levels and 504
requests took 0.25 s in one process and 0.19 s in two, 1..64 at 8 requests a client
(16,640) 2.16 s and 1.24 s."""


def level_requests(workload: Workload) -> int:
    """Requests one level sends (agents: agents x turns, and the orchestrator's two; a
    trace: its records)."""
    if workload.kind == "agents":
        return (workload.concurrency or 0) * workload.turns + 2 * workload.orchestrator
    if workload.kind == "trace":
        return len(workload.trace or [])
    return workload.requests


def resolve_workers(workers: int | None, levels: int, total_requests: int) -> int:
    """How many processes to use for ``levels`` independent jobs: ``workers`` if given,
    else all cores for big sweeps."""
    if workers is not None:
        return max(1, min(workers, levels))
    if levels < 2 or total_requests < PARALLEL_MIN_REQUESTS:
        return 1
    return max(1, min(os.cpu_count() or 1, levels))


def catalog_dirs(catalog: Catalog | None) -> list[Path] | None:
    """The user directories of a catalog (the built-in one is found again in a worker)."""
    if catalog is None:
        return None
    return catalog.directories[1:]


_lowest_saturated = None  # in a sweep's worker processes: a shared multiprocessing.Array


def _share_lowest_saturated(value) -> None:
    """Worker initializer: the lowest saturated level any worker has found and its
    request count ([level, requests]; level 0: none)."""
    global _lowest_saturated
    _lowest_saturated = value


def closed_level(
    setup: Setup,
    workload: Workload,
    seed: int,
    keep_records: bool,
    progress: Progress | None = None,
    workers: int = 1,
    catalog: Catalog | None = None,
) -> tuple[LevelResult, ReplicaRun | None]:
    """A closed-loop level on one replica, with its run when it is saturated (the levels
    above it with as many requests are derived from that run); a long level's
    replications run in up to ``workers`` processes."""
    started = time.perf_counter()
    (run,) = level_runs(
        setup, workload, seed, keep_records, workers=workers, catalog=catalog, progress=progress
    )
    result = measure_level(
        [run], workload, keep_records, started, setup.step_model.frontend_parallel_seconds
    )
    return result, run if is_saturated(run) else None


def _closed_level_in_worker(args) -> tuple[LevelResult | None, ReplicaRun | None]:
    """``closed_level`` in a worker process. Skipped (None, None) when another worker has
    already found a lower level saturated that ran as many requests (the level is then
    derived from it)."""
    config, extra_dirs, params, workload, keep_records = args
    lowest = _lowest_saturated
    requests = level_requests(workload)
    if lowest is not None:
        with lowest.get_lock():
            level, level_count = lowest[0], lowest[1]
        if 0 < level < workload.concurrency and level_count == requests:
            return None, None
    setup = build_setup(config, process_catalog(extra_dirs), params)
    result, run = closed_level(setup, workload, config.seed, keep_records)
    if run is not None and lowest is not None:
        with lowest.get_lock():
            if lowest[0] == 0 or workload.concurrency < lowest[0]:
                lowest[0], lowest[1] = workload.concurrency, requests
    return result, run


def sweep_saturating(
    setup: Setup,
    config: PredictConfig,
    workloads: list[Workload],
    keep_records: bool,
    pool: Executor | None,
    catalog: Catalog | None,
    params: EfficiencyParams | None,
    progress: Progress | None = None,
    then: Callable[[], None] | None = None,
    workers: int | None = None,
) -> list[LevelResult]:
    """Closed-loop levels on one replica, lowest concurrency first (in ``pool``'s
    workers, made by ``saturating_pool``; None: in this process); once a level is
    saturated, every level above it that runs as many requests is derived from its run
    instead of simulated (engine/saturation.py: the derivation replays the same requests,
    so a level of another count, e.g. the default count that grows with the level, is
    simulated, and becomes the base for the levels above it when it saturates too). With
    a pool, ``then()`` is called once the levels are handed to it (to queue other work
    behind them). Results come back in the given order. Without a pool, a long level's
    replications run in up to ``workers`` processes (None: automatic)."""
    order = sorted(range(len(workloads)), key=lambda i: workloads[i].concurrency)
    results: list[LevelResult | None] = [None] * len(workloads)
    base: ReplicaRun | None = None
    base_level = base_requests = 0
    done = 0  # requests of the levels measured so far

    def measured(i: int) -> None:
        nonlocal done
        done += level_requests(workloads[i])
        if progress is not None:
            progress.settle(done)

    def derived(w: Workload) -> LevelResult:
        started = time.perf_counter()
        result = measure_level(
            [derive_run(base, w.concurrency, setup.step_model.frontend_parallel_seconds)],
            w,
            keep_records,
            started,
            setup.step_model.frontend_parallel_seconds,
        )
        result.service_of = float(base_level)
        return result

    if pool is not None:
        dirs = catalog_dirs(catalog)
        futures = {
            i: pool.submit(
                _closed_level_in_worker, (config, dirs, params, workloads[i], keep_records)
            )
            for i in order
        }
        if then is not None:
            then()
        for i in order:
            if base is not None and level_requests(workloads[i]) == base_requests:
                futures[i].cancel()
                results[i] = derived(workloads[i])
                measured(i)
                continue
            result, run = futures[i].result()
            # a worker skips only levels above a saturated one of the same count, met first
            assert result is not None, "a level below the lowest saturated one was skipped"
            results[i] = result
            if run is not None:
                base, base_level = run, workloads[i].concurrency
                base_requests = level_requests(workloads[i])
            measured(i)
    else:
        for i in order:
            w = workloads[i]
            if base is not None and level_requests(w) == base_requests:
                results[i] = derived(w)
                measured(i)
                continue
            part_workers = resolve_workers(workers, len(level_parts(w)), level_requests(w))
            results[i], run = closed_level(
                setup, w, config.seed, keep_records, progress, part_workers, catalog
            )
            if run is not None:
                base, base_level, base_requests = run, w.concurrency, level_requests(w)
            measured(i)
    return results


@contextmanager
def saturating_pool(jobs: int) -> Iterator[Executor | None]:
    """``jobs`` worker processes for ``sweep_saturating`` (sharing the lowest saturated
    level they find and its request count), or None for one."""
    if jobs <= 1:
        yield None
        return
    lowest = multiprocessing.Array("q", [0, 0])
    with worker_pool(jobs, _share_lowest_saturated, (lowest,)) as pool:
        yield pool


def _simulate_in_worker(args) -> LevelResult:
    config, extra_dirs, params, workload, keep_records = args
    setup = build_setup(config, process_catalog(extra_dirs), params)
    return simulate_level(setup, workload, config.seed, keep_records)


def predict(
    config: PredictConfig,
    catalog: Catalog | None = None,
    keep_records: bool = False,
    params: EfficiencyParams | None = None,
    workers: int | None = None,
    reuse_saturated: bool = True,
    profile=None,
    band_table=None,
    profile_bands: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> PredictResult:
    """Simulate every level of a configuration (concurrency levels, or rates for open).

    Levels are independent simulations; big sweeps run them in parallel processes
    (``workers``: None = automatic, 1 = in this process). Closed-loop levels above a
    saturated one share its service and are derived from it (``reuse_saturated``; see
    engine/saturation.py). Results depend on neither.

    ``profile``: the calibration Profile to apply (None: the class defaults), and
    ``band_table``: the corpus's uncalibrated error bands (None: no corpus bands); the
    calibration layer resolves both (capsim.calibration.applied), the engine looks
    neither up. With a profile, its bands are added unless ``profile_bands`` is False.

    ``progress(done, total)`` is called as the levels' requests are simulated: every few
    thousand requests that finish in this process, and as each level is measured.
    """
    setup = build_setup(config, catalog, params, profile)
    params = setup.base_params
    if catalog is not None:
        share_with_workers(catalog)  # workers forked below need not read the YAML again
    if config.workload == "open" and not config.rates:
        raise CapsimUserError("the open workload needs --rate (one or more, comma-separated)")
    workloads = [make_workload(config, level) for level in sweep_levels(config)]
    for w in workloads:
        check_lengths(setup, w)
    total_requests = sum(level_requests(w) for w in workloads)
    counter = None if progress is None else Progress(progress, total_requests)
    jobs = resolve_workers(workers, len(workloads), total_requests)
    cfg = setup.config
    shared = reuse_saturated and all(
        shares_service(w, setup.dp, cfg.router_latency_s, cfg.router_capacity_rps)
        for w in workloads
    )
    reruns, moves, sampled = None, [], []
    if setup.profile is not None and profile_bands:
        reruns = Reruns(config, catalog, setup)
        moves, sampled = propagation_plan(sweep_levels(config), setup.profile)
        moves = [{}, *moves] if moves else []

    def start_reruns(pool: Executor) -> None:
        if reruns is not None and moves:
            reruns.start(pool, moves, sampled)

    if shared:
        with saturating_pool(jobs) as pool:
            results = sweep_saturating(
                setup,
                config,
                workloads,
                keep_records,
                pool,
                catalog,
                params,
                counter,
                then=lambda: start_reruns(pool),
                workers=workers,
            )
            if reruns is not None:
                reruns.collect()  # before the pool closes
    elif jobs > 1:
        with worker_pool(jobs) as pool:
            levels = pool.map(
                _simulate_in_worker,
                [(config, catalog_dirs(catalog), params, w, keep_records) for w in workloads],
            )
            start_reruns(pool)
            results = []
            for result, w in zip(levels, workloads, strict=True):
                results.append(result)
                if counter is not None:
                    counter.settle(counter.done + level_requests(w))
            if reruns is not None:
                reruns.collect()
    else:
        # one process for the levels: a level whose replicas run apart may use several
        results, done = [], 0
        for w in workloads:
            results.append(
                simulate_level(
                    setup,
                    w,
                    config.seed,
                    keep_records,
                    workers=resolve_workers(workers, setup.dp, level_requests(w)),
                    catalog=catalog,
                    progress=counter,
                )
            )
            done += level_requests(w)
            if counter is not None:
                counter.settle(done)
    add_relative_figures(setup, config, results)
    if band_table is not None:
        add_corpus_bands(results, setup.gpu.hardware_class, band_table)
    if reruns is not None:
        add_profile_bands(results, setup.profile, reruns)
    return PredictResult(
        config=config,
        gpu=setup.gpu.name,
        model=setup.model.name,
        quant=setup.fmt.name,
        quant_reason=setup.quant_reason,
        profile=setup.profile.name if setup.profile is not None else None,
        profile_path=getattr(setup.profile, "path", None),
        replicas=setup.dp,
        kv_capacity_tokens=setup.num_blocks * BLOCK_SIZE_TOKENS,
        max_model_len=setup.max_model_len,
        levels=results,
        notes=[n for n in (launch_bound_note(setup), state_cap_note(setup)) if n]
        + profile_warnings(setup.profile),
    )


def profile_warnings(profile) -> list[str]:
    """The calibration profile's poor-fit warnings, as notes on a prediction that uses it."""
    if profile is None:
        return []
    return [f"profile {profile.name} fits poorly: {w}" for w in profile.warnings]


def sweep_levels(config: PredictConfig) -> list[float]:
    """The levels a prediction simulates: arrival rates for open, one for a trace,
    else concurrencies."""
    if config.workload == "open":
        return list(config.rates)
    if config.workload == "trace":
        return [0.0]
    return [float(c) for c in config.concurrency]


def add_relative_figures(setup: Setup, config: PredictConfig, results: list[LevelResult]):
    """Contention vs concurrency 1 and speedup vs running the same requests serially."""
    if config.workload not in ("batch", "closed") or not results:
        return
    baseline = next((r for r in results if r.level == 1), None)
    if baseline is None:
        n = max(config.requests or 0, 8) if config.workload == "closed" else 4
        base_w = make_workload(config, 1)
        base_w.requests = min(n, 16)
        baseline = simulate_level(setup, base_w, config.seed)
    per_request = baseline.metrics.per_request_output_tok_s.mean
    serial_e2e = baseline.metrics.e2e_s.mean
    for r in results:
        m = r.metrics
        if per_request and m.per_request_output_tok_s.mean is not None:
            r.contention = 1.0 - m.per_request_output_tok_s.mean / per_request
        if serial_e2e and m.wall_s:
            r.speedup_vs_serial = serial_e2e * m.completed / m.wall_s
