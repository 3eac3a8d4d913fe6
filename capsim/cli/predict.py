"""``capsim predict``: simulate concurrency sweeps and print, save or plot them."""

from __future__ import annotations

import itertools
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from capsim.cli.common import (
    DP_FLAGS,
    KV_DTYPE_FLAGS,
    OBJECTIVE_FLAGS,
    PLOT_HELP,
    QUANT_FLAGS,
    TP_FLAGS,
    AsyncSchedulingOption,
    AttentionBackendOption,
    ConservativenessOption,
    CpuOffloadOption,
    DbOption,
    DisableCustomAllReduceOption,
    DpAttentionOption,
    EnforceEagerOption,
    EngineOption,
    ExpertParallelOption,
    FlashAttnOption,
    ForceOption,
    GpuMemoryUtilizationOption,
    HicacheRatioOption,
    HicacheSizeOption,
    HierarchicalCacheOption,
    HostLinkOption,
    HostMemoryBandwidthOption,
    JsonOption,
    KvOffloadingOption,
    KvTransferBandwidthOption,
    LongRunNote,
    MaxModelLenOption,
    MaxNumBatchedTokensOption,
    MaxNumSeqsOption,
    MixedChunkOption,
    NCpuMoeOption,
    PpOption,
    PrefillReplicasOption,
    PrefillTpOption,
    ProfileOption,
    RecvIntervalOption,
    RouterCapacityOption,
    RouterLatencyOption,
    SetOption,
    UbatchOption,
    attention_ranks,
    catalog,
    check_plot_target,
    console,
    err_console,
    exclusive_outputs,
    exit_after_interrupt,
    finished_before_ctrl_c,
    flash_attention_choice,
    hicache_fields,
    objectives_from_flags,
    parse_overrides,
    predict_config,
    progress_bar,
    refuse_flags_of_other_engines,
    refuse_force_without_output,
    refuse_inapplicable_flags,
    refuse_links_without_tp,
    resolve_models,
    spec_config,
)
from capsim.cli.predict_output import plot, print_table, result_dict, write_csv
from capsim.engine.limits import MAX_CONCURRENCY, MAX_SEED
from capsim.engine.override_checks import (
    refuse_overrides_no_config_reads,
    refuse_overrides_no_model_reads,
    refuse_overrides_no_step_reads,
)
from capsim.errors import CapsimUserError, TooSmallToRead, plain_float, plain_int

if TYPE_CHECKING:
    from capsim.engine.simulate import PredictResult

MAX_LEVEL = MAX_CONCURRENCY
"""Highest concurrency a level may have."""

MAX_LEVELS = 4096
"""Most levels one flag may list: a range is checked before it is expanded, so
``1..1000000000`` is refused at once rather than filling memory."""


def parse_levels(text: str, what: str = "--concurrency") -> list[int]:
    """'1..8', '1,2,4,8', '1..64:x2' (doubling), '4..32:4' (step 4), or a mix with commas."""
    levels: list[int] = []
    hint = "use forms like 1..8, 1,2,4,8, 1..64:x2 or 8..64:8"
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)\.\.(\d+)(?::(x?)(\d+))?", part, re.ASCII)
        if m:
            lo, hi = int(m[1]), int(m[2])
            step = int(m[4]) if m[4] else 1
            if lo < 1 or hi < lo or step < 1 or (m[3] and step < 2):
                raise CapsimUserError(f"malformed {what} range '{part}'", hint=hint)
            if hi > MAX_LEVEL:
                raise CapsimUserError(
                    f"{what} above {MAX_LEVEL:,} is not supported (range '{part}')"
                )
            if not m[3] and (hi - lo) // step + 1 > MAX_LEVELS:
                raise CapsimUserError(
                    f"{what} range '{part}' lists {(hi - lo) // step + 1:,} levels; at most "
                    f"{MAX_LEVELS:,} are simulated in one run",
                    hint=f"thin it out with a step, e.g. {lo}..{hi}:x2 or {lo}..{hi}:"
                    f"{max(2, (hi - lo) // 64)}",
                )
            if m[3]:
                value = lo
                while value <= hi:
                    levels.append(value)
                    value *= step
            else:
                levels.extend(range(lo, hi + 1, step))
        elif re.fullmatch(r"\d+", part, re.ASCII) and int(part) >= 1:
            levels.append(int(part))
        else:
            raise CapsimUserError(f"malformed {what} '{text}' (at '{part}')", hint=hint)
    if max(levels) > MAX_LEVEL:
        raise CapsimUserError(f"{what} above {MAX_LEVEL:,} is not supported")
    refuse_repeats(levels, what, shown=lambda v: f"the level {v}")
    levels = sorted(levels)
    if len(levels) > MAX_LEVELS:
        raise CapsimUserError(
            f"{what} lists {len(levels):,} levels; at most {MAX_LEVELS:,} are simulated in one run",
            hint=hint,
        )
    return levels


