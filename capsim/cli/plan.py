"""``capsim plan``: which box, format and flags meet a workload's SLOs, at what cost."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box

from capsim.cli.common import (
    PLOT_HELP,
    DbOption,
    ForceOption,
    InputTokensOption,
    JsonOption,
    MaxTtftP90Option,
    MinAgentTokSOption,
    OutputTokensOption,
    catalog,
    check_plot_target,
    console,
    exit_after_interrupt,
    finished_before_ctrl_c,
    fitted_table,
    print_json,
    refuse_force_without_output,
    resolve_models,
    save_figure,
)
from capsim.cli.predict import refuse_repeats, split_list
from capsim.engine.limits import MAX_BUDGET_USD, MAX_PLAN_CONFIGURATIONS
from capsim.errors import CapsimUserError, NotPlainNumber, plain_float, plain_int

if TYPE_CHECKING:
    from capsim.planner.search import Evaluated, PlanRequest


def pareto_table(items, front: list[int]):
    """The cost-vs-throughput Pareto frontier as a table, cheapest first: the
    configurations no other beats on both total cost and aggregate output tok/s."""
    from rich import box
    from rich.table import Table

    table = Table(
        title="Pareto frontier: total cost vs output tok/s (no other is cheaper and faster)",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
    )
    table.add_column("configuration", min_width=20)
    for col in ("tok/s", "per\nagent", "TTFT\np90", "cost\nUSD", "SLO"):
        table.add_column(col, justify="right", no_wrap=True)
    for i in sorted(front, key=lambda i: items[i].cost.total_usd):
        e = items[i]
        table.add_row(
            e.candidate.label(),
            f"{e.output_tok_s:,.0f}",
            f"{e.per_agent_tok_s:.1f}",
            f"{e.ttft_p90_s:.1f}s",
            f"{e.cost.total_usd:,.0f}",
            "yes" if e.meets_slo else "no",
        )
    return table


def plot_frontiers(items, front_cost, path: Path, req: PlanRequest) -> None:
    """Two panels, one colour per GPU, configurations that miss an SLO hollow. Left: what
    each agent gets against its TTFT p90 (log), the objectives as dashed lines. Right: total
    cost (log) against aggregate tok/s, the cost Pareto frontier drawn and each of its
    configurations labelled."""
    from capsim.cli.common import file_matplotlib

    file_matplotlib()
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    gpus = list(dict.fromkeys(e.candidate.gpu for e in items))
    color_of = {g: colors[i % len(colors)] for i, g in enumerate(gpus)}
    for gpu in gpus:
        for meets in (True, False):
            group = [e for e in items if e.candidate.gpu == gpu and e.meets_slo == meets]
            if not group:
                continue
            style = dict(
                s=28,
                edgecolors=color_of[gpu],
                facecolors=color_of[gpu] if meets else "none",
                label=gpu if meets else f"{gpu} (misses an SLO)",
            )
            left.scatter([e.per_agent_tok_s for e in group], [e.ttft_p90_s for e in group], **style)
            priced = [e for e in group if e.cost.total_usd is not None]
            right.scatter(
                [e.cost.total_usd for e in priced], [e.output_tok_s for e in priced], **style
            )
    if req.min_agent_tok_s is not None:
        left.axvline(req.min_agent_tok_s, color="tab:red", ls="--", lw=1, label="SLO")
    if req.max_ttft_p90_s is not None:
        left.axhline(req.max_ttft_p90_s, color="tab:red", ls="--", lw=1)
    left.set_yscale("log")
    left.set_xlabel("output tok/s each agent gets (steady state)")
    left.set_ylabel("TTFT p90 (s, log scale)")
    left.legend(fontsize=7, loc="best")
    front = sorted((items[i] for i in front_cost), key=lambda e: e.cost.total_usd)
    right.plot(
        [e.cost.total_usd for e in front],
        [e.output_tok_s for e in front],
        "-",
        color="0.3",
        lw=1,
        label="Pareto frontier (nothing cheaper is faster)",
    )
    for e in front:
        c = e.candidate
        right.annotate(
            f"{c.count}x {c.gpu} {c.quant}" + (f" TP{c.tp}" if c.tp > 1 else ""),
            (e.cost.total_usd, e.output_tok_s),
            xytext=(5, -10),
            textcoords="offset points",
            fontsize=7,
        )
    if req.budget_usd is not None:
        right.axvline(req.budget_usd, color="tab:red", ls="--", lw=1, label="budget")
    right.set_xscale("log")
    right.set_xlabel("total cost over the horizon (USD, log scale)")
    right.set_ylabel("aggregate output tok/s")
    right.legend(fontsize=7, loc="upper left")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    left.yaxis.set_major_formatter(plain)
    left.yaxis.set_minor_formatter(plain)
    right.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"${v / 1000:,.0f}k"))
    right.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    right.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    for axis in (left, right):
        axis.grid(alpha=0.3, which="both")
    fig.suptitle(
        f"capsim plan: {', '.join(req.models)} for {req.agents} agents, "
        f"{req.input_tokens} in / {req.output_tokens} out tokens",
        fontsize=11,
    )
    fig.tight_layout()
    save_figure(fig, path)


MAX_GPUS_PER_NODE = 72
"""The largest --counts: GPUs in one NVLink domain (GB200 NVL72)."""

MAX_NODES = 1024
"""The largest --nodes the planner simulates (each replica is simulated)."""


def positive_ints(text: str, flag: str, example: str, most: int | None = None) -> tuple[int, ...]:
    """A comma-separated list of positive integers (at most ``most``), or a clear error."""
    try:  # plain_int: int() read '0_1' as 1 and '1_0' as 10 (issue 47, round 7)
        values = tuple(plain_int(v) for v in split_list(text, flag))
    except ValueError as exc:
        raise CapsimUserError(f"malformed {flag} '{text}' ({exc})", hint=example) from None
    refuse_repeats(values, flag)
    if not values or min(values) < 1:
        raise CapsimUserError(f"{flag} '{text}' needs positive integers", hint=example)
    if most is not None and max(values) > most:
        raise CapsimUserError(f"{flag} '{text}': at most {most}", hint=example)
    return values


def short_misses(e: Evaluated, req: PlanRequest) -> str:
    """A table-sized account of which SLOs a configuration misses (full text in --json)."""
    out = []
    if req.min_agent_tok_s is not None and e.per_agent_tok_s < req.min_agent_tok_s:
        out.append("tok/s")
    if req.max_ttft_p90_s is not None and e.ttft_p90_s > req.max_ttft_p90_s:
        out.append("TTFT")
    if any("budget" in r or "price" in r for r in e.reasons):
        out.append("$")
    return "no: " + "+".join(out)


def plan_cmd(
    ctx: typer.Context,
    model: Annotated[str, typer.Option("--model", help="Model name(s), comma-separated")],
    agents: Annotated[
        int,
        typer.Option(
            "--agents",
            "--concurrency",
            help="Concurrent agents (clients; --concurrency as in predict and capacity)",
        ),
    ],
    input_tokens: InputTokensOption = "1024",
    output_tokens: OutputTokensOption = "512",
    min_agent_tok_s: MinAgentTokSOption = None,
    max_ttft_p90: MaxTtftP90Option = None,
    budget: Annotated[
        float | None,
        typer.Option(
            "--budget",
            help=f"Most USD a configuration may cost (above 0, at most {MAX_BUDGET_USD:g})",
        ),
    ] = None,
    gpus: Annotated[str | None, typer.Option("--gpus", help="Candidate GPUs (default all)")] = None,
    counts: Annotated[str, typer.Option("--counts", help="GPUs per box to try")] = "1,2,4,8",
    nodes: Annotated[
        str, typer.Option("--nodes", help="Node counts to try (DP over nodes behind a router)")
    ] = "1",
    max_num_seqs: Annotated[
        str | None,
        typer.Option("--max-num-seqs", help="vLLM --max-num-seqs values to try (default: vLLM's)"),
    ] = None,
    router: Annotated[
        str,
        typer.Option(
            "--router",
            help="round_robin, random (a ClusterIP Service), least_outstanding, prefix_aware",
        ),
    ] = "least_outstanding",
    router_latency_ms: Annotated[
        float, typer.Option("--router-latency-ms", help="Latency the router adds per request")
    ] = 0.0,
    router_capacity_rps: Annotated[
        float | None,
        typer.Option("--router-capacity-rps", help="Requests/s the router can pass"),
    ] = None,
    pessimistic: Annotated[
        bool,
        typer.Option(
            "--pessimistic",
            help="Require the SLOs at the pessimistic edge of each figure's 80% band, "
            "not at the prediction",
        ),
    ] = False,
    disaggregation: Annotated[
        bool,
        typer.Option(
            "--disaggregation",
            help="Also try each deployment of 2+ replicas split into prefill and decode "
            "instances (a quarter, half and three quarters of its replicas prefilling)",
        ),
    ] = False,
    power_limits: Annotated[
        str,
        typer.Option(
            "--power-limits",
            help="Power limits to try as fractions of TDP, e.g. 1,0.8,0.7 (1 = no limit)",
        ),
    ] = "1",
    years: Annotated[
        float, typer.Option("--years", help="Horizon the cost is counted over, years")
    ] = 3.0,
    kwh_price: Annotated[float, typer.Option("--kwh-price", help="USD per kWh")] = 0.15,
    duty_cycle: Annotated[
        float,
        typer.Option(
            "--duty-cycle",
            help="Share of the horizon the box serves at the simulated load (energy, cloud "
            "hours and the tokens $/Mtok divides by), above 0 and at most 1",
        ),
    ] = 1.0,
    cloud_hourly: Annotated[
        float | None, typer.Option("--cloud-hourly", help="USD per GPU-hour instead of buying")
    ] = None,
    top: Annotated[
        int,
        typer.Option(
            "--top",
            help="Rows to show (at most 100,000, the most configurations a search holds)",
            min=1,
            max=MAX_PLAN_CONFIGURATIONS,
        ),
    ] = 10,
    rank: Annotated[
        str,
        typer.Option(
            "--rank",
            help="Order of the configurations that meet the SLOs: cost (cheapest first), "
            "throughput (most output tok/s first) or cost-per-token (fewest USD per "
            "million output tokens first)",
        ),
    ] = "cost",
    plot_path: Annotated[
        Path | None, typer.Option("--plot", help=PLOT_HELP.format(what="the frontier plots"))
    ] = None,
    dask_scheduler: Annotated[
        str | None,
        typer.Option(
            "--dask-scheduler",
            help="Run the simulations on this Dask scheduler (tcp://host:8786); "
            "needs pip install 'capsim[dask]'",
        ),
    ] = None,
    json_out: JsonOption = False,
    force: ForceOption = False,
    db: DbOption = None,
) -> None:
    """Search GPUs, counts, TP x DP, formats, KV dtype and speculation for a workload."""
    check_plot_target(plot_path, force)
    refuse_force_without_output(force, plot_path)
    from capsim.engine.router import ROUTER_POLICIES
    from capsim.planner.costs import CostModel
    from capsim.planner.search import (
        PlanRequest,
        judge,
        plan_candidates,
        ranked,
        simulate_each,
    )

    cat = catalog(db)
    gpu_counts = positive_ints(counts, "--counts", "e.g. 1,2,4,8", MAX_GPUS_PER_NODE)
    try:
        # plain_float: float() read '0_1' as 1.0, no limit (issue 47, round 7)
        power_fractions = tuple(plain_float(v) for v in split_list(power_limits, "--power-limits"))
        refuse_repeats(power_fractions, "--power-limits", shown=lambda v: f"{v:g}")
    except ValueError as exc:
        why = f" ({exc})" if isinstance(exc, NotPlainNumber) else ""  # it names the value
        raise CapsimUserError(
            f"malformed --power-limits '{power_limits}'{why}", hint="fractions of TDP, e.g. 1,0.8"
        ) from None
    if not power_fractions or any(not 0.2 <= f <= 1 for f in power_fractions):
        raise CapsimUserError(
            f"--power-limits '{power_limits}' must be fractions of TDP between 0.2 and 1",
            hint="e.g. --power-limits 1,0.8,0.7",
        )
    node_counts = positive_ints(nodes, "--nodes", "e.g. 1,2,4", MAX_NODES)
    seqs: tuple[int | None, ...] = (None,)
    if max_num_seqs:
        seqs = positive_ints(max_num_seqs, "--max-num-seqs", "e.g. 64,128,256")
    if router not in ROUTER_POLICIES:
        raise CapsimUserError(
            f"unknown --router '{router}'", hint="one of " + ", ".join(ROUTER_POLICIES)
        )
    if not (math.isfinite(router_latency_ms) and 0 <= router_latency_ms <= 60_000) or (
        router_capacity_rps is not None
        and not (math.isfinite(router_capacity_rps) and 0 < router_capacity_rps <= 1e9)
    ):
        raise CapsimUserError(
            "--router-latency-ms must be 0 to 60,000 and --router-capacity-rps above 0 (at "
            "most 1e9), finite numbers",
            hint="e.g. --router-latency-ms 2 --router-capacity-rps 500",
        )
    kwh_given = getattr(ctx.get_parameter_source("kwh_price"), "name", None) == "COMMANDLINE"
    if kwh_given and cloud_hourly is not None:
        raise CapsimUserError(
            "--kwh-price prices the energy of GPUs you buy; with --cloud-hourly the hourly "
            "price pays for the power",
            hint="drop --kwh-price, or --cloud-hourly to price buying",
        )
    router_given = getattr(ctx.get_parameter_source("router"), "name", None) == "COMMANDLINE"
    router_flags = router_given or router_latency_ms or router_capacity_rps is not None
    if router_flags and max(gpu_counts) == 1 and max(node_counts) == 1:
        # one GPU, one node: no searched deployment has two replicas to route between
        raise CapsimUserError(
            "--router, --router-latency-ms and --router-capacity-rps spread requests over "
            "replicas, and every deployment searched here (--counts 1, one node) has one",
            hint="add GPU counts above 1 (--counts 1,2,4) or nodes, or leave the router out",
        )
    cat, refs = resolve_models(cat, split_list(model, "--model"))
    if gpus and any(f < 1 for f in power_fractions):
        no_tdp = [
            g.name for g in (cat.gpu(n) for n in split_list(gpus, "--gpus")) if g.tdp_w is None
        ]
        if len(no_tdp) == len(split_list(gpus, "--gpus")):
            # the limits were dropped without a word (predict refuses --power-limit there)
            raise CapsimUserError(
                f"--power-limits are fractions of a GPU's TDP, and the catalog gives none for "
                f"{', '.join(no_tdp)}",
                hint="leave --power-limits out, or search GPUs with a TDP (capsim gpus)",
            )
        if no_tdp:
            from capsim.notices import notice

            notice(
                f"--power-limits: {', '.join(no_tdp)} ha{'s' if len(no_tdp) == 1 else 've'} "
                "no TDP in the catalog and run without a limit"
            )
    req = PlanRequest(
        models=tuple(r.name for r in refs),
        agents=agents,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        min_agent_tok_s=min_agent_tok_s,
        max_ttft_p90_s=max_ttft_p90,
        budget_usd=budget,
        gpus=tuple(cat.gpu(g).name for g in split_list(gpus, "--gpus")) if gpus else None,
        gpu_counts=gpu_counts,
        power_fractions=power_fractions,
        nodes=node_counts,
        max_num_seqs=seqs,
        router=router,
        router_latency_s=router_latency_ms / 1e3,
        router_capacity_rps=router_capacity_rps,
        pessimistic=pessimistic,
        disaggregation=disaggregation,
        cost=CostModel(
            years=years,
            kwh_price_usd=kwh_price,
            cloud_usd_per_gpu_hour=cloud_hourly,
            duty_cycle=duty_cycle,
        ),
    )
    candidates, pruned = plan_candidates(req, cat, rank)
    pairs, stopped = finished_before_ctrl_c(
        simulate_each(candidates, req, cat, dask_scheduler=dask_scheduler),
        len(candidates),
        "configurations simulated",
        "the plan covers those",
        plot_path,
        bar_text="simulating configurations",
        shorter="fewer values in --gpus, --counts, --nodes, --max-num-seqs or --power-limits "
        "give an answer sooner",
    )
    with exit_after_interrupt(stopped):
        items = ranked(judge(pairs, req, cat), pruned, rank).configurations
        show_plan(items, pruned, req, cat, agents, rank, top, json_out, plot_path, stopped)


def show_plan(items, pruned, req, cat, agents, rank, top, json_out, plot_path, stopped) -> None:
    """The plan's tables (or JSON), the winner's serve line and the plot."""
    from capsim.planner.costs import cost_assumptions, cost_caption
    from capsim.planner.search import closest_to_slos, frontier_cost, frontier_throughput
    from capsim.planner.serve_command import effective_max_num_seqs, winner_serve_command

    front_tp, front_cost = frontier_throughput(items), frontier_cost(items)
    winners = [e for e in items if e.meets_slo]
    shown = [*items[:top], *(items[i] for i in front_cost)]  # the rows of both tables
    priced_gpus = [cat.gpu(g) for g in dict.fromkeys(e.candidate.gpu for e in shown)]
    if json_out:
        print_json(
            {
                "simulated": len(items),
                "pruned_for_memory": pruned,
                "cost_assumptions": cost_assumptions(
                    req.cost, [cat.gpu(g) for g in dict.fromkeys(e.candidate.gpu for e in items)]
                ),
                "configurations": [
                    {
                        "label": e.candidate.label(),
                        "gpu": e.candidate.gpu,
                        "count": e.candidate.count,
                        "nodes": e.candidate.nodes,
                        "max_num_seqs": effective_max_num_seqs(e.candidate, cat),
                        "tp": e.candidate.tp,
                        "dp": e.candidate.dp,
                        "model": e.candidate.model,
                        "quant": e.candidate.quant,
                        "kv_dtype": e.candidate.kv_dtype,
                        "expert_parallel": e.candidate.expert_parallel,
                        "prefill_replicas": e.candidate.prefill_replicas,
                        "spec": e.candidate.spec.model_dump() if e.candidate.spec else None,
                        "interconnect": e.candidate.interconnect,
                        "power_limit_w": e.candidate.power_limit_w,
                        "output_tok_s": e.output_tok_s,
                        "output_tok_s_band_80": e.output_band_80,
                        "per_agent_tok_s": e.per_agent_tok_s,
                        "ttft_p90_s": e.ttft_p90_s,
                        "meets_slo": e.meets_slo,
                        "misses": e.reasons,
                        "slo_distance": e.slo_distance,
                        "max_model_len": e.max_model_len,
                        "serve_command": winner_serve_command(e, cat),
                        "cost_usd": e.cost.total_usd,
                        "purchase_usd": e.cost.purchase_usd,
                        "energy_usd": e.cost.energy_usd,
                        "usd_per_million_output_tokens": e.cost.usd_per_million_output_tokens,
                        "on_throughput_frontier": i in front_tp,
                        "on_cost_frontier": i in front_cost,
                    }
                    for i, e in enumerate(items)
                ],
            }
        )
    else:
        banded = any(e.output_band_80 for e in items[:top])
        headers = ["configuration", "tok/s", "per\nagent", "TTFT\np90", "cost\nUSD", "$/Mtok"]
        if banded:
            headers.insert(2, "80%\nband")
        # the configuration wraps where the terminal is narrow; the figures stay whole
        columns = [(h, "left" if h == "configuration" else "right", False) for h in headers]
        columns.append(("SLO", "left", False))
        rows = []
        for e in items[:top]:
            band = []
            if banded:
                lo_hi = e.output_band_80
                band = [f"{lo_hi[0]:,.0f}-{lo_hi[1]:,.0f}" if lo_hi else "—"]
            rows.append(
                [
                    e.candidate.label(),
                    f"{e.output_tok_s:,.0f}",
                    *band,
                    f"{e.per_agent_tok_s:.1f}",
                    f"{e.ttft_p90_s:.1f}s",
                    "—" if e.cost.total_usd is None else f"{e.cost.total_usd:,.0f}",
                    "—"
                    if e.cost.usd_per_million_output_tokens is None
                    else f"{e.cost.usd_per_million_output_tokens:.2f}",
                    "yes" if e.meets_slo else short_misses(e, req),
                ]
            )
        table = fitted_table(
            f"capsim plan: {agents} agents, ranked by {rank}",
            columns,
            rows,
            caption=f"{len(items)} configurations simulated, {pruned} pruned for memory\n"
            + cost_caption(req.cost, priced_gpus),
            cell_padding=2,
            box=box.SIMPLE_HEAD,
            collapse_padding=True,
            pad_edge=False,
        )
        console.print(table)
        if front_cost:
            console.print(pareto_table(items, front_cost))
        if winners:
            console.print(
                "winner: " + winner_serve_command(winners[0], cat),
                highlight=False,
                soft_wrap=True,
            )
        else:
            closest = closest_to_slos(items)
            console.print(
                f"nothing meets these SLOs; the closest is {closest.candidate.label()} "
                f"({'; '.join(closest.reasons)})",
                highlight=False,
                soft_wrap=True,
            )
    if plot_path is not None and not stopped:
        plot_frontiers(items, front_cost, plot_path, req)
