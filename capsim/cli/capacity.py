"""capsim capacity: the largest number of concurrent agents a deployment serves within
service-level objectives, the binding constraint, and what would serve more."""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict
from typing import Annotated

import typer
from rich.markup import escape

from capsim.cli.common import (
    KV_DTYPE_FLAGS,
    QUANT_FLAGS,
    AttentionBackendOption,
    AttentionRanksOption,
    CpuOffloadOption,
    DbOption,
    DpAttentionOption,
    EnforceEagerOption,
    EngineOption,
    ExpertParallelOption,
    FlashAttnOption,
    HicacheRatioOption,
    HicacheSizeOption,
    HierarchicalCacheOption,
    HostLinkOption,
    HostMemoryBandwidthOption,
    InputTokensOption,
    JsonOption,
    KvOffloadingOption,
    KvTransferBandwidthOption,
    MaxE2eP90Option,
    MaxModelLenOption,
    MaxNumSeqsOption,
    MaxTpotOption,
    MaxTtftP90Option,
    MinAgentTokSOption,
    NCpuMoeOption,
    OutputTokensOption,
    PpOption,
    PrefillReplicasOption,
    PrefillTpOption,
    ProfileOption,
    TpOption,
    catalog,
    console,
    dp_fields,
    exit_after_interrupt,
    finished_before_ctrl_c,
    fitted_table,
    flash_attention_choice,
    fmt_sig,
    hicache_fields,
    objectives_from_flags,
    predict_config,
    print_json,
    refuse_flags_of_other_engines,
    resolve_models,
)
from capsim.cli.predict import split_list
from capsim.errors import CapsimUserError


def _fmt(value: float, digits: int) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:,.{digits}f}"


