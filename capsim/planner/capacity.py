"""How many concurrent agents a deployment serves within service-level objectives.

``capacity`` searches the closed-loop concurrency: it doubles C until a level misses an
objective (or the engine runs out of room), then bisects between the last level that met
every objective and the first that did not. Each level is a steady-state simulation: the
requests sent in the start-up burst (the first C) are left out of the latency
percentiles, since a server that is already busy never sees all C clients arrive at once.

The answer names the binding constraint at the first failing level (which objective it
missed, and what limits the engine there: KV-cache room, the sequence limit, or the
resource the decode step is bound by) and what would let it serve more.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from capsim.calibration.applied import calibrated_predict, calibrated_setup
from capsim.catalog.loader import Catalog, load_catalog
from capsim.engine.bands import pessimistic_factors
from capsim.engine.config import PredictConfig
from capsim.engine.levels import LevelResult
from capsim.engine.setup import engine_fit_options
from capsim.engine.simulate import offload_note
from capsim.errors import CapsimUserError

MAX_CONCURRENCY = 8192
"""Largest concurrency the search tries (agents)."""

MAX_JOINT_REPLICAS = 8
"""Most replicas capacity simulates together. With more behind a round-robin router, it
searches one replica's share of the agents and multiplies: a closed loop's agents spread
evenly over identical replicas, and simulating a thousand replicas together at every level
of the search took minutes (the issue-47 battery: --gpus 1000 ran past its 20 s)."""

KV_FULL = 0.98
"""Peak KV-cache use from which a level counts as KV-bound (fraction of blocks)."""


class Objectives(BaseModel):
    """Service-level objectives; None = not required. Units in each field's name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # finite and at most a year (or a million tok/s): an infinite objective is no objective,
    # and searched as one it walked every level to the top (25 s) to say every level met it
    min_agent_tok_s: float | None = Field(
        None, gt=0, le=1e6, allow_inf_nan=False, description="Per-agent output tok/s"
    )
    max_ttft_p90_s: float | None = Field(
        None, gt=0, le=3.2e7, allow_inf_nan=False, description="TTFT, 90th percentile, s"
    )
    max_tpot_ms: float | None = Field(
        None, gt=0, le=3.2e10, allow_inf_nan=False, description="Mean time per output token, ms"
    )
    max_e2e_p90_s: float | None = Field(
        None, gt=0, le=3.2e7, allow_inf_nan=False, description="End-to-end p90, s"
    )

    def any(self) -> bool:
        return any(v is not None for v in self.model_dump().values())


@dataclass
class CapacityPoint:
    """One simulated level, with steady-state figures (start-up burst left out)."""

    concurrency: int
    agent_tok_s: float  # mean output tok/s one agent sees while its request runs
    output_tok_s: float  # the whole deployment
    ttft_p90_s: float
    tpot_ms: float
    e2e_p90_s: float
    peak_kv_usage: float
    preemptions: int
    ttft_mean_s: float = math.nan  # steady-state mean time to first token
    queueing_mean_s: float = math.nan  # of which waiting before the engine first schedules it
    misses: list[str] = field(default_factory=list)  # the objectives it misses
    band_source: str | None = None  # where the level's bands come from

    @property
    def ok(self) -> bool:
        return not self.misses


@dataclass
class CapacityAnswer:
    """The largest concurrency that meets every objective, and why not more."""

    gpu: str
    model: str
    quant: str
    gpus: int
    max_concurrency: int  # 0: even one agent misses an objective
    binding: str  # what stops it at the next level
    limiter: str  # what the engine runs out of there
    suggestions: list[str]
    curve: list[CapacityPoint]
    notes: list[str] = field(default_factory=list)
    ttft_cause: str | None = None  # why the first failing level's first tokens are late
    checked_changes: list[str] = field(default_factory=list)  # each rerun in the simulator


def _steady(values: np.ndarray, q: float) -> float:
    values = values[np.isfinite(values)]
    return float(np.percentile(values, q)) if values.size else math.nan


