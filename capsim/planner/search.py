"""Search configurations for a workload and SLOs; simulate each with the engine.

The search space: candidate GPUs, GPU counts per box (node), node counts (DP over nodes
behind a router, with the router's latency and capacity), ``max_num_seqs`` values, TP x DP
splits of each count (TP must
divide the attention heads; every interconnect the GPU lists that can join TP GPUs is tried,
so an NVLink bridge is weighed against plain PCIe), power limits as fractions of TDP
(``power_fractions``; 1 = no limit), weight formats
(the release format, FP8 where the GPU runs it natively, AWQ 4-bit), KV dtype (auto, and
FP8 where native) and speculative decoding (off, or MTP with 1 and 2 tokens for models with
MTP layers). Configurations whose weights and one sequence's KV do not fit are pruned
before any simulation; the rest are simulated in parallel processes with the same engine
and the same code path as ``capsim predict``, so a plan's figures are ``predict``'s.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from capsim.calibration.applied import calibrated_predict
from capsim.catalog.loader import Catalog, process_catalog
from capsim.engine.bands import pessimistic_factors
from capsim.engine.config import MAX_REQUESTS, PredictConfig
from capsim.engine.lengths import parse_length
from capsim.engine.limits import MAX_PLAN_CONFIGURATIONS
from capsim.engine.pool import cores_for, worker_pool
from capsim.engine.router import RouterPolicy
from capsim.engine.setup import MAX_EP_GROUP_IN_A_SERVER
from capsim.errors import CapsimUserError, close_matches
from capsim.physics.communication import choose_interconnect
from capsim.physics.drafter_memory import drafter_for
from capsim.physics.memory import memory_fit
from capsim.physics.speculative import SpecConfig
from capsim.planner.capacity import Objectives, measure_point
from capsim.planner.costs import Cost, CostModel, cost_of
from capsim.planner.pareto import pareto_front


@dataclass(frozen=True)
class PlanRequest:
    """A workload, SLOs and constraints."""

    models: tuple[str, ...]
    agents: int
    input_tokens: str = "1024"
    output_tokens: str = "512"
    min_agent_tok_s: float | None = None
    max_ttft_p90_s: float | None = None
    budget_usd: float | None = None
    gpus: tuple[str, ...] | None = None
    gpu_counts: tuple[int, ...] = (1, 2, 4, 8)
    requests: int | None = None
    spec_acceptance: float = 0.7
    cost: CostModel = field(default_factory=CostModel)
    profile: str = "auto"
    power_fractions: tuple[float, ...] = (1.0,)
    """Power limits to try, as fractions of each GPU's TDP (1.0 = no limit)."""
    nodes: tuple[int, ...] = (1,)
    """Node counts to try: each node holds ``count`` GPUs; DP replicas span the nodes."""
    max_num_seqs: tuple[int | None, ...] = (None,)
    """vLLM --max-num-seqs values to try per replica (None = vLLM's default for the GPU)."""
    router: RouterPolicy = "least_outstanding"
    router_latency_s: float = 0.0
    """Fixed latency the router or gateway adds to each request, seconds."""
    router_capacity_rps: float | None = None
    """Requests per second the router or gateway can pass (None = unlimited)."""
    pessimistic: bool = False
    """Check the SLOs at the pessimistic edge of each figure's 80% band, not at the
    prediction."""
    disaggregation: bool = False
    """Also try each deployment of two or more replicas split into prefill and decode
    instances (PREFILL_SHARES of its replicas prefill)."""

    def __post_init__(self) -> None:
        from capsim.arguments import check_field_types
        from capsim.engine.limits import MAX_BUDGET_USD, MAX_CONCURRENCY

        check_field_types(self)  # the Python API's: models="x" was read as 'x' and nothing
        if not 1 <= self.agents <= MAX_CONCURRENCY:
            raise CapsimUserError(
                f"--agents {self.agents}: must be from 1 to {MAX_CONCURRENCY:,}",
                hint="the most concurrent clients capsim simulates, as predict's --concurrency",
            )
        parse_length(self.input_tokens, "--input-tokens", minimum=1)
        parse_length(self.output_tokens, "--output-tokens", minimum=1)
        for flag, value in (
            ("--budget", self.budget_usd),
            ("--min-agent-tok-s", self.min_agent_tok_s),
            ("--max-ttft-p90-s", self.max_ttft_p90_s),
        ):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise CapsimUserError(f"{flag} {value:g}: must be a positive number")
        if self.budget_usd is not None and self.budget_usd > MAX_BUDGET_USD:
            raise CapsimUserError(
                f"--budget {self.budget_usd:g}: at most {MAX_BUDGET_USD:g} USD",
                hint="a budget past what any searched deployment costs limits nothing; "
                "leave --budget out to rank without one",
            )
        from pydantic import ValidationError

        try:  # the objectives' own bounds (1e308 tok/s was a ValidationError from the search)
            Objectives(min_agent_tok_s=self.min_agent_tok_s, max_ttft_p90_s=self.max_ttft_p90_s)
        except ValidationError as exc:
            first = exc.errors()[0]
            flag = "--" + str(first["loc"][0]).replace("_", "-")
            raise CapsimUserError(
                f"{flag} {first['input']:g}: {first['msg'][:1].lower()}{first['msg'][1:]}",
                hint=f"see --help for {flag}",
            ) from None
        # the Python API's tuples, checked as the CLI's lists are (a 0 was a pydantic
        # error from deep in the search, naming a field of PredictConfig)
        for flag, values, most in (
            ("gpu_counts", self.gpu_counts, 1024),
            ("nodes", self.nodes, 1024),
            ("max_num_seqs", tuple(v for v in self.max_num_seqs if v is not None), 2**31),
        ):
            bad = [
                v
                for v in values
                if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= most
            ]
            if bad or not (values or flag == "max_num_seqs"):
                raise CapsimUserError(
                    f"{flag} {values!r}: whole numbers from 1 to {most:,}",
                    hint="give each value once, e.g. (1, 2)",
                )
        if not self.power_fractions or not all(
            isinstance(f, int | float) and 0 < f <= 1 for f in self.power_fractions
        ):
            raise CapsimUserError(
                f"power_fractions {self.power_fractions!r}: fractions of TDP above 0, at most 1"
            )
        latency, capacity = self.router_latency_s, self.router_capacity_rps
        if not (isinstance(latency, int | float) and 0 <= latency <= 60):  # NaN fails too
            raise CapsimUserError(f"router_latency_s {latency!r}: seconds from 0 to 60")
        if capacity is not None and not (isinstance(capacity, int | float) and 0 < capacity <= 1e9):
            raise CapsimUserError(f"router_capacity_rps {capacity!r}: above 0, at most 1e9")
        if not (isinstance(self.spec_acceptance, int | float) and 0 <= self.spec_acceptance <= 1):
            raise CapsimUserError(f"spec_acceptance {self.spec_acceptance!r}: a rate from 0 to 1")
        if self.requests is not None and not (
            isinstance(self.requests, int) and 1 <= self.requests <= MAX_REQUESTS
        ):
            raise CapsimUserError(
                f"requests {self.requests!r}: a whole number from 1 to {MAX_REQUESTS:,}"
            )