def capacity_cmd(
    ctx: typer.Context,
    gpu: Annotated[str, typer.Option("--gpu", help="GPU name(s), comma-separated")],
    model: Annotated[str, typer.Option("--model", help="Model name(s) or Hugging Face id(s)")],
    min_agent_tok_s: MinAgentTokSOption = None,
    max_ttft_p90: MaxTtftP90Option = None,
    max_tpot: MaxTpotOption = None,
    max_e2e_p90: MaxE2eP90Option = None,
    quant: Annotated[str | None, typer.Option(*QUANT_FLAGS, help="Weight format")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs in total")] = None,
    tp: TpOption = 1,
    pp: PpOption = 1,
    kv_dtype: Annotated[str, typer.Option(*KV_DTYPE_FLAGS, help="auto or fp8")] = "auto",
    input_tokens: InputTokensOption = "1024",
    output_tokens: OutputTokensOption = "512",
    max_num_seqs: MaxNumSeqsOption = None,
    max_model_len: MaxModelLenOption = None,
    enforce_eager: EnforceEagerOption = False,
    attention_backend: AttentionBackendOption = None,
    flash_attn: FlashAttnOption = None,
    enable_expert_parallel: ExpertParallelOption = False,
    dp: AttentionRanksOption = None,
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
    engine: EngineOption = "vllm",
    profile: ProfileOption = "auto",
    pessimistic: Annotated[
        bool,
        typer.Option(
            "--pessimistic",
            help="Require each objective at the pessimistic edge of its figure's 80% band, "
            "not at the prediction",
        ),
    ] = False,
    json_out: JsonOption = False,
    db: DbOption = None,
) -> None:
    """How many concurrent agents can this box serve within the objectives? Searches the
    closed-loop concurrency (steady state: the start-up burst is left out) and names what
    stops it."""
    from capsim.planner.capacity import capacity

    objectives = objectives_from_flags(
        min_agent_tok_s=min_agent_tok_s,
        max_ttft_p90_s=max_ttft_p90,
        max_tpot_ms=max_tpot,
        max_e2e_p90_s=max_e2e_p90,
    )
    if tp < 1 or (gpus is not None and gpus < 1):
        raise CapsimUserError("--tp and --gpus must be at least 1")
    cat, refs = resolve_models(catalog(db), split_list(model, "--model"))
    refuse_flags_of_other_engines(ctx, cat.engine(engine).name)
    configs = []
    for g, ref in itertools.product(split_list(gpu, "--gpu"), refs):
        config = predict_config(
            gpu=g,
            model=ref.name,
            quant=quant or ref.quant,
            gpus=gpus,
            tp=tp,
            pp=pp,
            kv_dtype=kv_dtype,
            workload="closed",
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            attention_backend=attention_backend,
            flash_attention=flash_attention_choice(flash_attn),
            expert_parallel=enable_expert_parallel,
            **dp_fields(engine, enable_expert_parallel, enable_dp_attention, dp),
            cpu_moe_layers=n_cpu_moe,
            host_memory_bandwidth_gbs=host_memory_bandwidth,
            host_link_gbs=host_link_bandwidth,
            cpu_offload_gb=cpu_offload_gb,
            kv_offloading_gb=kv_offloading_size,
            **hicache_fields(enable_hierarchical_cache, hicache_ratio, hicache_size),
            prefill_replicas=prefill_replicas,
            prefill_tp=prefill_tp,
            kv_transfer_gbs=kv_transfer_bandwidth,
            engine=engine,
            profile=profile,
        )
        configs.append(config)
    answers, stopped = finished_before_ctrl_c(
        (capacity(c, objectives, cat, pessimistic=pessimistic) for c in configs),
        len(configs),
        "configurations answered",
        "the answers above cover those",
        bar_text="searching the concurrency" if len(configs) > 1 else None,
        shorter="fewer --gpu or --model values give an answer sooner",
    )
    with exit_after_interrupt(stopped):
        show_answers(answers, objectives, pessimistic, json_out)


def show_answers(answers, objectives, pessimistic: bool, json_out: bool) -> None:
    """Each configuration's capacity curve, answer and causes (or JSON)."""
    if json_out:
        print_json(
            {
                "objectives": objectives.model_dump(),
                "pessimistic": pessimistic,
                "answers": [asdict(a) for a in answers],
            }
        )
        return
    for a in answers:
        label = f"{a.model} {a.quant} on {a.gpus}x {a.gpu}"
        rows = [
            [
                str(p.concurrency),
                "yes" if p.ok else "no",
                _fmt(p.agent_tok_s, 1),
                _fmt(p.output_tok_s, 0),
                fmt_sig(p.ttft_p90_s),
                _fmt(p.tpot_ms, 1),
                _fmt(p.e2e_p90_s, 1),
                f"{100 * p.peak_kv_usage:.0f}%",
            ]
            for p in a.curve
        ]
        columns = [
            ("agents", "right", False),
            ("meets", "left", False),
            ("agent tok/s", "right", False),
            ("total tok/s", "right", True),
            ("TTFT p90 s", "right", False),
            ("TPOT ms", "right", True),
            ("E2E p90 s", "right", True),
            ("KV peak", "right", True),
        ]
        console.print(fitted_table(f"capsim capacity: {label}", columns, rows))
        if a.max_concurrency:
            console.print(
                f"[bold]{escape(label)} serves at most {a.max_concurrency} agents[/] within "
                "the objectives.",
                markup=True,
                highlight=False,
            )
        else:
            console.print(
                f"[bold]{escape(label)} cannot serve even one agent[/] within the objectives.",
                markup=True,
            )
        console.print(f"binding: {a.binding} (the engine is limited by {a.limiter})")
        if a.ttft_cause:
            console.print(f"first tokens are late because {a.ttft_cause}", highlight=False)
            for change in a.checked_changes:
                console.print(f"  checked in the simulator: {change}", highlight=False)
        for s in a.suggestions:
            console.print(f"  to serve more: {s}", highlight=False)
        for n in a.notes:
            console.print(f"note: {n}", highlight=False)