def measure_point(
    level: LevelResult, objectives: Objectives, pessimistic: bool = False
) -> CapacityPoint:
    """Steady-state figures of a simulated level: the first C requests sent (the start-up
    burst) are left out of the latency statistics when there are enough others. With
    ``pessimistic``, each objective is checked at its figure's 80% band edge on the side
    of missing it (the figure times pessimistic_factors' ratio for its family)."""
    c = int(level.level)
    records = sorted(level.records or [], key=lambda r: r.send)
    steady = records[c:] if len(records) >= 2 * c else records
    done = [r for r in steady if r.ok]
    ttft = np.array([r.ttft for r in done], dtype=float)
    e2e = np.array([r.e2e for r in done], dtype=float)
    tpot = np.array([r.tpot for r in done if r.tpot is not None], dtype=float)
    rates = np.array([r.output_tokens / r.e2e for r in done if r.e2e], dtype=float)
    queueing = np.array([r.queueing for r in done if r.queueing is not None], dtype=float)
    point = CapacityPoint(
        concurrency=c,
        agent_tok_s=float(rates.mean()) if rates.size else 0.0,
        output_tok_s=level.metrics.output_tok_s,
        ttft_p90_s=_steady(ttft, 90),
        tpot_ms=float(tpot.mean() * 1e3) if tpot.size else math.nan,
        e2e_p90_s=_steady(e2e, 90),
        peak_kv_usage=level.peak_kv_usage,
        preemptions=level.preemptions,
        ttft_mean_s=float(ttft.mean()) if ttft.size else math.nan,
        queueing_mean_s=float(queueing.mean()) if queueing.size else math.nan,
        band_source=level.band_source,
    )
    factor = pessimistic_factors(level) if pessimistic else {}
    edge = " (band edge)" if pessimistic else ""
    agent = point.agent_tok_s * factor.get("per_request_output_tok_s", 1.0)
    ttft = point.ttft_p90_s * factor.get("ttft_p90_ms", 1.0)
    tpot = point.tpot_ms * factor.get("tpot_ms", 1.0)
    e2e = point.e2e_p90_s * factor.get("e2e_p50_s", 1.0)
    o = objectives
    if o.min_agent_tok_s is not None and not agent >= o.min_agent_tok_s:
        point.misses.append(f"per-agent {agent:.3f}{edge} < {o.min_agent_tok_s:g} tok/s")
    if o.max_ttft_p90_s is not None and not ttft <= o.max_ttft_p90_s:
        point.misses.append(f"TTFT p90 {ttft:.2f}{edge} > {o.max_ttft_p90_s:g} s")
    if o.max_tpot_ms is not None and not tpot <= o.max_tpot_ms:
        point.misses.append(f"TPOT {tpot:.1f}{edge} > {o.max_tpot_ms:g} ms")
    if o.max_e2e_p90_s is not None and not e2e <= o.max_e2e_p90_s:
        point.misses.append(f"E2E p90 {e2e:.1f}{edge} > {o.max_e2e_p90_s:g} s")
    return point