def parse_rates(text: str) -> list[float]:
    try:
        rates = [plain_float(v) for v in text.split(",")]
    except ValueError as exc:
        why = f" ({exc})" if isinstance(exc, TooSmallToRead) else ""
        raise CapsimUserError(
            f"malformed --rate '{text}'{why}", hint="e.g. --rate 0.5,1,2"
        ) from None
    if not all(0 < r <= MAX_RATE for r in rates):  # NaN fails too
        raise CapsimUserError(
            f"--rate values must be positive, at most {MAX_RATE:,.0f} requests per second, "
            f"not '{text}'"
        )
    if len(rates) > MAX_LEVELS:
        raise CapsimUserError(
            f"--rate lists {len(rates):,} rates; at most {MAX_LEVELS:,} are simulated in one run",
            hint="thin the list out",
        )
    refuse_repeats(rates, "--rate", shown=lambda v: f"the rate {v:g}")
    return rates


MAX_RATE = 1_000_000.0
"""Fastest open-loop arrival rate, requests per second: far past any server (1e308 ran and
printed a 300-digit rate in a table it broke)."""


def split_list(text: str, flag: str = "a list", key=str.casefold) -> list[str]:
    """Comma-separated values, each stripped; an empty item (two commas, a comma at an
    end) or a value given twice (told apart by ``key``: case-folded, as catalog names are
    looked up) is an error naming ``flag``."""
    values = [v.strip() for v in text.split(",")]
    if not all(values):
        raise CapsimUserError(
            f"{flag} '{text}' has an empty item", hint="separate values by single commas"
        )
    refuse_repeats(values, flag, key=key)
    return values


def refuse_repeats(values, flag: str, key=None, shown=str) -> None:
    """A list flag's value given twice is an error naming it (the second would add
    nothing, or double a row, so it is most likely a typo for another value). ``key``
    tells values apart (case-folded names, parsed numbers); ``shown`` prints one."""
    seen = set()
    for v in values:
        k = v if key is None else key(v)
        if k in seen:
            raise CapsimUserError(f"{flag} lists {shown(v)} twice", hint="name each value once")
        seen.add(k)


