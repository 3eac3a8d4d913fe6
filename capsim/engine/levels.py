"""One load level simulated: its workload, its replicas run (in parts where a level
splits), and its metrics measured (``LevelResult``)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from dataclasses import replace as dataclass_replace
from pathlib import Path

import numpy as np
import simpy
from pydantic import BaseModel, Field

from capsim.catalog.loader import Catalog, process_catalog
from capsim.engine import periodic, request_log
from capsim.engine.config import PredictConfig
from capsim.engine.disaggregation import prefill_pools
from capsim.engine.front_end import level_frontend
from capsim.engine.lengths import parse_length
from capsim.engine.partition import session_affine_groups
from capsim.engine.pool import worker_pool
from capsim.engine.progress import Progress
from capsim.engine.replica import Replica
from capsim.engine.replication import ReplicationJoin, folded_itl, part_seed, replication_parts
from capsim.engine.request_log import ItlLog, RequestLog
from capsim.engine.router import Router
from capsim.engine.setup import Setup, build_setup
from capsim.engine.workloads import Driver, Workload, read_trace
from capsim.errors import CapsimUserError
from capsim.metrics import LevelMetrics, RequestRecord, level_metrics
from capsim.physics.kv_layout import BLOCK_SIZE_TOKENS
from capsim.request_columns import RequestSummary, RequestTable
from capsim.streaming import LogSketch


class LevelResult(BaseModel):
    """One load level: the shared metrics plus what only the simulator knows."""

    level: float
    metrics: LevelMetrics
    peak_kv_usage: float = Field(description="Highest fraction of KV blocks in use")
    preemptions: int
    prefix_cache_hit_rate: float | None
    steps: int
    events: int
    repeated_requests: int = Field(
        0,
        description="Requests laid down as copies of a repeating steady-state period "
        "instead of simulated (engine/periodic.py); steps and events count them too",
    )
    unsent_requests: int = Field(
        0,
        description="An open loop's requests never sent: arrivals stop once "
        "workloads.MAX_OPEN_BACKLOG requests wait (the server is overloaded and its queue, "
        "and every latency, grows with the run's length; memory stays bounded)",
    )
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
        think_time=parse_length(config.think_time, "--think-time", whole=False),
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
    trace = setup.config.trace if setup.config.workload == "trace" else None
    source = f"the trace {trace}: " if trace else ""
    shorten = (
        "shorten the trace's requests"
        if trace
        else "shorten --input-tokens (or --turns for agents)"
    )
    if workload.max_prompt_tokens >= limit:
        raise CapsimUserError(
            f"{source}prompts of up to {workload.max_prompt_tokens:,.0f} tokens do not fit "
            f"max_model_len {limit:,}",
            hint=f"{shorten}, or raise --max-model-len if the KV cache allows",
        )
    if longest > limit and setup.config.engine == "vllm":
        # vLLM's OpenAI server answers 400 when prompt + max_tokens passes max_model_len
        # ("This model's maximum context length is ..."); capsim serve does as well (SGLang
        # clips max_new_tokens to the context left, llama.cpp stops at its slot's end)
        raise CapsimUserError(
            f"{source}requests of up to {longest:,.0f} tokens (prompt and output) do not fit "
            f"max_model_len {limit:,}: vLLM refuses them",
            hint=(f"{shorten}" if trace else "shorten --input-tokens or --output-tokens")
            + ", or raise --max-model-len if the KV cache allows",
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
    # requests laid down as copies of a repeating period, not simulated (engine/periodic.py)
    skipped_requests: int = 0
    # an open loop's requests never sent once its backlog passed MAX_OPEN_BACKLOG
    unsent_requests: int = 0


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
    indices = list(range(setup.engines)) if replica_indices is None else replica_indices
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
    front: list = replicas
    pools = None
    if setup.prefill is not None:  # disaggregated: the replicas only decode
        pools = prefill_pools(env, setup, replicas, cfg.fast_forward)
        front = [pools]
    router = Router(
        env,
        front,
        cfg.router,
        cfg.router_latency_s,
        cfg.router_capacity_rps,
        setup.step_model.api_server_seconds,
        seed,
    )
    # the log keeps the engine's times (the saturation derivation relies on them); the
    # front end's latency is added to what a client sees in measure_level, in the
    # records, and in requests folded past the buffer
    frontend = level_frontend(setup, workload)
    log = RequestLog(frontend, keep_records, first_rid)
    driver = Driver(env, router, workload, seed, log, agents, first_rid, progress)
    driver.start()
    skipper = None
    if (
        cfg.skip_periods
        and cfg.fast_forward
        and pools is None
        and periodic.applies(workload, replicas, router)
    ):
        skipper = periodic.PeriodSkipper(env, replicas[0], driver, router, log, itl)
        replicas[0].after_finishes = skipper.checkpoint
    for rep in replicas:
        rep.scheduler.on_finish = driver.finished
        rep.clients_react_at_once = driver.reacts_at_once
        if workload.kind == "closed":  # the first burst's arrivals (Scheduler.dry_counts_from)
            rep.scheduler.dry_counts_from = max(1, min(workload.concurrency, workload.requests))
        # as in the whole deployment, so a replica simulated apart counts the same events
        rep.settle_every_step = driver.reacts_at_once and setup.instances > 1
    every = replicas if pools is None else [*replicas, *pools.prefill]
    if pools is not None:
        for rep in pools.prefill:
            rep.clients_react_at_once = driver.reacts_at_once
            rep.settle_every_step = driver.reacts_at_once
    env.run()
    for rep in every:
        rep.scheduler.sync_requests()
    logged = driver.close()
    itl_values, itl_weights, itl_sketch = itl.close()
    kvs = [rep.scheduler.kv for rep in every]
    alone = replicas[0].scheduler if len(every) == 1 else None
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
        preemptions=sum(rep.scheduler.preemptions for rep in every),
        steps=sum(rep.steps for rep in every),
        events=sum(rep.events for rep in every),
        dry_at=None if alone is None else alone.dry_at,
        finish_order=None if alone is None else logged.finish_order,
        skipped_requests=0 if skipper is None else skipper.skipped_requests,
        unsent_requests=driver.unsent,
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
    return measure_level(runs, workload, keep_records, started, level_frontend(setup, workload))


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
    # each replica has its own API server (Router), so replicas a session-affine router
    # keeps apart never interact
    if partition and setup.prefill is None:
        groups = session_affine_groups(
            workload, setup.engines, cfg.router, cfg.router_latency_s, cfg.router_capacity_rps
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
    join = ReplicationJoin(workload.requests, level_frontend(setup, workload))
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
        repeated_requests=sum(run.skipped_requests for run in runs),
        unsent_requests=sum(run.unsent_requests for run in runs),
        sim_seconds=time.perf_counter() - started,
        records=[r for run in runs for r in run.records] if keep_records else None,
    )


def level_requests(workload: Workload) -> int:
    """Requests one level sends (agents: agents x turns, and the orchestrator's two; a
    trace: its records)."""
    if workload.kind == "agents":
        return (workload.concurrency or 0) * workload.turns + 2 * workload.orchestrator
    if workload.kind == "trace":
        return len(workload.trace or [])
    return workload.requests


def catalog_dirs(catalog: Catalog | None) -> list[Path] | None:
    """The user directories of a catalog (the built-in one is found again in a worker)."""
    if catalog is None:
        return None
    return catalog.directories[1:]