def capacity(
    config: PredictConfig,
    objectives: Objectives,
    catalog: Catalog | None = None,
    requests_per_agent: int = 8,
    pessimistic: bool = False,
) -> CapacityAnswer:
    """The largest closed-loop concurrency of ``config``'s deployment that meets every
    objective (see the module docstring). ``requests_per_agent`` requests per agent are
    simulated at each level (at least 64). With ``pessimistic`` every objective must hold
    at the pessimistic edge of its figure's 80% band, not at the prediction itself."""
    if not objectives.any():
        raise CapsimUserError(
            "capacity needs at least one objective",
            hint="e.g. --min-agent-tok-s 20 --max-ttft-p90-s 2",
        )
    if config.workload != "closed":
        raise CapsimUserError("capacity searches a closed loop of agents (--workload closed)")
    whole = calibrated_setup(config, catalog)
    share = per_replica_share(config, whole.dp)
    searched = config if share == 1 else config.model_copy(update={"gpus": None, "dp": 1})
    setup = whole if share == 1 else calibrated_setup(searched, catalog)
    engine_seqs = setup.scheduler.max_num_seqs * setup.engines
    cache: dict[int, CapacityPoint] = {}

    def at(c: int) -> CapacityPoint:
        if c not in cache:
            cfg = searched.model_copy(
                update={"concurrency": [c], "requests": max(requests_per_agent * c, 64)}
            )
            # a profile's bands are three more simulations a level: only the pessimistic
            # search reads them
            result = calibrated_predict(
                cfg, catalog, keep_records=True, workers=1, profile_bands=pessimistic
            )
            cache[c] = measure_point(result.levels[0], objectives, pessimistic)
        return cache[c]

    # double until a level misses, or the engine and its queue are far past full
    good, bad = 0, None
    c = 1
    while c <= MAX_CONCURRENCY:
        if at(c).ok:
            good = c
            if c >= 4 * engine_seqs:  # every agent beyond this only queues
                break
            c *= 2
        else:
            bad = c
            break
    if bad is not None:
        lo, hi = good, bad
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if at(mid).ok:
                lo = mid
            else:
                hi = mid
        good, bad = lo, hi
    curve = [cache[k] for k in sorted(cache)]
    first_miss = cache[bad] if bad is not None else None
    limiter = _limiter(setup, first_miss or cache[good], engine_seqs)
    binding = "; ".join(first_miss.misses) if first_miss else "none within the search"
    notes = [n for n in (offload_note(whole),) if n]  # --cpu-offload-gb past the weights
    if pessimistic:
        notes.append(
            "objectives checked at the pessimistic edge of each figure's 80% band "
            f"(bands from {(first_miss or cache[good]).band_source or 'nowhere: none known'})"
        )
    if bad is None:
        notes.append(
            f"every level up to {good} agents meets the objectives; beyond "
            f"{4 * engine_seqs} agents the engine only queues them"
        )
    ttft_cause, checked = None, []
    if first_miss is not None and any(m.startswith("TTFT") for m in first_miss.misses):
        lone = cache[1].ttft_mean_s  # the search always starts with one agent
        ttft_cause, changes = _ttft_cause(
            first_miss, lone, limiter, setup, searched, shown_replicas=whole.dp
        )
        checked = [
            _rerun(searched, catalog, objectives, pessimistic, first_miss, label, update)
            for label, update in changes
        ]
    if share > 1:
        notes.append(
            f"searched one of the {share} replicas with its share of the agents (round-robin "
            f"spreads a closed loop evenly) and multiplied by {share}; figures per agent "
            "are that replica's" + (", the reruns above too" if checked else "")
        )
        curve = [
            dataclasses.replace(
                p, concurrency=p.concurrency * share, output_tok_s=p.output_tok_s * share
            )
            for p in curve
        ]
    return CapacityAnswer(
        ttft_cause=ttft_cause,
        checked_changes=checked,
        gpu=setup.gpu.name,
        model=setup.model.name,
        quant=setup.fmt.name,
        gpus=whole.gpus,
        max_concurrency=good * share,
        binding=binding,
        limiter=limiter,
        suggestions=_suggestions(limiter, whole, config, catalog or load_catalog()),
        curve=curve,
        notes=notes,
    )


def per_replica_share(config: PredictConfig, dp: int) -> int:
    """How many replicas one simulated replica stands for in the search: ``dp`` when there
    are more than MAX_JOINT_REPLICAS behind a plain round-robin router (no gateway latency
    or rate limit joining them), else 1 (all simulated together)."""
    plain = (
        config.router == "round_robin"
        and not config.router_latency_s
        and config.router_capacity_rps is None
    )
    return dp if dp > MAX_JOINT_REPLICAS and plain else 1


def _replica_gpus(setup) -> int:
    """The GPUs one replica of ``setup`` holds: its TP group (vLLM's DP+EP group of tp x
    ranks and SGLang's DP-attention ranks included) times its pipeline stages."""
    return setup.config.tp * setup.config.pp


def _more_replicas(dp: int, setup, config: PredictConfig | None = None) -> str:
    """The change that doubles the replicas ('another replica' from one, 'N more replicas'
    from N), with the --gpus that gives it; of a disaggregated ``setup``, its decode
    replicas (--gpus counts its prefill instances' GPUs too). A vLLM DP+EP group (``config``
    the one typed, with --dp and --enable-expert-parallel) is one server's worth: its copy
    is a second server behind a router, which no --gpus of that command line gives."""
    group = _replica_gpus(setup)
    if config is not None and config.expert_parallel and setup.config.tp != config.tp:
        what = "another DP+EP group" if dp == 1 else f"{dp} more DP+EP groups"
        return f"{what} of {group} GPUs behind a router (a server each)"
    kind = "decode " if setup.prefill is not None else ""
    what = f"another {kind}replica" if dp == 1 else f"{dp} more {kind}replicas"
    gpus = 2 * dp * group if not kind else setup.gpus + dp * group
    return f"{what} (--gpus {gpus})"


def _another_prefill_instance(setup, config: PredictConfig) -> tuple[str, dict]:
    """A disaggregated deployment's change that adds a prefill instance (label, update)."""
    more = config.prefill_replicas + 1
    update: dict = {"prefill_replicas": more}
    gpus = ""
    if config.gpus is not None:
        update["gpus"] = config.gpus + setup.prefill.config.tp
        gpus = f", --gpus {update['gpus']}"
    return f"another prefill instance (--prefill-replicas {more}{gpus})", update