def predict_with_progress(config, cat) -> PredictResult:
    """capsim.api.predict with a bar on stderr, when it is a terminal: requests
    simulated of all the levels'. The command has checked its --set values against every
    configuration it runs (an MoE parameter for a dense model beside an MoE one is taken),
    so each runs without the API's check of its own overrides."""
    from capsim.calibration.applied import calibrated_predict

    def predict(config, catalog, progress):
        return calibrated_predict(config, catalog, progress=progress)

    shorter = "fewer --requests or levels give an answer sooner"
    if not err_console.is_terminal:
        return predict(config, catalog=cat, progress=LongRunNote("requests simulated", shorter))
    with progress_bar() as bar:
        task = bar.add_task(f"{config.gpu} {config.model}", total=None)

        def show(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        note = LongRunNote("requests simulated", shorter, show, bar.console)
        return predict(config, catalog=cat, progress=note)


def predict_cmd(
    ctx: typer.Context,
    gpu: Annotated[str, typer.Option("--gpu", help="GPU name(s), comma-separated")],
    model: Annotated[str, typer.Option("--model", help="Model name(s), comma-separated")],
    quant: Annotated[str | None, typer.Option(*QUANT_FLAGS, help="Weight format(s)")] = None,
    concurrency: Annotated[
        str, typer.Option("--concurrency", "-c", help="Levels: 1..8, 1,2,4,8, 1..64:x2")
    ] = "1..8",
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs in total")] = None,
    tp: Annotated[
        str,
        typer.Option(*TP_FLAGS, help="Tensor-parallel size(s)"),
    ] = "1",
    pp: PpOption = 1,
    dp: Annotated[
        int | None,
        typer.Option(*DP_FLAGS, help="Data-parallel replicas"),
    ] = None,
    interconnect: Annotated[
        str, typer.Option("--interconnect", help="GPU links: auto, pcie or nvlink (list ok)")
    ] = "auto",
    kv_dtype: Annotated[str, typer.Option(*KV_DTYPE_FLAGS, help="auto, fp8 (list ok)")] = "auto",
    workload: Annotated[
        str, typer.Option("--workload", help="closed, batch, agents, open, trace")
    ] = "closed",
    requests: Annotated[
        int | None,
        typer.Option(
            "--requests",
            help="Requests per level [default: 8 x the level, at least 32; batch: rounds x C]",
        ),
    ] = None,
    rounds: Annotated[
        int, typer.Option("--rounds", help="Batch workload: rounds per level (default 4)")
    ] = 4,
    input_tokens: Annotated[
        str, typer.Option("--input-tokens", help="N or uniform:A,B / normal: / lognormal:")
    ] = "1024",
    output_tokens: Annotated[
        str, typer.Option("--output-tokens", help="Output tokens: N or a distribution, as above")
    ] = "512",
    rate: Annotated[
        str | None, typer.Option("--rate", help="Open-loop arrivals per second (list ok)")
    ] = None,
    arrival: Annotated[str, typer.Option("--arrival", help="poisson or gamma")] = "poisson",
    gamma_cv: Annotated[
        float,
        typer.Option("--gamma-cv", help="Open workload, --arrival gamma: CV of the gaps, 0.1-10"),
    ] = 2.0,
    turns: Annotated[int, typer.Option("--turns", help="Agent turns")] = 4,
    think_time: Annotated[str, typer.Option("--think-time", help="Seconds")] = "0",
    tool_tokens: Annotated[
        str, typer.Option("--tool-tokens", help="Agents: tool-result tokens added each turn")
    ] = "256",
    orchestrator: Annotated[
        bool, typer.Option("--orchestrator", help="Agents: one extra orchestrating agent")
    ] = False,
    trace: Annotated[Path | None, typer.Option("--trace", help="JSONL trace")] = None,
    max_num_seqs: MaxNumSeqsOption = None,
    max_num_batched_tokens: MaxNumBatchedTokensOption = None,
    max_model_len: MaxModelLenOption = None,
    gpu_memory_utilization: GpuMemoryUtilizationOption = None,
    spec: Annotated[
        str | None,
        typer.Option(
            "--spec",
            "--speculative-config",
            help='e.g. mtp:2, ngram:4, or vLLM\'s JSON \'{"method": "mtp", '
            '"num_speculative_tokens": 2}\'',
        ),
    ] = None,
    spec_acceptance: Annotated[
        str | None, typer.Option("--spec-acceptance", help="Rate, or one per position")
    ] = None,
    prefix_caching: Annotated[
        bool,
        typer.Option(
            "--prefix-caching/--no-prefix-caching",
            help="Automatic prefix caching: prompts that begin alike share KV blocks (on by "
            "default in vLLM and SGLang)",
        ),
    ] = True,
    power_limit: Annotated[float | None, typer.Option("--power-limit", help="W")] = None,
    enforce_eager: EnforceEagerOption = False,
    attention_backend: AttentionBackendOption = None,
    flash_attn: FlashAttnOption = None,
    async_scheduling: AsyncSchedulingOption = None,
    disable_custom_all_reduce: DisableCustomAllReduceOption = False,
    engine: EngineOption = "vllm",
    ubatch_size: UbatchOption = None,
    enable_expert_parallel: ExpertParallelOption = False,
    enable_dp_attention: DpAttentionOption = False,
    n_cpu_moe: NCpuMoeOption = 0,
    host_memory_bandwidth: HostMemoryBandwidthOption = None,
    host_link_bandwidth: HostLinkOption = None,
    cpu_offload_gb: CpuOffloadOption = 0.0,
    kv_offloading_size: KvOffloadingOption = 0.0,
    enable_hierarchical_cache: HierarchicalCacheOption = False,
    hicache_ratio: HicacheRatioOption = None,
    hicache_size: HicacheSizeOption = None,
    prefill_replicas: PrefillReplicasOption = 0,
    prefill_tp: PrefillTpOption = None,
    kv_transfer_bandwidth: KvTransferBandwidthOption = None,
    scheduler_recv_interval: RecvIntervalOption = 1,
    mixed_chunk: MixedChunkOption = False,
    schedule_conservativeness: ConservativenessOption = None,
    offline: Annotated[
        bool,
        typer.Option(
            "--offline",
            help="No API server in the loop (vllm bench throughput, llama-bench): no "
            "HTTP, tokenisation or streaming time",
        ),
    ] = False,
    router: Annotated[
        str,
        typer.Option(
            "--router",
            help="round_robin, random (a ClusterIP Service), least_outstanding, prefix_aware",
        ),
    ] = "round_robin",
    router_latency_ms: RouterLatencyOption = 0.0,
    router_capacity_rps: RouterCapacityOption = None,
    seed: Annotated[
        int,
        typer.Option(
            "--seed",
            max=MAX_SEED,
            help="Random seed of the drawn lengths and arrivals (0 to 2**64 - 1)",
        ),
    ] = 0,
    profile: ProfileOption = "auto",
    set_values: SetOption = None,
    json_out: JsonOption = False,
    csv_out: Annotated[bool, typer.Option("--csv", help="Print CSV on stdout")] = False,
    plot_path: Annotated[
        Path | None, typer.Option("--plot", help=PLOT_HELP.format(what="a chart"))
    ] = None,
    min_agent_tok_s: Annotated[
        float | None,
        typer.Option(
            "--min-agent-tok-s",
            help="With --plot: draw this objective for each client's tok/s (capsim capacity "
            "searches for the level that meets it)",
        ),
    ] = None,
    max_ttft_p90: Annotated[
        float | None,
        typer.Option(
            "--max-ttft-p90-s",
            "--max-ttft-p90",
            help="With --plot: draw this objective for TTFT p90 (seconds)",
        ),
    ] = None,
    force: ForceOption = False,
    db: DbOption = None,
) -> None:
    """Simulate N concurrent clients against a vLLM, SGLang or llama.cpp server and report
    throughput and latency per level."""
    from capsim.engine.router import ROUTER_POLICIES

    exclusive_outputs(json=json_out, csv=csv_out)
    drawn = objectives_from_flags(min_agent_tok_s=min_agent_tok_s, max_ttft_p90_s=max_ttft_p90)
    for field, value in drawn.model_dump(exclude_none=True).items():
        if plot_path is None:
            flag = OBJECTIVE_FLAGS[field]
            raise CapsimUserError(
                f"{flag} draws an objective on the plot, and no --plot was given",
                hint=f"add --plot FILE.png, or ask capsim capacity {flag} {value:g} for the "
                "largest load that meets it",
            )
    check_plot_target(plot_path, force)
    refuse_force_without_output(force, plot_path)
    objectives = dict(min_agent_tok_s=drawn.min_agent_tok_s, max_ttft_p90_s=drawn.max_ttft_p90_s)
    cat = catalog(db)
    # an unknown engine is a user error before anything runs
    refuse_flags_of_other_engines(ctx, cat.engine(engine).name)
    if workload not in ("closed", "batch", "agents", "open", "trace"):
        raise CapsimUserError(
            f"unknown workload '{workload}'",
            hint="use closed, batch, agents, open or trace",
        )
    if router not in ROUTER_POLICIES:
        raise CapsimUserError(
            f"unknown router '{router}'",
            hint="use " + ", ".join(ROUTER_POLICIES),
        )
    if arrival not in ("poisson", "gamma"):
        raise CapsimUserError(f"unknown arrival process '{arrival}'", hint="poisson or gamma")
    refuse_inapplicable_flags(ctx, workload, arrival)
    levels = parse_levels(concurrency) if workload != "open" else [1]
    rates = parse_rates(rate) if rate else []
    spec_cfg = spec_config(spec, spec_acceptance)
    overrides = parse_overrides(set_values)
    dp_attention = attention_ranks(enable_dp_attention, dp)
    if dp_attention > 1:
        dp = None  # --dp counts attention ranks on the TP group's GPUs, not replicas
    try:  # plain_int: int() read '0_2' as 2 (issue 47, round 7)
        tps = [plain_int(v) for v in split_list(tp, "--tp")]
    except ValueError as exc:
        raise CapsimUserError(f"malformed --tp '{tp}' ({exc})", hint="e.g. --tp 1,2") from None
    refuse_repeats(tps, "--tp")
    refuse_links_without_tp(tps, interconnect, disable_custom_all_reduce, engine)
    cat, models = resolve_models(cat, split_list(model, "--model"))
    refuse_overrides_no_model_reads(overrides, [cat.model(m.name) for m in models])
    # no list repeats a value (split_list, refuse_repeats, resolve_models refuse them)
    combos = itertools.product(
        split_list(gpu, "--gpu"),
        models,
        split_list(quant, "--quant") if quant else [None],
        tps,
        split_list(kv_dtype, "--kv-dtype"),
        split_list(interconnect, "--interconnect"),
    )
    configs = []
    single_gpu_rows = set()
    for g, m, q, t, kv, link in combos:
        if t == 1:  # links matter only between the GPUs of a TP group: one row at --tp 1
            if (g, m, q, kv) in single_gpu_rows:
                continue
            single_gpu_rows.add((g, m, q, kv))
            link = "auto"  # and its label names no link
        config = predict_config(
            gpu=g,
            model=m.name,
            quant=q or m.quant,
            gpus=gpus,
            tp=t,
            pp=pp,
            dp=dp,
            interconnect=link,
            kv_dtype=kv,
            workload=workload,
            concurrency=levels,
            rates=rates,
            requests=requests,
            batch_rounds=rounds,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            turns=turns,
            think_time=think_time,
            tool_tokens=tool_tokens,
            orchestrator=orchestrator,
            arrival=arrival,
            gamma_cv=gamma_cv,
            trace=str(trace) if trace else None,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            spec=spec_cfg,
            prefix_caching=prefix_caching,
            power_limit_w=power_limit,
            enforce_eager=enforce_eager,
            attention_backend=attention_backend,
            flash_attention=flash_attention_choice(flash_attn),
            async_scheduling=async_scheduling,
            custom_allreduce=False if disable_custom_all_reduce else None,
            engine=engine,
            ubatch_tokens=ubatch_size,
            cpu_moe_layers=n_cpu_moe,
            expert_parallel=enable_expert_parallel,
            dp_attention=dp_attention,
            host_memory_bandwidth_gbs=host_memory_bandwidth,
            host_link_gbs=host_link_bandwidth,
            cpu_offload_gb=cpu_offload_gb,
            kv_offloading_gb=kv_offloading_size,
            **hicache_fields(enable_hierarchical_cache, hicache_ratio, hicache_size),
            prefill_replicas=prefill_replicas,
            prefill_tp=prefill_tp,
            kv_transfer_gbs=kv_transfer_bandwidth,
            scheduler_recv_interval=scheduler_recv_interval,
            mixed_chunk=mixed_chunk,
            schedule_conservativeness=schedule_conservativeness,
            offline=offline,
            router=router,
            router_latency_s=router_latency_ms / 1e3,
            router_capacity_rps=router_capacity_rps,
            seed=seed,
            profile=profile,
            efficiency_overrides=overrides,
        )
        configs.append(config)
    refuse_overrides_no_config_reads(overrides, configs)
    refuse_overrides_no_step_reads(overrides, configs, cat)
    simulations = len(configs) * max(len(levels), len(rates))
    if simulations > MAX_LEVELS:
        raise CapsimUserError(
            f"{len(configs):,} deployments x {max(len(levels), len(rates)):,} levels are "
            f"{simulations:,} simulations; at most {MAX_LEVELS:,} run in one command",
            hint="fewer levels (a step, e.g. 1..256:x2) or fewer values in the lists",
        )
    refuse_a_router_without_replicas(ctx, configs, cat)
    if (router_latency_ms or router_capacity_rps) and offline:
        raise CapsimUserError(
            "--router-latency-ms and --router-capacity-rps describe a gateway in front of a "
            "server, and --offline runs have none",
            hint="drop them, or --offline",
        )
    results, stopped = finished_before_ctrl_c(
        (predict_with_progress(config, cat) for config in configs),
        len(configs),
        "configurations predicted",
        "the results cover those",
        plot_path,
    )
    with exit_after_interrupt(stopped):
        show_results(results, json_out, csv_out, None if stopped else plot_path, objectives)


def show_results(results, json_out, csv_out, plot_path, objectives) -> None:
    """The predictions as a table, JSON or CSV, and the plot."""
    if json_out:
        sys.stdout.write(
            json.dumps({"results": [result_dict(r) for r in results]}, indent=2) + "\n"
        )
    elif csv_out:
        sys.stdout.write(write_csv(results))
    else:
        print_table(console, results)
    if plot_path is not None:
        plot(results, plot_path, **objectives)


def refuse_a_router_without_replicas(ctx, configs, cat) -> None:
    """--router chooses a replica for each request: typed for deployments that have one
    replica each (or an offline run, which has no server to route to) it changed nothing,
    without a word (issue 47's fourth audit). vLLM's --dp N with --enable-expert-parallel
    is one server (one expert-parallel group), whatever N."""
    source = ctx.get_parameter_source("router") if "router" in ctx.params else None
    if getattr(source, "name", None) not in ("COMMANDLINE", "ENVIRONMENT"):
        return
    if all(c.offline for c in configs):
        raise CapsimUserError(
            "--router applies to a server's replicas, not to --offline runs",
            hint="drop --router, or --offline",
        )
    from capsim.engine.setup import replica_count, vllm_data_parallel_experts

    def replicas(c) -> int:
        engine = c.engine.split("@")[0].strip().lower()
        return replica_count(vllm_data_parallel_experts(c, cat.model(c.model), engine))

    if max(replicas(c) for c in configs) < 2:
        raise CapsimUserError(
            "--router chooses among replicas, and this deployment has one",
            hint="drop --router, or give replicas: --gpus (a multiple of --tp) or --dp",
        )
