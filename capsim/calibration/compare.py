"""Predicted vs measured for every published point.

Each scenario is simulated with the workload its source measured: the same hardware,
deployment and engine flags, the same kind of load (batch rounds or a closed stream),
and for unknowns the assumption the dataset states.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
from pydantic import ValidationError

from capsim.calibration.published import PublishedDataset, Scenario
from capsim.catalog.engine_schema import parse_engine_version
from capsim.catalog.loader import Catalog, process_catalog
from capsim.engine.config import PredictConfig
from capsim.engine.lengths import parse_length
from capsim.engine.levels import catalog_dirs
from capsim.engine.pool import cores_for
from capsim.engine.simulate import predict
from capsim.errors import CapsimUserError
from capsim.metrics import LevelMetrics
from capsim.physics.efficiency import EfficiencyParams
from capsim.physics.speculative import parse_spec

OUTPUT_SPREAD_SIGMA = 0.3
"""Lognormal shape of natural-stop output lengths where a source gives only a mean."""

EXPECTED_VALUE_ROUNDS = 16
"""Batch rounds simulated per level where lengths are drawn. A measured point is one draw
of its prompts' lengths (seed 002 ran 2 rounds); the prediction is the expected value, so
capsim averages over more rounds, with the same seed in every evaluation of a fit. With
stratified draws, seed 002's uncalibrated MAPE moves by about 1 point between seeds at 16
rounds (20.1-21.1%, measured when eager launches still added to GPU time); at 2 rounds of
independent draws it moved by 4 (20.3-23.9%). Where every prompt and output has a fixed
length, every round is the same (each starts on an idle engine with its KV cache free), so
the source's own rounds are simulated: on the corpus's fixed-length batch scenarios (the
DGX Spark batched-bench sets, GPUStack's DeepSeek-R1 bursts) 1 round and 16 gave the same
figures to 3e-14 in 8-12x less time (``rounds_for``)."""


def rounds_for(rounds: int | None, input_tokens: str, output_tokens: str) -> int:
    """Batch rounds a scenario is simulated with: its source's (``rounds``, default 1)
    where both lengths are fixed, else at least EXPECTED_VALUE_ROUNDS (lengths drawn)."""
    from capsim.engine.lengths import parse_length

    own = rounds or 1
    try:
        fixed = all(parse_length(t).kind == "fixed" for t in (input_tokens, output_tokens))
    except (CapsimUserError, ValueError):  # the config refuses it, naming the scenario
        fixed = False
    return own if fixed else max(own, EXPECTED_VALUE_ROUNDS)


SimulationListener = Callable[[float], None]
"""Told the wall-clock seconds of each scenario simulation (a long command's progress:
validate --calibrated counts its fits' simulations with it)."""

_simulation_listener: SimulationListener | None = None


def listen_to_simulations(listener: SimulationListener | None) -> SimulationListener | None:
    """Have ``listener`` told of every scenario simulation this process runs from now on
    (None: no one); returns the listener it replaces."""
    global _simulation_listener
    previous, _simulation_listener = _simulation_listener, listener
    return previous


@dataclass
class ComparedPoint:
    dataset: str
    scenario: str
    concurrency: int
    metric: str
    measured: float
    predicted: float
    gpu: str = ""
    engine: str = ""
    statistic: str = "mean"
    scored: bool = True  # False: the dataset is reference only (reference_only says why)

    @property
    def error(self) -> float:
        """Signed relative error of the prediction (predicted / measured - 1, on the metric
        as quoted: positive is a time too long or a rate too high)."""
        return self.predicted / self.measured - 1.0

    @property
    def optimism(self) -> float:
        """Signed relative error on speed, one sign for every metric: positive when capsim
        predicts the server faster than it was (a rate too high or a time too short:
        measured / predicted - 1 for a time). A median of ``error`` over a family that
        holds both times and rates (TPOT: tpot_s and llama-bench's decode_tok_s) mixes two
        signs; this one does not."""
        if self.metric in LATENCY_METRICS:
            return self.measured / self.predicted - 1.0
        return self.error


def output_mean_for(sc: Scenario, level: int) -> float | None:
    """A scenario's mean output per request at one level (tokens), where it is known."""
    return sc.output_mean_tokens_by_level.get(level, sc.output_mean_tokens)


def mape_of(errors) -> float:
    """Mean absolute percentage error of signed relative errors, in percent; NaN for none
    (non-finite errors are left out)."""
    values = [abs(e) for e in errors if math.isfinite(e)]
    return 100.0 * float(np.mean(values)) if values else float("nan")


def mape(points) -> float:
    """Mean absolute percentage error of predictions (anything with ``.error``, the signed
    relative error), in percent; NaN for none."""
    return mape_of(p.error for p in points)


def scenario_config(
    ds: PublishedDataset,
    sc: Scenario,
    levels: list[int],
    output_mean: float | None = None,
    overrides: dict[str, float] | None = None,
) -> PredictConfig:
    """The PredictConfig that reproduces one measured scenario at ``levels`` (whose mean
    output, where the workload gives none, is ``output_mean`` or the scenario's), with
    efficiency ``overrides`` laid over whatever parameters it is simulated with."""
    w = ds.workload
    output = sc.output_tokens or w.output_tokens
    mean = output_mean or sc.output_mean_tokens
    if output is None and mean:
        # lognormal with the stated mean: median = mean / exp(sigma^2 / 2)
        median = mean / math.exp(OUTPUT_SPREAD_SIGMA**2 / 2)
        output = f"lognormal:{median:.0f},{OUTPUT_SPREAD_SIGMA}"
    flags = sc.flags
    # SGLang's --enable-dp-attention: the scenario's dp counts attention ranks inside its
    # TP group (as --dp-size does with the flag), not replicas
    dp_attention = sc.dp if flags.get("enable_dp_attention") else 1
    try:
        return _scenario_config(ds, sc, levels, output, flags, dp_attention, overrides)
    except ValidationError as exc:  # a field the simulator refuses: name the scenario's
        first = exc.errors()[0]
        field = next((str(p) for p in reversed(first["loc"]) if isinstance(p, str)), "a value")
        raise CapsimUserError(
            f"dataset {ds.name}, scenario {sc.name}: {field} {first.get('input')!r}: "
            f"{first['msg'].removeprefix('Value error, ').lower()}",
            hint="a scenario's fields and flags are simulated as predict's flags are",
        ) from None


def _scenario_config(ds, sc, levels, output, flags, dp_attention, overrides) -> PredictConfig:
    w = ds.workload
    return PredictConfig(
        gpu=sc.gpu,
        model=sc.model,
        quant=sc.quant,
        tp=sc.tp,
        dp=1 if dp_attention > 1 else sc.dp,
        dp_attention=dp_attention,
        interconnect=sc.interconnect,
        kv_dtype=sc.kv_dtype,
        workload=w.kind,
        # an open workload's levels are its arrival rates
        concurrency=[1] if w.kind == "open" else levels,
        rates=[float(level) for level in levels] if w.kind == "open" else [],
        arrival=w.arrival,
        gamma_cv=w.gamma_cv if w.gamma_cv is not None else 2.0,
        requests=w.requests_per_level,
        batch_rounds=rounds_for(
            w.rounds_per_level, sc.input_tokens or w.input_tokens, output or "512"
        ),
        input_tokens=sc.input_tokens or w.input_tokens,
        output_tokens=output or "512",
        spec=parse_spec(sc.spec, sc.spec_acceptance) if sc.spec else None,
        power_limit_w=sc.power_limit_w,
        max_num_seqs=int(flags["max_num_seqs"]) if "max_num_seqs" in flags else None,
        gpu_memory_utilization=(
            float(flags["gpu_memory_utilization"]) if "gpu_memory_utilization" in flags else None
        ),
        enforce_eager=bool(flags.get("enforce_eager", False)),
        attention_backend=flags.get("attention_backend"),
        flash_attention=bool(flags["flash_attn"]) if "flash_attn" in flags else None,
        async_scheduling=bool(flags["async_scheduling"]) if "async_scheduling" in flags else None,
        custom_allreduce=(
            not bool(flags["disable_custom_all_reduce"])
            if "disable_custom_all_reduce" in flags
            else None
        ),
        engine=simulated_engine(sc),
        offline=bool(flags.get("offline", False)),
        ubatch_tokens=int(flags["ubatch_tokens"]) if "ubatch_tokens" in flags else None,
        cpu_moe_layers=int(flags.get("cpu_moe_layers", 0)),
        expert_parallel=bool(flags.get("enable_expert_parallel", False)),
        host_memory_bandwidth_gbs=(
            float(flags["host_memory_bandwidth_gbs"])
            if "host_memory_bandwidth_gbs" in flags
            else None
        ),
        scheduler_recv_interval=int(flags.get("scheduler_recv_interval", 1)),
        mixed_chunk=bool(flags.get("enable_mixed_chunk", False)),
        schedule_conservativeness=(
            float(flags["schedule_conservativeness"])
            if "schedule_conservativeness" in flags
            else None
        ),
        max_num_batched_tokens=(
            int(flags["max_num_batched_tokens"]) if "max_num_batched_tokens" in flags else None
        ),
        max_model_len=int(flags["max_model_len"]) if "max_model_len" in flags else None,
        prefill_replicas=int(flags.get("prefill_replicas", 0)),
        prefill_tp=int(flags["prefill_tp"]) if "prefill_tp" in flags else None,
        kv_transfer_gbs=float(flags["kv_transfer_gbs"]) if "kv_transfer_gbs" in flags else None,
        kv_capacity_tokens=sc.kv_capacity_tokens,
        router=sc.router or "round_robin",
        seed=0,
        profile="none",
        efficiency_overrides=overrides or {},
    )


ENGINE_SIMULATED = {"other": "vllm", "trt-llm": "vllm"}
"""The catalog engine a scenario's ``engine`` is simulated as, where the two differ: an
engine capsim has no entry for ('other') runs as vLLM."""


def simulated_engine(sc: Scenario) -> str:
    """The engine reference a scenario is simulated with: its engine at the release it
    names ('vllm@0.7.3', which picks that release's generation), its engine alone when the
    release is not a version number (a commit, a container tag), and vLLM's newest for an
    engine capsim has no entry for (whose version says nothing about vLLM's)."""
    if sc.engine in ENGINE_SIMULATED:
        return ENGINE_SIMULATED[sc.engine]
    engine = f"{sc.engine}:{sc.backend}" if sc.backend else sc.engine
    if sc.engine_version and parse_engine_version(sc.engine_version) is not None:
        return f"{engine}@{sc.engine_version.strip()}"
    return engine


LATENCY_METRICS = {"ttft_s": "ttft_ms", "tpot_s": "tpot_ms", "itl_s": "itl_ms", "e2e_s": "e2e_s"}
"""Published latency metric -> the level's distribution of it, and that distribution's
unit in seconds."""
_SECONDS_PER_UNIT = {"ttft_ms": 1e-3, "tpot_ms": 1e-3, "itl_ms": 1e-3, "e2e_s": 1.0}
_STATISTIC_FIELD = {"mean": "mean", "median": "p50", "p90": "p90", "p99": "p99"}


def point_value(m: LevelMetrics, metric: str, statistic: str = "mean") -> float:
    """A published point's metric from a simulated level (see POINT_METRICS); latencies
    in seconds, as the ``statistic`` the source quotes."""
    if metric in LATENCY_METRICS:
        field = LATENCY_METRICS[metric]
        value = getattr(getattr(m, field), _STATISTIC_FIELD[statistic])
        return float("nan") if value is None else value * _SECONDS_PER_UNIT[field]
    if metric == "request_throughput_rps":
        return float(m.request_throughput)
    if metric == "decode_tok_s":
        return 1e3 / m.tpot_ms.mean
    if metric == "prompt_tok_s":
        return m.input_tokens / max(m.completed, 1) / (m.ttft_ms.mean / 1e3)
    value = getattr(m, metric)
    return float(value.mean if hasattr(value, "mean") else value)


DECODE_APART_METRICS = frozenset({"decode_tok_s"})
"""Metrics a dataset's ``decode_context_tokens`` simulates apart from its prompts."""


def compare_scenario(
    ds: PublishedDataset,
    sc: Scenario,
    catalog: Catalog,
    params: EfficiencyParams | None = None,
    workers: int | None = None,
    overrides: dict[str, float] | None = None,
) -> list[ComparedPoint]:
    """Simulate one scenario of a dataset and pair its predictions with measurements.
    Levels with the same mean output are simulated in one sweep. ``overrides`` replace
    single efficiency parameters on top of ``params`` (or the GPU's defaults)."""
    sweeps: dict[tuple[float | None, int | None], list[int]] = {}
    # a closed loop the source ran for a number of rounds (requests = rounds x clients)
    # sends its own request count at each level, so each level is a sweep of its own
    w = ds.workload
    per_level = w.kind == "closed" and w.rounds_per_level and w.requests_per_level is None
    for level in sorted({p.concurrency for p in sc.points}):
        key = (output_mean_for(sc, level), level if per_level else None)
        sweeps.setdefault(key, []).append(level)
    # decoding measured apart from the prompt (llama-bench's tg from an empty context)
    decode_apart = (
        w.decode_context_tokens is not None
        and sc.input_tokens is None
        and any(p.metric in DECODE_APART_METRICS for p in sc.points)
    )
    by_level, decode_by_level = {}, {}
    started = time.perf_counter()
    for (mean, alone), levels in sweeps.items():
        config = scenario_config(ds, sc, levels, mean, overrides)
        if alone is not None:
            config = config.model_copy(update={"requests": w.rounds_per_level * alone})
        result = predict(config, catalog, params=params, workers=workers)
        by_level.update({int(lv.level): lv.metrics for lv in result.levels})
        if decode_apart:
            apart = config.model_copy(update={"input_tokens": str(w.decode_context_tokens)})
            result = predict(apart, catalog, params=params, workers=workers)
            decode_by_level.update({int(lv.level): lv.metrics for lv in result.levels})

    if _simulation_listener is not None:
        _simulation_listener(time.perf_counter() - started)

    def metrics_for(p):
        if decode_apart and p.metric in DECODE_APART_METRICS:
            return decode_by_level[p.concurrency]
        return by_level[p.concurrency]

    return [
        ComparedPoint(
            ds.name,
            sc.name,
            p.concurrency,
            p.metric,
            p.value,
            float(point_value(metrics_for(p), p.metric, p.statistic)),
            sc.gpu,
            sc.engine,
            p.statistic,
            ds.reference_only is None,
        )
        for p in sc.points
    ]


@dataclass
class SkippedScenario:
    """A measured scenario capsim could not simulate, and why (one line)."""

    dataset: str
    scenario: str
    points: int
    reason: str


def skip_reason(ds: PublishedDataset, sc: Scenario, catalog: Catalog) -> str | None:
    """Why capsim cannot simulate a scenario (what compare_or_skip would skip it for: an
    unknown name, a deployment that does not fit, prompts longer than the context), found
    without simulating it; None when it can."""
    from capsim.engine.levels import check_lengths, make_workload
    from capsim.engine.setup import build_setup
    from capsim.errors import CapsimUserError

    levels = sorted({p.concurrency for p in sc.points})
    try:
        config = scenario_config(ds, sc, levels, output_mean_for(sc, levels[0]))
        setup = build_setup(config, catalog)
        for level in levels:
            check_lengths(setup, make_workload(config, level))
    except CapsimUserError as exc:
        return exc.message
    return None


def compare_or_skip(
    datasets: list[PublishedDataset],
    catalog: Catalog,
    overrides: dict[str, float] | None = None,
    advance=None,
    workers: int | None = 1,
    finished: Callable[[Scenario, list[ComparedPoint], list[SkippedScenario]], None] | None = None,
) -> tuple[list[ComparedPoint], list[SkippedScenario]]:
    """Every scenario compared, except those capsim cannot simulate (an unknown GPU,
    model or format, a deployment that does not fit, prompts longer than the context),
    which are returned with the reason instead of stopping the whole comparison.
    ``advance()``, if given, is called after each scenario (a progress bar). With
    ``workers`` above 1 (None: one a core) the scenarios run in that many processes,
    the costliest first (``scenario_cost``); the points come back in the datasets'
    order either way. ``finished(sc, points, skipped)``, if given, is called as each
    scenario is done, so a caller stopped part-way keeps those."""
    jobs = [(ds, sc) for ds in datasets for sc in ds.scenarios]
    workers = cores_for(len(jobs)) if workers is None else min(workers, cores_for(len(jobs)))
    outcomes: dict[int, list[ComparedPoint] | SkippedScenario] = {}

    def done(i: int, outcome) -> None:
        outcomes[i] = outcome
        if advance is not None:
            advance()
        if finished is not None:
            finished(jobs[i][1], *_gathered(outcomes, [i]))

    if workers <= 1:
        for i, (ds, sc) in enumerate(jobs):
            done(i, _compared_or_skipped(ds, sc, catalog, overrides))
    else:
        from concurrent.futures import as_completed

        from capsim.engine.pool import worker_pool

        dirs = catalog_dirs(catalog)
        order = sorted(range(len(jobs)), key=lambda i: -scenario_cost(*jobs[i]))
        with worker_pool(workers) as pool:
            futures = {
                pool.submit(_compared_or_skipped_in_worker, (*jobs[i], dirs, overrides)): i
                for i in order
            }
            for future in as_completed(futures):
                done(futures[future], future.result())
    return _gathered(outcomes, range(len(jobs)))


def _gathered(outcomes: dict, indices) -> tuple[list[ComparedPoint], list[SkippedScenario]]:
    """The points and skipped scenarios of jobs ``indices``, in that order."""
    points: list[ComparedPoint] = []
    skipped: list[SkippedScenario] = []
    for i in indices:
        outcome = outcomes[i]
        if isinstance(outcome, SkippedScenario):
            skipped.append(outcome)
        else:
            points += outcome
    return points, skipped


def _compared_or_skipped(ds, sc, catalog, overrides) -> list[ComparedPoint] | SkippedScenario:
    try:
        return compare_scenario(ds, sc, catalog, overrides=overrides)
    except CapsimUserError as exc:
        return SkippedScenario(ds.name, sc.name, len(sc.points), exc.message)


def _compared_or_skipped_in_worker(args) -> list[ComparedPoint] | SkippedScenario:
    ds, sc, extra_dirs, overrides = args
    return _compared_or_skipped(ds, sc, process_catalog(extra_dirs), overrides)


def scenario_cost(ds: PublishedDataset, sc: Scenario) -> float:
    """A rough measure of how long a scenario takes to simulate: the tokens its levels
    send, requests x (prompt + output) summed over its levels (a level capsim refuses
    counts one token). Only the order of scenarios is read from it, to hand a pool the
    long ones first so that no process is left with one at the end."""
    tokens = 0.0
    for level in sorted({p.concurrency for p in sc.points}):
        try:
            config = scenario_config(ds, sc, [level], output_mean_for(sc, level))
            requests = config.requests or (
                config.default_requests(level) if config.workload != "open" else 200
            )
            each = parse_length(config.input_tokens).mean + parse_length(config.output_tokens).mean
        except (CapsimUserError, ValueError):
            requests, each = 1, 1.0
        tokens += requests * each
    return max(tokens, 1.0)


METRIC_KINDS = {
    "output_tok_s": "throughput",
    "total_tok_s": "throughput",
    "per_request_output_tok_s": "throughput",
    "request_throughput_rps": "throughput",
    "tpot_s": "TPOT",
    "itl_s": "TPOT",
    "decode_tok_s": "TPOT",
    "ttft_s": "TTFT",
    "prompt_tok_s": "TTFT",
    "e2e_s": "E2E",
}
"""Which acceptance family a published metric belongs to (a decode rate is 1 / TPOT, a
prompt rate the prompt over TTFT)."""


def error_summary(points: list[ComparedPoint], key) -> list[dict]:
    """Median absolute and mean absolute error (percent, of ``error``: on each metric as
    quoted) and median optimism (percent, of ``optimism``: positive where capsim predicts
    the servers faster than they were, whatever the metric) of the points grouped by
    ``key(point)``."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for p in points:
        if math.isfinite(p.error) and math.isfinite(p.optimism):
            groups.setdefault(key(p), []).append((p.error, p.optimism))
    rows = []
    for name, pairs in sorted(groups.items()):
        errs = np.array([e for e, _ in pairs])
        rows.append(
            {
                "group": name,
                "points": len(pairs),
                "median_abs_error_percent": 100.0 * float(np.median(np.abs(errs))),
                "median_optimism_percent": 100.0 * float(np.median([o for _, o in pairs])),
                "mape_percent": 100.0 * float(np.mean(np.abs(errs))),
            }
        )
    return rows


def compare_dataset(
    ds: PublishedDataset,
    catalog: Catalog,
    params: EfficiencyParams | None = None,
    overrides: dict[str, float] | None = None,
) -> list[ComparedPoint]:
    """Simulate every scenario of a dataset and pair predictions with measurements."""
    return compare_datasets([ds], catalog, params, overrides=overrides)


def compare_in_worker(args) -> list[ComparedPoint]:
    ds, sc, extra_dirs, params, overrides = args
    return compare_scenario(
        ds, sc, process_catalog(extra_dirs), params, workers=1, overrides=overrides
    )


SIMULATIONS_KEPT = 256
"""Scenario simulations ``compare_datasets`` keeps, newest first. A fit asks for the same
parameter vector again (least_squares' result, then the profile's final evaluation, the
held-value search, the linearised Jacobian at the optimum): counted on the RTX 4090
Mistral part of ``validate --calibrated``, 160 of its 855 level simulations repeated one
already run. A scenario simulation is deterministic (its seed is in its config), so a
kept one is the same points; each is a few kilobytes."""

_simulated: OrderedDict[tuple, tuple[list[ComparedPoint], tuple]] = OrderedDict()


def _simulation_key(ds, sc, catalog, params, overrides) -> tuple:
    """What a scenario's simulation depends on: the dataset and scenario objects (their
    points and workload; held by the entry so that their ids stay theirs), the catalog,
    the efficiency parameters and the overrides."""
    return (
        id(ds),
        id(sc),
        id(catalog),
        None if params is None else repr(params),
        None if not overrides else tuple(sorted(overrides.items())),
    )


def compare_datasets(
    datasets: list[PublishedDataset],
    catalog: Catalog,
    params: EfficiencyParams | None = None,
    pool: Executor | None = None,
    overrides: dict[str, float] | None = None,
) -> list[ComparedPoint]:
    """``compare_dataset`` for several datasets, their scenarios spread over ``pool``'s
    processes when one is given (the points come back in the same order). A scenario
    simulated with the same parameters among the last SIMULATIONS_KEPT is not simulated
    again."""
    jobs = [(ds, sc) for ds in datasets for sc in ds.scenarios]
    keys = [_simulation_key(ds, sc, catalog, params, overrides) for ds, sc in jobs]
    found: dict[int, list[ComparedPoint]] = {}
    for i, key in enumerate(keys):
        if key in _simulated:
            _simulated.move_to_end(key)
            found[i] = list(_simulated[key][0])
    missing = [i for i in range(len(jobs)) if i not in found]
    if pool is None or len(missing) < 2:
        for i in missing:
            ds, sc = jobs[i]
            found[i] = compare_scenario(ds, sc, catalog, params, overrides=overrides)
    else:
        dirs = catalog_dirs(catalog)
        args = [(*jobs[i], dirs, params, overrides) for i in missing]
        started = time.perf_counter()
        found.update(zip(missing, pool.map(compare_in_worker, args), strict=True))
        if _simulation_listener is not None:  # the workers' simulations, told here
            share = (time.perf_counter() - started) / len(missing)
            for _ in missing:
                _simulation_listener(share)
    for i in missing:
        _simulated[keys[i]] = (list(found[i]), (*jobs[i], catalog))
        while len(_simulated) > SIMULATIONS_KEPT:
            _simulated.popitem(last=False)
    return [pt for i in range(len(jobs)) for pt in found[i]]