def _limiter(setup, point: CapacityPoint, engine_seqs: int) -> str:
    """What the engine runs out of at a level: KV cache, its sequence limit, or the
    resource its decode step is bound by."""
    if point.peak_kv_usage >= KV_FULL or point.preemptions:
        return "KV cache"
    if point.concurrency > engine_seqs:
        if setup.fit is not None and setup.fit.state_caps_batch:
            return "recurrent-state pool"
        return "max_num_seqs"
    batch = max(1, math.ceil(point.concurrency / setup.engines))
    cfg = setup.config
    context = _mean_length(cfg.input_tokens) + _mean_length(cfg.output_tokens) / 2
    step, _ = setup.step_model.decode_step(np.full(batch, context))
    return {"memory": "memory bandwidth", "compute": "compute"}.get(step.bound, step.bound)


def _mean_length(spec: str) -> float:
    from capsim.engine.lengths import parse_length

    return float(parse_length(spec).mean)


def _suggestions(limiter: str, setup, config: PredictConfig, catalog: Catalog) -> list[str]:
    out = []
    if limiter == "KV cache":
        if config.kv_dtype == "auto":
            out.append("--kv-dtype fp8 holds twice the tokens in the same memory")
        out.append("a smaller weight format leaves more memory for the KV cache")
        out.append(f"{_more_replicas(setup.dp, setup, config)} adds a replica's cache")
    elif limiter == "max_num_seqs":
        out.append("raise --max-num-seqs: the engine queues agents beyond it")
    elif limiter == "recurrent-state pool":
        fit = setup.fit
        # the slots a request would hold with the engine's overlap scheduler off, as the
        # memory fit counts them
        sync_slots = engine_fit_options(
            catalog.engine(config.engine),
            setup.gpu,
            prefix_caching=config.prefix_caching,
            async_scheduling=False,
        )["state_slots_per_sequence"]
        out.append(
            f"the engine holds the recurrent state of at most {fit.state_sequence_cap} "
            f"requests ({fit.state_slots_per_sequence} slots of "
            f"{fit.state_bytes_per_sequence / 2**20:.0f} MiB each): SGLang's "
            "--mamba-full-memory-ratio (or --max-mamba-cache-size) gives the state pool "
            "more of the memory, --mamba-ssm-dtype bfloat16 halves each slot"
            + (
                f", and with its overlap scheduler off (--disable-overlap-schedule; capsim "
                f"--no-async-scheduling) a request holds {sync_slots} slots"
                if sync_slots < fit.state_slots_per_sequence
                else ""
            )
        )
        out.append(f"{_more_replicas(setup.dp, setup, config)} adds a state pool")
    elif limiter in ("memory bandwidth", "compute"):
        out.append(f"{_more_replicas(setup.dp, setup, config)} doubles the {limiter}")
        if limiter == "memory bandwidth" and setup.fmt.bits_per_weight > 5:
            out.append("a 4-bit weight format reads fewer bytes per step")
        out.append("a GPU with more " + ("bandwidth" if limiter != "compute" else "TFLOPS"))
    else:
        out.append(f"the step is bound by {limiter}: a faster host or fewer, larger steps")
    return out


QUEUED_SHARE = 0.5
"""Share of the mean time to first token spent waiting before the engine first schedules a
request from which a TTFT miss counts as queueing rather than the prefill itself."""


LONE_MARGIN = 1.5
"""A level whose mean time to first token is within this factor of one agent's alone is
late because of the prompt's own prefill, not the other agents."""