@dataclass
class Candidate:
    gpu: str
    count: int
    tp: int
    model: str
    quant: str
    kv_dtype: str
    spec: SpecConfig | None = None
    interconnect: str = "auto"
    power_limit_w: float | None = None
    nodes: int = 1
    max_num_seqs: int | None = None
    # MoE at TP > 1: experts split whole over the TP group (--enable-expert-parallel)
    expert_parallel: bool = False
    # disaggregated: this many of the replicas only prefill (--prefill-replicas)
    prefill_replicas: int = 0

    @property
    def replicas(self) -> int:
        """TP groups over all nodes."""
        return self.nodes * (self.count // self.tp)

    @property
    def dp(self) -> int:
        """Replicas over all nodes that decode (all of them unless disaggregated)."""
        return self.replicas - self.prefill_replicas

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.count

    def config(self, req: PlanRequest) -> PredictConfig:
        return PredictConfig(
            gpu=self.gpu,
            model=self.model,
            quant=self.quant,
            tp=self.tp,
            dp=self.dp,
            kv_dtype=self.kv_dtype,
            spec=self.spec,
            interconnect=self.interconnect,
            power_limit_w=self.power_limit_w,
            max_num_seqs=self.max_num_seqs,
            expert_parallel=self.expert_parallel,
            prefill_replicas=self.prefill_replicas,
            workload="closed",
            concurrency=[req.agents],
            requests=req.requests or steady_requests(req.agents),
            input_tokens=req.input_tokens,
            output_tokens=req.output_tokens,
            router=req.router if self.dp > 1 else "round_robin",
            router_latency_s=req.router_latency_s if self.dp > 1 else 0.0,
            router_capacity_rps=req.router_capacity_rps if self.dp > 1 else None,
            profile=req.profile,
        )

    def label(self) -> str:
        box_text = f"{self.count}x {self.gpu}"
        if self.nodes > 1:
            box_text = f"{self.nodes} nodes x {box_text}"
        text = f"{box_text} TP{self.tp}xDP{self.dp} {self.model} {self.quant}"
        if self.kv_dtype != "auto":
            text += f" kv={self.kv_dtype}"
        if self.spec:
            text += f" {self.spec.method}:{self.spec.num_tokens}"
        if self.expert_parallel:
            text += " EP" if self.dp == 1 else f" DP{self.dp}+EP{self.count}"
        if self.prefill_replicas:
            text += f" PD {self.prefill_replicas}P:{self.dp}D"
        if self.tp > 1 and self.interconnect != "auto":
            text += f" over {self.interconnect}"
        if self.power_limit_w is not None:
            text += f" @{self.power_limit_w:.0f}W"
        if self.max_num_seqs is not None:
            text += f" seqs={self.max_num_seqs}"
        return text


STEADY_REQUESTS_PER_AGENT = 8
"""Requests per agent a plan simulates by default (at least STEADY_MIN_REQUESTS), as
``capsim capacity`` does: the first ``agents`` sent, the start-up burst in which every
agent's first prompt queues at once, are left out of the TTFT and per-agent figures, and
the rest measure the steady state (planner.capacity.measure_point)."""

STEADY_MIN_REQUESTS = 64


def steady_requests(agents: int) -> int:
    """Requests a plan simulates for ``agents`` concurrent agents by default."""
    return max(STEADY_REQUESTS_PER_AGENT * agents, STEADY_MIN_REQUESTS)


@dataclass
class Evaluated:
    candidate: Candidate
    output_tok_s: float
    per_agent_tok_s: float  # steady state (start-up burst left out)
    ttft_p90_s: float  # steady state, seconds
    cost: Cost
    meets_slo: bool
    reasons: list[str]
    output_band_80: tuple[float, float] | None = None
    """80% prediction band of output tok/s (from a calibration profile where one applies,
    else from the uncalibrated errors on the published corpus)."""
    slo_distance: float = 0.0
    """How far it is from meeting the SLOs: the root of the sum of squared relative
    shortfalls (per-agent tok/s below its floor, TTFT p90 over its cap, cost over the
    budget, each as a share of the objective; 1 for a budget with no price); 0 when it
    meets them all."""
    max_model_len: int | None = None
    """The longest sequence the deployment's KV cache allows (vLLM's --max-model-len)."""


SERVABLE_CHECKPOINT_FORMATS = ("fp8", "awq-int4", "gptq-int4", "w4a16", "nvfp4", "mxfp4")
"""Weight formats of published checkpoints the plan serves with vLLM (its AWQ/GPTQ/
compressed-tensors Marlin kernels, FP8, and FP4 where the GPU has FP4 tensor cores)."""


def plan_formats(model, gpu) -> list[str]:
    """The weight formats a plan tries for a model on a GPU: the release's own, FP8 where the
    GPU has FP8 tensor cores (vLLM quantises a 16-bit checkpoint online with --quantization
    fp8), and every format a published checkpoint of the model exists in (the catalog's
    checkpoints), FP4 ones only on GPUs with FP4 tensor cores: so the winning line names a
    checkpoint that exists."""
    formats = [model.dtype]
    if "fp8" in gpu.native_formats and "fp8" not in formats:
        formats.append("fp8")
    for ckpt in model.checkpoints:
        fmt = ckpt.quant
        if fmt in formats or fmt not in SERVABLE_CHECKPOINT_FORMATS:
            continue
        if fmt in ("nvfp4", "mxfp4") and "fp4" not in gpu.native_formats:
            continue
        formats.append(fmt)
    return formats


"""Most configurations one plan enumerates (each GPU x count x TP x format x KV dtype x
speculation x link x power limit x node count x --max-num-seqs, fitting in memory or not):
each that fits is a simulation. The default search over every GPU holds 4,768 for
llama-3.1-8b (about 30 s at 4 agents on two cores) and at most 27,216 for a shipped model
(qwen3.5-397b-a17b); --nodes 1..1024 as a list held 131,072, whose enumeration alone took
10 s before a run of hours (issue 47, round 5)."""


def refuse_a_search_past_the_limit(seen: int) -> None:
    """A plan whose configurations pass MAX_PLAN_CONFIGURATIONS is refused as it is
    enumerated, before any is simulated."""
    if seen > MAX_PLAN_CONFIGURATIONS:
        raise CapsimUserError(
            f"the search holds more than {MAX_PLAN_CONFIGURATIONS:,} configurations (each "
            f"GPU x count x TP x format x KV dtype x node count x --max-num-seqs x power "
            f"limit); at most {MAX_PLAN_CONFIGURATIONS:,} are simulated in one plan",
            hint="fewer values in --gpus, --counts, --nodes, --max-num-seqs or --power-limits",
        )


def search_grids(req: PlanRequest, cat: Catalog) -> list[tuple[Any, Any, int, int, tuple]]:
    """The space ``req`` allows, as (model, GPU, count, TP, axes) rows: the axes are the
    formats, KV dtypes, speculation, links, power limits, node counts, --max-num-seqs
    values and expert-parallel choices each of whose combinations is a configuration."""
    gpus = [cat.gpu(g) for g in req.gpus] if req.gpus else list(cat.gpus)
    rows = []
    for model_name in req.models:
        model = cat.model(model_name)
        for gpu in gpus:
            formats = plan_formats(model, gpu)
            kv_options = ["auto"] + (["fp8"] if "fp8" in gpu.native_formats else [])
            specs: list[SpecConfig | None] = [None]
            if model.mtp_layers:
                specs += [
                    SpecConfig(method="mtp", num_tokens=k, acceptance=req.spec_acceptance)
                    for k in (1, 2)
                ]
            power_limits: list[float | None] = [None]
            if gpu.tdp_w is not None:
                asked = [round(gpu.tdp_w * f) for f in req.power_fractions if 0 < f < 1]
                low = gpu.power_limit_w.min_w if gpu.power_limit_w is not None else None
                power_limits += [w for w in asked if low is None or w >= low]
                below = [w for w in asked if low is not None and w < low]
                if below:  # left out without a word before
                    from capsim.notices import notice

                    notice(
                        f"{gpu.name}: power limits of {', '.join(f'{w:g}' for w in below)} W "
                        f"are below the {low:g} W it can be set to, and are not searched"
                    )
            for count in req.gpu_counts:
                for tp in (t for t in (1, 2, 4, 8) if t <= count and count % t == 0):
                    if model.num_attention_heads % tp:
                        continue
                    links = usable_interconnects(gpu, tp)
                    if not links:
                        continue
                    # expert parallelism: an MoE's experts whole on each GPU of the group,
                    # which with vLLM's data parallelism is every GPU of the box (one EP
                    # group of tp x dp GPUs, attention in dp ranks)
                    moe = model.moe
                    ep_options = [False]
                    if (
                        moe
                        and 1 < count <= MAX_EP_GROUP_IN_A_SERVER
                        and moe.num_experts % count == 0
                    ):
                        ep_options.append(True)
                    axes = (
                        formats,
                        kv_options,
                        specs,
                        links,
                        power_limits,
                        req.nodes,
                        req.max_num_seqs,
                        ep_options,
                    )
                    rows.append((model, gpu, count, tp, axes))
    return rows


def enumerate_candidates(req: PlanRequest, cat: Catalog) -> tuple[list[Candidate], int]:
    """Every configuration in the space, and how many were pruned for memory (a space of
    more than MAX_PLAN_CONFIGURATIONS is a user error, before any is checked)."""
    rows = search_grids(req, cat)
    refuse_a_search_past_the_limit(sum(math.prod(map(len, axes)) for *_, axes in rows))
    out: list[Candidate] = []
    pruned = 0
    for model, gpu, count, tp, axes in rows:
        for quant, kv, spec, link, watts, nodes, seqs, ep in itertools.product(*axes):
            ranks = count // tp if ep else 1  # vLLM DP+EP: attention ranks
            if ranks > 1 and nodes > 1:
                continue  # expert parallelism across nodes is not modelled
            fit = memory_fit(
                gpu,
                model,
                cat.quant(quant),
                tp=tp * ranks,
                kv_dtype=kv,
                drafter=drafter_for(cat, spec, quant, model),
                dp_attention=ranks,
            )
            if not fit.fits:
                pruned += 1
                continue
            candidate = Candidate(gpu.name, count, tp, model.name, quant, kv, spec, link, watts)
            candidate.nodes, candidate.max_num_seqs = nodes, seqs
            candidate.expert_parallel = ep
            out.append(candidate)
            if req.disaggregation and ranks == 1 and _moves_kv(gpu, count):
                out += [
                    dataclasses.replace(candidate, prefill_replicas=p)
                    for p in prefill_splits(candidate.replicas)
                ]
    refuse_a_search_past_the_limit(len(out) + pruned)  # with the disaggregated splits
    return out, pruned


def _moves_kv(gpu, count: int) -> bool:
    """Whether ``count`` of ``gpu`` have a link in the catalog that a disaggregated
    deployment's prefill instances could send KV over (none on a part with neither NVLink
    nor PCIe listed, such as a unified-memory box)."""
    from capsim.physics.kv_transfer import kv_transfer_link

    try:
        kv_transfer_link(gpu, count)
    except CapsimUserError:
        return False
    return True


PREFILL_SHARES = (0.25, 0.5, 0.75)
"""Shares of a deployment's replicas a plan with --disaggregation tries as prefill
instances (at least one prefill and one decode replica): llm-d's guide runs 8 of 10
instances as prefill for 5,000-token prompts and 250-token outputs, Mooncake's and SGLang's
1P1D examples half, so the right ratio follows the workload's prompt and output lengths."""


def prefill_splits(replicas: int) -> list[int]:
    """Prefill instances to try out of ``replicas`` (none below two replicas)."""
    if replicas < 2:
        return []
    return sorted({min(max(round(replicas * share), 1), replicas - 1) for share in PREFILL_SHARES})


def usable_interconnects(gpu, tp: int) -> list[str]:
    """Interconnect kinds that can join ``tp`` of this GPU (["auto"] when tp == 1)."""
    if tp == 1:
        return ["auto"]
    kinds = []
    for ic in gpu.interconnects:
        try:
            choose_interconnect(gpu, tp, ic.kind)
        except CapsimUserError:
            continue
        kinds.append(ic.kind)
    return kinds


def _evaluate(args) -> PlanFigures | str:
    """One candidate simulated in steady state (see STEADY_REQUESTS_PER_AGENT), or the
    engine's reason for refusing it."""
    candidate, req, extra_dirs = args
    cat = process_catalog(extra_dirs)
    try:
        result = calibrated_predict(candidate.config(req), cat, keep_records=True, workers=1)
    except CapsimUserError as exc:
        return exc.message
    level = result.levels[0]
    objectives = Objectives(min_agent_tok_s=req.min_agent_tok_s, max_ttft_p90_s=req.max_ttft_p90_s)
    point = measure_point(level, objectives, pessimistic=req.pessimistic)
    band = level.band_80.get("output_tok_s") if level.band_80 else None
    shortfalls = []
    if req.min_agent_tok_s is not None:
        agent = point.agent_tok_s * (
            pessimistic_factors(level).get("per_request_output_tok_s", 1.0)
            if req.pessimistic
            else 1.0
        )
        shortfalls.append(max(0.0, 1.0 - agent / req.min_agent_tok_s))
    if req.max_ttft_p90_s is not None:
        ttft = point.ttft_p90_s * (
            pessimistic_factors(level).get("ttft_p90_ms", 1.0) if req.pessimistic else 1.0
        )
        shortfalls.append(max(0.0, ttft / req.max_ttft_p90_s - 1.0))
    return PlanFigures(
        output_tok_s=level.metrics.output_tok_s,
        per_agent_tok_s=point.agent_tok_s,
        ttft_p90_s=point.ttft_p90_s,
        band=band,
        misses=point.misses,
        shortfalls=shortfalls,
        max_model_len=result.max_model_len,
    )


@dataclass
class PlanFigures:
    """What one candidate's simulation gives the plan (picklable, from a worker)."""

    output_tok_s: float
    per_agent_tok_s: float
    ttft_p90_s: float
    band: tuple[float, float] | None
    misses: list[str]  # the SLOs it misses (capacity.measure_point's wording)
    shortfalls: list[float]  # relative shortfall per SLO checked (0 where met)
    max_model_len: int


DASK_CONNECT_TIMEOUT_S = 5.0
"""How long to wait for a Dask scheduler before giving up, seconds: a scheduler answers
within milliseconds on a network that reaches it; at 10 s a wrong address took 11 s to
be reported (issue 47: no bad input may hang past 10 s)."""


def _connect_dask(client_type, scheduler: str):
    """A Dask client connected to ``scheduler``, or a user error within about
    1.5 x DASK_CONNECT_TIMEOUT_S: Dask's own timeout does not cover a server that accepts the
    connection and never answers its handshake (an HTTP server held it 30 s), and one that
    answers something else made it read 'HTTP/1.1' as a frame length and try to allocate
    3 EiB. The connection is made in a daemon thread that is left behind if it hangs."""
    import threading

    outcome: dict = {}

    def connect() -> None:
        try:
            outcome["client"] = client_type(scheduler, timeout=f"{DASK_CONNECT_TIMEOUT_S}s")
        except BaseException as exc:  # any failure is the address's, reported below
            outcome["error"] = exc

    thread = threading.Thread(target=connect, name="dask-connect", daemon=True)
    thread.start()
    thread.join(1.5 * DASK_CONNECT_TIMEOUT_S)
    if "client" in outcome:
        return outcome["client"]
    why = outcome.get("error")
    said = f"{type(why).__name__}: {why}" if why is not None else "no Dask handshake came back"
    raise CapsimUserError(
        f"cannot reach a Dask scheduler at {scheduler} (--dask-scheduler): {said}"[:400],
        hint="check the address (tcp://host:8786) and that a Dask scheduler listens there",
    )


def _evaluate_on_dask(args: list, scheduler: str) -> list:
    """Run the simulations on a Dask cluster (``pip install 'capsim[dask]'``).

    ``scheduler`` is a scheduler address (``tcp://host:8786``) or a
    ``distributed.Client`` already connected. Workers need capsim installed and, for
    ``--db`` overlays, the same paths readable.
    """
    try:
        from distributed import Client
    except ImportError as exc:
        raise CapsimUserError(
            "--dask-scheduler needs Dask's distributed scheduler, which is not installed",
            hint="pip install 'capsim[dask]'",
        ) from exc
    own = not isinstance(scheduler, Client)
    client = _connect_dask(Client, scheduler) if own else scheduler
    try:
        return client.gather(client.map(_evaluate, args, pure=False))
    finally:
        if own:
            client.close()


def simulate_each(
    candidates: list[Candidate],
    req: PlanRequest,
    cat: Catalog,
    workers: int | None = None,
    dask_scheduler=None,
) -> Iterator[tuple[Candidate, Any]]:
    """Simulate every candidate (in local processes, or on a Dask cluster), yielding each
    with its result (or the engine's refusal, a string) in the candidates' order as they
    finish: a caller can count them, and keep those done when it stops early (the local
    processes are stopped with the generator)."""
    jobs = workers or cores_for(len(candidates))
    args = [(c, req, cat.directories[1:]) for c in candidates]
    if dask_scheduler is not None:
        yield from zip(candidates, _evaluate_on_dask(args, dask_scheduler), strict=True)
    elif jobs > 1 and len(candidates) > 1:
        with worker_pool(jobs) as pool:
            # one configuration a task (each is a simulation of 0.1-1 s): the caller counts
            # them as they finish, and a stop keeps all but those in flight
            yield from zip(candidates, pool.map(_evaluate, args), strict=True)
    else:
        for a in args:
            yield a[0], _evaluate(a)


def evaluate(
    candidates: list[Candidate],
    req: PlanRequest,
    cat: Catalog,
    workers: int | None = None,
    dask_scheduler=None,
) -> list[Evaluated]:
    """Simulate every candidate and apply costs and SLOs (``judge``)."""
    return judge(list(simulate_each(candidates, req, cat, workers, dask_scheduler)), req, cat)


def judge(pairs: list[tuple[Candidate, Any]], req: PlanRequest, cat: Catalog) -> list[Evaluated]:
    """Costs and SLOs for simulated candidates (``simulate_each``'s pairs); those the engine
    refused are left out, and a user error says so when every one was."""
    evaluated = []
    rejected = []
    for c, r in pairs:
        if isinstance(r, str):
            rejected.append(f"{c.label()}: {r}")
            continue  # rejected by the engine (e.g. prompts longer than max_model_len)
        gpu = cat.gpu(c.gpu)
        cost = cost_of(gpu, c.total_gpus, r.output_tok_s, req.cost, power_limit_w=c.power_limit_w)
        reasons = list(r.misses)
        shortfalls = list(r.shortfalls)
        if req.budget_usd is not None:
            spend = cost.purchase_usd if req.cost.cloud_usd_per_gpu_hour is None else cost.total_usd
            if spend is None:
                reasons.append("no price in the catalog")
                shortfalls.append(1.0)
            elif spend > req.budget_usd:
                reasons.append(f"cost {spend:,.0f} > budget {req.budget_usd:,.0f} USD")
                shortfalls.append(spend / req.budget_usd - 1.0)
        evaluated.append(
            Evaluated(
                c,
                r.output_tok_s,
                r.per_agent_tok_s,
                r.ttft_p90_s,
                cost,
                not reasons,
                reasons,
                r.band,
                slo_distance=math.sqrt(sum(x * x for x in shortfalls)),
                max_model_len=r.max_model_len,
            )
        )
    if rejected and not evaluated:
        raise CapsimUserError(
            f"none of the {len(rejected)} configurations could be simulated; the first: "
            + rejected[0]
        )
    return evaluated


def closest_to_slos(items: list[Evaluated]) -> Evaluated:
    """The configuration nearest to meeting every SLO (smallest ``slo_distance``; the
    higher aggregate throughput breaks a tie)."""
    return min(items, key=lambda e: (e.slo_distance, -e.output_tok_s))


def frontier_throughput(items: list[Evaluated]) -> list[int]:
    """Pareto frontier of aggregate vs per-agent throughput (both higher is better)."""
    return pareto_front([(e.output_tok_s, e.per_agent_tok_s) for e in items], [True, True])


def frontier_cost(items: list[Evaluated]) -> list[int]:
    """Pareto frontier of total cost (lower) vs aggregate throughput (higher), priced only."""
    priced = [i for i, e in enumerate(items) if e.cost.total_usd is not None]
    front = pareto_front(
        [(items[i].cost.total_usd, items[i].output_tok_s) for i in priced], [False, True]
    )
    return [priced[i] for i in front]


def _unpriced_last(value: float | None) -> float:
    return value if value is not None else float("inf")


RANKINGS = {
    "cost": lambda e: (not e.meets_slo, _unpriced_last(e.cost.total_usd), -e.output_tok_s),
    "throughput": lambda e: (
        not e.meets_slo,
        -e.output_tok_s,
        _unpriced_last(e.cost.total_usd),
    ),
    "cost-per-token": lambda e: (
        not e.meets_slo,
        _unpriced_last(e.cost.usd_per_million_output_tokens),
        -e.output_tok_s,
    ),
}
"""Sort keys of ``capsim plan --rank``: configurations that meet the SLOs always come first;
a configuration without a price ranks after every priced one on a cost key."""


@dataclass
class PlanOutcome:
    """Every configuration simulated, best first by the ranking, and how many the memory
    fit pruned before simulation."""

    configurations: list[Evaluated]
    pruned_for_memory: int


def plan_candidates(req: PlanRequest, cat: Catalog, rank: str) -> tuple[list[Candidate], int]:
    """The configurations ``req`` allows that fit in memory, and how many did not; a user
    error for an unknown ranking or when none fits."""
    if rank not in RANKINGS:
        raise CapsimUserError(
            f"unknown ranking '{rank}' (--rank)",
            hint="use " + ", ".join(RANKINGS),
            suggestions=close_matches(rank, RANKINGS),
        )
    candidates, pruned = enumerate_candidates(req, cat)
    if not candidates:
        raise CapsimUserError(
            "no configuration fits in memory",
            hint="allow more GPUs (--counts) or other GPUs (--gpus)",
        )
    if req.disaggregation and not any(c.prefill_replicas for c in candidates):
        raise CapsimUserError(
            "--disaggregation splits a deployment of two or more replicas into prefill and "
            "decode instances, and no deployment searched here has two replicas on GPUs "
            "with a link to move KV over",
            hint="allow more GPUs (--counts 2,4,8), or leave --disaggregation out",
        )
    return candidates, pruned


def ranked(items: list[Evaluated], pruned: int, rank: str) -> PlanOutcome:
    """``items`` ranked by ``rank`` (a key of RANKINGS; those meeting the SLOs first)."""
    return PlanOutcome(sorted(items, key=RANKINGS[rank]), pruned)


def search_plan(
    req: PlanRequest, cat: Catalog, rank: str = "throughput", dask_scheduler=None
) -> PlanOutcome:
    """Enumerate the configurations ``req`` allows, simulate those that fit, and rank
    them (``rank``: a key of RANKINGS; those meeting the SLOs first)."""
    candidates, pruned = plan_candidates(req, cat, rank)
    return ranked(evaluate(candidates, req, cat, dask_scheduler=dask_scheduler), pruned, rank)
