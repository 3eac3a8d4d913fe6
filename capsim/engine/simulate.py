"""The prediction API: simulate a deployment under a workload at several load levels.

``predict(PredictConfig(...))`` returns typed results; the CLI only parses and prints.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager

from pydantic import BaseModel, Field

from capsim.catalog.loader import Catalog, process_catalog, share_with_workers
from capsim.engine.bands import add_corpus_bands, add_profile_bands, propagation_plan
from capsim.engine.config import PredictConfig
from capsim.engine.front_end import level_frontend
from capsim.engine.lengths import parse_length
from capsim.engine.levels import (
    LevelResult,
    ReplicaRun,
    catalog_dirs,
    check_lengths,
    level_parts,
    level_requests,
    level_runs,
    make_workload,
    measure_level,
    simulate_level,
)
from capsim.engine.pool import cores_for, worker_pool
from capsim.engine.progress import Progress
from capsim.engine.reruns import Reruns
from capsim.engine.saturation import derive_run, is_saturated, shares_service
from capsim.engine.setup import Setup, build_setup
from capsim.engine.workloads import Workload
from capsim.errors import CapsimUserError
from capsim.physics.efficiency import EfficiencyParams
from capsim.physics.kv_layout import BLOCK_SIZE_TOKENS
from capsim.physics.offload_terms import offload_past_weights


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
    disaggregation: dict | None = Field(
        None,
        description="Disaggregated prefill (--prefill-replicas): the prefill instances, "
        "their KV cache (tokens each), the link prompts' KV crosses (GB/s per GPU, one "
        "direction) and a transfer's time (ms per 1,000 prompt tokens, and fixed ms)",
    )
    admission_lag_steps: int = Field(
        0,
        description="Steps beyond the running one that a request reaching a busy engine "
        "waits before its prefill: 1 with async scheduling (vLLM's batch queue, SGLang's "
        "overlap loop schedule each step when the one before it is launched), else 0",
    )
    notes: list[str] = Field(
        default_factory=list,
        description="What the reader should know about how far to trust these figures",
    )


def generation_note(setup: Setup) -> str | None:
    """Which older release's behaviour the engine was simulated with (--engine NAME@VERSION
    inside a generation's range), so a table never hides that it is not the newest."""
    if setup.engine_generation is None:
        return None
    return (
        f"simulated as {setup.config.engine.partition('@')[0]}'s {setup.engine_generation} "
        "('capsim engines' lists the older releases and what changed)"
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


def resolve_workers(workers: int | None, levels: int, total_requests: int) -> int:
    """How many processes to use for ``levels`` independent jobs: ``workers`` if given,
    else all cores for big sweeps."""
    if workers is not None:
        return max(1, min(workers, levels))
    if levels < 2 or total_requests < PARALLEL_MIN_REQUESTS:
        return 1
    return cores_for(levels)


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
    result = measure_level([run], workload, keep_records, started, level_frontend(setup, workload))
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
    results: list[LevelResult | None] | None = None,
) -> list[LevelResult]:
    """Closed-loop levels on one replica, lowest concurrency first (in ``pool``'s
    workers, made by ``saturating_pool``; None: in this process); once a level is
    saturated, every level above it that runs as many requests is derived from its run
    instead of simulated (engine/saturation.py: the derivation replays the same requests,
    so a level of another count, e.g. the default count that grows with the level, is
    simulated, and becomes the base for the levels above it when it saturates too). With
    a pool, ``then()`` is called once the levels are handed to it (to queue other work
    behind them). Results come back in the given order. Without a pool, a long level's
    replications run in up to ``workers`` processes (None: automatic). ``results``, when
    given (one None a level), is filled as levels finish, so a caller stopped part-way
    keeps those."""
    order = sorted(range(len(workloads)), key=lambda i: workloads[i].concurrency)
    if results is None:
        results = [None] * len(workloads)
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
        frontend = level_frontend(setup, w)
        result = measure_level(
            [derive_run(base, w.concurrency, frontend)], w, keep_records, started, frontend
        )
        result.service_of = float(base_level)
        return result

    if pool is not None:
        dirs = catalog_dirs(catalog)
        futures = {
            i: pool.submit(
                _closed_level_in_worker, (config, dirs, params, workloads[i], keep_records)
            )
            for i in likely_saturated_first(setup, workloads, order)
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


def likely_saturated_first(setup: Setup, workloads: list[Workload], order: list[int]) -> list[int]:
    """``order`` (levels by concurrency) with the level most likely to be the lowest
    saturated one moved to the front, so that worker processes learn early which levels
    above it they need not simulate (a hint for the order of work only: which levels are
    derived is decided by the levels' own runs). The guess: the lowest level whose first
    burst of prompts cannot all hold their KV blocks at once, or that is above
    max_num_seqs."""
    if len(order) < 3:
        return order
    block = setup.scheduler.block_size
    prompt_blocks = max(math.ceil(workloads[order[0]].input.mean / block), 1)
    guess = min(setup.num_blocks // prompt_blocks, setup.scheduler.max_num_seqs + 1)
    first = next((i for i in order if workloads[i].concurrency >= guess), None)
    if first is None or first == order[0]:
        return order
    return [first, *(i for i in order if i != first)]


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
    relative_figures: bool = True,
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
    ``relative_figures``: each level's contention and speedup against concurrency 1
    (simulating a short baseline where the levels lack it); False leaves them None.
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
        shares_service(w, setup.instances, cfg.router_latency_s, cfg.router_capacity_rps)
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

    # each level's result as it finishes (sweep order), kept when the sweep is stopped
    finished: list[LevelResult | None] = [None] * len(workloads)
    try:
        if shared:
            with saturating_pool(jobs) as pool:
                sweep_saturating(
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
                    results=finished,
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
                for i, (result, w) in enumerate(zip(levels, workloads, strict=True)):
                    finished[i] = result
                    if counter is not None:
                        counter.settle(counter.done + level_requests(w))
                if reruns is not None:
                    reruns.collect()
        else:
            # one process for the levels: a level whose replicas run apart may use several
            done = 0
            for i, w in enumerate(workloads):
                finished[i] = simulate_level(
                    setup,
                    w,
                    config.seed,
                    keep_records,
                    workers=resolve_workers(workers, setup.dp, level_requests(w)),
                    catalog=catalog,
                    progress=counter,
                )
                done += level_requests(w)
                if counter is not None:
                    counter.settle(done)
    except BaseException as exc:  # Ctrl-C (or workers ended by it): keep what finished
        kept = [r for r in finished if r is not None]
        if kept and not isinstance(exc, CapsimUserError):
            if band_table is not None:
                add_corpus_bands(kept, setup.gpu.hardware_class, band_table)
            exc.capsim_partial = predict_result(setup, config, kept)
            exc.capsim_partial_text = f"{len(kept)} of {len(workloads)} levels"
        raise
    results = [r for r in finished if r is not None]
    if relative_figures:
        add_relative_figures(setup, config, results)
    if band_table is not None:
        add_corpus_bands(results, setup.gpu.hardware_class, band_table)
    if reruns is not None:
        add_profile_bands(results, setup.profile, reruns)
    return predict_result(setup, config, results)


def predict_result(setup: Setup, config: PredictConfig, results: list[LevelResult]):
    """A configuration's PredictResult from its levels' results."""
    mapped = setup.config
    if (mapped.tp, mapped.dp_attention) != (config.tp, config.dp_attention):
        # vLLM's data parallelism with expert parallelism, simulated as attention ranks
        config = config.model_copy(
            update={"tp": mapped.tp, "dp_attention": mapped.dp_attention, "dp": None, "gpus": None}
        )
    return PredictResult(
        config=config,
        gpu=setup.gpu.name,
        model=setup.model.name,
        quant=setup.fmt.name,
        quant_reason=setup.quant_reason,
        profile=setup.profile.name if setup.profile is not None else None,
        profile_path=getattr(setup.profile, "path", None),
        replicas=setup.dp,
        kv_capacity_tokens=setup.num_blocks * BLOCK_SIZE_TOKENS * setup.config.pp,
        max_model_len=setup.max_model_len,
        levels=results,
        disaggregation=disaggregation_facts(setup),
        admission_lag_steps=int(setup.step_model.admits_a_step_late),
        notes=[
            n
            for n in (
                generation_note(setup),
                launch_bound_note(setup),
                state_cap_note(setup),
                disaggregation_note(setup),
                offload_note(setup),
                clients_note(config),
            )
            if n
        ]
        + [n for n in (overload_note(r) for r in results) if n]
        + profile_warnings(setup.profile),
    )


def overload_note(result: LevelResult) -> str | None:
    """What a prediction says of an open-loop level whose arrivals stopped at
    MAX_OPEN_BACKLOG waiting requests (None for any other level)."""
    if not result.unsent_requests:
        return None
    from capsim.engine.workloads import MAX_OPEN_BACKLOG

    m = result.metrics
    sent = m.requests
    served = m.request_throughput
    return (
        f"at {result.level:g} req/s the server is overloaded: {MAX_OPEN_BACKLOG:,} requests "
        f"were waiting after {sent:,} had arrived, so the last {result.unsent_requests:,} were "
        f"not sent; it completes about {served:.3g} req/s, and past that rate the queue and "
        "every latency grow with the run's length (the figures are those of the requests "
        "sent, not a steady state)"
    )


def clients_note(config: PredictConfig) -> str | None:
    """Where a closed loop's level asks for more clients than the level sends requests:
    only that many are ever in flight, so those levels measure the same load (a sweep of
    -c 1..100000 with --requests 8 printed five identical rows labelled 10 to 100,000)."""
    n = config.requests
    if config.workload != "closed" or n is None:
        return None
    above = sorted(c for c in config.concurrency if c > n)
    if not above:
        return None
    shown = ", ".join(f"{c:,}" for c in above[:4]) + (", ..." if len(above) > 4 else "")
    return (
        f"C={shown}: above --requests {n:,}, at most {n:,} clients ever send a request, so "
        f"these levels measure the load of C={n:,}; raise --requests to load them"
    )


def offload_note(setup: Setup) -> str | None:
    """``offload_past_weights`` of a deployment's --cpu-offload-gb."""
    return offload_past_weights(setup.config.cpu_offload_gb, setup.fit)


def disaggregation_facts(setup: Setup) -> dict | None:
    """The prefill pool and KV transfer of a disaggregated deployment (None otherwise)."""
    if setup.prefill is None:
        return None
    transfer = setup.kv_transfer
    return {
        "prefill_instances": setup.config.prefill_replicas,
        "prefill_tp": setup.prefill.config.tp,
        "prefill_kv_capacity_tokens": setup.prefill.num_blocks * BLOCK_SIZE_TOKENS,
        "decode_replicas": setup.dp,
        "kv_link": transfer.link.name,
        "kv_link_gb_s": transfer.link.gb_s,
        "kv_transfer_efficiency": transfer.efficiency,
        "kv_transfer_ms_per_1k_tokens": transfer.seconds_per_token * 1e6,
        "kv_transfer_latency_ms": transfer.latency_s * 1e3,
    }


def disaggregation_note(setup: Setup) -> str | None:
    """What a disaggregated prediction assumes about the KV transfer."""
    facts = disaggregation_facts(setup)
    if facts is None:
        return None
    return (
        f"disaggregated: {facts['prefill_instances']} prefill instance(s) of TP "
        f"{facts['prefill_tp']} hand each prompt's KV to {facts['decode_replicas']} decode "
        f"replica(s) over {facts['kv_link']} ({facts['kv_link_gb_s']:g} GB/s x "
        f"{facts['kv_transfer_efficiency']:g}): "
        f"{facts['kv_transfer_ms_per_1k_tokens']:.2f} ms per 1,000 prompt tokens + "
        f"{facts['kv_transfer_latency_ms']:g} ms; --kv-transfer-bandwidth sets the link"
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