def _ttft_cause(
    point: CapacityPoint,
    lone: float,
    limiter: str,
    setup,
    config: PredictConfig,
    shown_replicas: int | None = None,
):
    """Why the first tokens of ``point``'s level are late (against ``lone``, one agent's
    mean time to first token alone, s), and the changes that could move them (label,
    PredictConfig update), for _rerun to check."""
    scheduler = setup.scheduler
    budget = scheduler.max_num_batched_tokens
    gpus = setup.dp * _replica_gpus(setup)
    # labelled for the whole deployment (``shown_replicas``: where one replica of many is
    # searched, doubling its replicas is doubling the deployment's)
    label = _more_replicas(shown_replicas or setup.dp, setup, config)
    replica = (label, {"gpus": 2 * gpus, "dp": None})
    if config.expert_parallel and setup.config.tp != config.tp:  # vLLM's DP+EP group, twice
        group = {"tp": setup.config.tp, "dp_attention": setup.config.dp_attention}
        replica = (label, {**group, "gpus": 2 * gpus, "dp": None})
    if setup.prefill is not None:  # disaggregated: first tokens wait for the prefill pool
        replica = _another_prefill_instance(setup, config)
    # a disaggregated prefill instance runs no decodes beside its prompts
    beside = " beside its decodes" if setup.prefill is None else " on each prefill instance"
    changes: list[tuple[str, dict]] = []
    queued = point.queueing_mean_s / point.ttft_mean_s if point.ttft_mean_s > 0 else 0.0
    if queued >= QUEUED_SHARE and limiter == "KV cache":
        cause = (
            f"requests wait for KV-cache room ({queued:.0%} of the mean "
            f"{point.ttft_mean_s:.2f} s to first token is spent before the engine schedules "
            "them; the cache is full)"
        )
        if config.kv_dtype == "auto":
            changes.append(("--kv-dtype fp8", {"kv_dtype": "fp8"}))
        changes.append(replica)
    elif queued >= QUEUED_SHARE and limiter == "max_num_seqs":
        cause = (
            f"requests wait for a sequence slot ({queued:.0%} of the mean "
            f"{point.ttft_mean_s:.2f} s to first token, beyond max_num_seqs "
            f"{scheduler.max_num_seqs})"
        )
        changes.append(
            (
                f"--max-num-seqs {2 * scheduler.max_num_seqs}",
                {"max_num_seqs": 2 * scheduler.max_num_seqs},
            )
        )
        changes.append(replica)
    elif queued >= QUEUED_SHARE:
        cause = (
            f"arrivals queue for the prefill token budget ({queued:.0%} of the mean "
            f"{point.ttft_mean_s:.2f} s to first token is spent waiting; the engine "
            f"prefills at most {budget:,} tokens a step{beside})"
        )
        changes.append(
            (
                f"--max-num-batched-tokens {2 * budget}",
                {"max_num_batched_tokens": 2 * budget},
            )
        )
        changes.append(replica)
    elif point.ttft_mean_s > LONE_MARGIN * lone:
        cause = (
            f"prompts that arrive together share the prefill steps (a wave: the mean first "
            f"token takes {point.ttft_mean_s:.2f} s against {lone:.2f} s for one agent "
            f"alone, {queued:.0%} of it waiting to be scheduled; the engine prefills at most "
            f"{budget:,} tokens a step{beside})"
        )
        changes.append(
            (
                f"--max-num-batched-tokens {2 * budget}",
                {"max_num_batched_tokens": 2 * budget},
            )
        )
        changes.append(replica)
    else:
        cause = (
            f"the prompt's own prefill: one agent alone waits {lone:.2f} s for its first "
            f"token, and {point.concurrency} wait {point.ttft_mean_s:.2f} s on average"
        )
        changes.append(replica)
    shorter = _half_prompt(config.input_tokens)
    if shorter is not None:
        changes.append(
            (f"a prompt half as long (--input-tokens {shorter})", {"input_tokens": shorter})
        )
    return cause, changes


def _half_prompt(spec: str) -> str | None:
    """A fixed prompt length halved (None for a distribution, or a prompt of one token)."""
    from capsim.engine.lengths import parse_length

    length = parse_length(spec)
    if length.kind != "fixed" or length.a < 2:
        return None
    return str(int(length.a // 2))


def _rerun(config, catalog, objectives, pessimistic, point: CapacityPoint, label, update):
    """``label``'s change simulated at ``point``'s level: its TTFT p90 before and after,
    and whether the level then meets every objective."""
    c = point.concurrency
    cfg = config.model_copy(update={**update, "concurrency": [c], "requests": max(8 * c, 64)})
    try:
        result = calibrated_predict(
            cfg, catalog, keep_records=True, workers=1, profile_bands=pessimistic
        )
    except CapsimUserError as exc:  # the change does not apply to this deployment
        return f"{label}: not possible here ({exc})"
    after = measure_point(result.levels[0], objectives, pessimistic)
    verdict = "meets every objective" if after.ok else "still misses " + "; ".join(after.misses)
    return (
        f"{label}: TTFT p90 {point.ttft_p90_s:.2f} -> {after.ttft_p90_s:.2f} s at {c} "
        f"agents, {verdict}"
    )
