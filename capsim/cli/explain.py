"""capsim fit and explain: whether a model fits a GPU's memory, and one decode step and one
prefill chunk broken down into the physics terms that make their time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from capsim.cli.common import (
    KV_DTYPE_FLAGS,
    QUANT_FLAGS,
    AsyncSchedulingOption,
    AttentionBackendOption,
    AttentionRanksOption,
    CpuOffloadOption,
    DbOption,
    DisableCustomAllReduceOption,
    DpAttentionOption,
    EnforceEagerOption,
    EngineOption,
    ExpertParallelOption,
    FlashAttnOption,
    GpuMemoryUtilizationOption,
    HostLinkOption,
    HostMemoryBandwidthOption,
    JsonOption,
    KvTransferBandwidthOption,
    MaxModelLenOption,
    MaxNumBatchedTokensOption,
    MaxNumSeqsOption,
    NCpuMoeOption,
    PowerLimitOption,
    PpOption,
    PrefillReplicasOption,
    PrefillTpOption,
    SetOption,
    SpecAcceptanceOption,
    SpecOption,
    TpOption,
    UbatchOption,
    attention_ranks,
    catalog,
    console,
    flash_attention_choice,
    fmt_num,
    fmt_sig,
    parse_overrides,
    print_json,
    refuse_flags_of_other_engines,
    refuse_links_without_tp,
    resolve_models,
    spec_config,
    vllm_ep_group,
    vllm_ep_ranks,
)
from capsim.engine.limits import MAX_GPUS
from capsim.engine.override_checks import (
    refuse_overrides_no_model_reads,
)
from capsim.errors import CapsimUserError

if TYPE_CHECKING:
    from capsim.catalog.gpu_schema import GPU
    from capsim.catalog.model_schema import Model
    from capsim.physics.roofline import StepBreakdown


# ----------------------------------------------------------------------------- fit


def fit_cmd(
    ctx: typer.Context,
    gpu: Annotated[str, typer.Option("--gpu", help="GPU name, e.g. rtx3090")],
    model: Annotated[str, typer.Option("--model", help="Model name, e.g. qwen3-coder-30b-a3b")],
    quant: Annotated[
        str | None,
        typer.Option(*QUANT_FLAGS, help="Weight format (default: the model's release)"),
    ] = None,
    gpus: Annotated[
        int | None, typer.Option("--gpus", help="GPUs in total (default: --tp)")
    ] = None,
    tp: TpOption = 1,
    pp: PpOption = 1,
    kv_dtype: Annotated[str, typer.Option(*KV_DTYPE_FLAGS, help="auto, bf16, fp16, fp8")] = "auto",
    gpu_memory_utilization: GpuMemoryUtilizationOption = None,
    max_model_len: MaxModelLenOption = None,
    max_num_seqs: MaxNumSeqsOption = None,
    max_num_batched_tokens: MaxNumBatchedTokensOption = None,
    context: Annotated[
        int | None,
        typer.Option("--context", help="Sequence length for 'sequences that fit' (tokens)"),
    ] = None,
    enforce_eager: EnforceEagerOption = False,
    mtp: Annotated[
        bool, typer.Option("--mtp", help="Load the MTP module (MTP speculation)")
    ] = False,
    spec: SpecOption = None,
    engine: EngineOption = "vllm",
    n_cpu_moe: NCpuMoeOption = 0,
    cpu_offload_gb: CpuOffloadOption = 0.0,
    host_memory_bandwidth: HostMemoryBandwidthOption = None,
    enable_expert_parallel: ExpertParallelOption = False,
    dp: AttentionRanksOption = None,
    enable_dp_attention: DpAttentionOption = False,
    json_out: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Does MODEL fit on GPU? Weights, activations, KV cache capacity per GPU."""
    from capsim.engine.setup import engine_fit_options, loadable_formats, refuse_unloadable
    from capsim.physics.drafter_memory import drafter_for
    from capsim.physics.memory import fit_hint, memory_fit, release_format, require_fit

    cat, (ref,) = resolve_models(catalog(db), [model])
    refuse_flags_of_other_engines(ctx, cat.engine(engine).name)
    g = cat.gpu(gpu)
    m = cat.model(ref.name)
    fmt = cat.quant(quant or ref.quant or m.dtype)
    if tp < 1:
        raise CapsimUserError(f"--tp must be at least 1, got {tp}")
    tp, dp_ranks = dp_layout(engine, m, tp, dp, enable_expert_parallel, enable_dp_attention)

    from capsim.engine.flag_checks import check_flags_as_predict
    from capsim.physics.pipeline import check_pipeline_link

    check_pipeline_link(g, pp)
    group = tp * pp  # one replica: pp stages of tp GPUs
    total_gpus = gpus if gpus is not None else group
    if total_gpus > MAX_GPUS:  # as predict and plan cap --gpus
        flag = "--gpus" if gpus is not None else "--tp"
        raise CapsimUserError(
            f"{flag} {total_gpus}: input should be less than or equal to {MAX_GPUS}"
        )
    if total_gpus < 1 or total_gpus % group:
        what = f"--tp {tp}" if pp == 1 else f"--tp {tp} x --pipeline-parallel-size {pp}"
        raise CapsimUserError(
            f"--gpus {total_gpus} is not a multiple of {what}",
            hint=f"GPUs are used as data-parallel replicas of {group} GPUs each",
        )
    replicas = total_gpus // group
    longest = m.max_position_embeddings
    if context is not None and not 1 <= context <= (longest or 10_000_000):
        raise CapsimUserError(
            f"--context {context:,} is not a sequence length {m.name} takes",
            hint=f"1 to {longest:,} tokens" if longest else "at least 1 token",
        )
    if context is not None and max_model_len is not None and context > max_model_len:
        raise CapsimUserError(  # '0 sequences fit' said it in other words
            f"--context {context:,} is longer than --max-model-len {max_model_len:,}: the "
            "server refuses such a sequence",
            hint=f"--context up to {max_model_len:,}, or a larger --max-model-len",
        )
    # the drafter's weights and KV layers share the memory (--mtp: the MTP module alone)
    spec_cfg = spec_config(spec, None)
    mtp_flag = "--mtp"
    if spec_cfg is not None and spec_cfg.method == "mtp":
        mtp, mtp_flag = True, "--spec with method mtp"
    elif mtp:
        if spec_cfg is not None:
            raise CapsimUserError(
                f"--mtp loads the MTP module; --spec asks for {spec_cfg.method} instead",
                hint="give one of them",
            )
        spec_cfg = spec_config('{"method": "mtp", "num_speculative_tokens": 1}', None)
    if mtp and not m.mtp_layers:
        raise CapsimUserError(
            f"{m.name} has no MTP layers, so {mtp_flag} loads nothing",
            hint="leave it out (speculate with eagle, a draft model or ngram)",
        )
    if enable_expert_parallel:
        # whole experts a GPU take the bytes a slice of each did: the fit is the same, the
        # combinations the engines refuse are refused here too
        from capsim.physics.deployment import Deployment
        from capsim.physics.memory import check_expert_parallel

        check_expert_parallel(m, Deployment(tp=tp, expert_parallel=True, cpu_moe_layers=n_cpu_moe))
    options = dict(
        kv_dtype=kv_dtype,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        context_tokens=context,
        enforce_eager=enforce_eager,
        drafter=drafter_for(cat, spec_cfg, quant or ref.quant, m),
        cpu_moe_layers=n_cpu_moe,
        dp_attention=dp_ranks,
        pp=pp,
        cpu_offload_gb=cpu_offload_gb,
    )
    eng = cat.engine(engine).for_model_len(
        max_model_len or m.max_position_embeddings, mla=m.mla is not None
    )
    check_flags_as_predict(
        eng,
        g,
        tp=tp,
        pp=pp,
        cpu_moe_layers=n_cpu_moe,
        cpu_offload_gb=cpu_offload_gb,
        # fit reads --host-memory-bandwidth alone too: the user's host for the offload
        # configurations it proposes
        expert_parallel=enable_expert_parallel,
        dp_attention=dp_ranks,
        enforce_eager=enforce_eager,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_dtype=kv_dtype,
    )
    formats = loadable_formats(cat, eng)
    if not (quant or ref.quant):  # the release format as the engine loads it (GGUF)
        fmt = release_format(formats, m.dtype) or fmt
    refuse_unloadable(eng, fmt, cat.engines)
    loadable = list(formats.values())
    fit_options = engine_fit_options(eng, g, expert_parallel=enable_expert_parallel, **options)
    result = memory_fit(g, m, fmt, tp=tp, **fit_options)
    from capsim.physics.offload_terms import offload_past_weights

    past_weights = offload_past_weights(cpu_offload_gb, result)
    if past_weights:
        from capsim.notices import notice

        notice(past_weights)
    offload = None
    # experts in system RAM where the format asked for does not fit, or (no --quant) where
    # no format fits the GPU alone: a smaller format is the better answer when one does
    if not result.fits and m.moe and not n_cpu_moe:
        from capsim.physics.memory import formats_that_fit
        from capsim.planner.offload import propose_offload

        chosen = quant is not None or ref.quant is not None
        if chosen or not formats_that_fit(g, m, loadable, tp, **fit_options):
            offload = propose_offload(
                cat, g, m, fmt, tp, options, host_memory_bandwidth, chosen=chosen
            )
    if host_memory_bandwidth is not None and offload is None and not n_cpu_moe:
        from capsim.notices import notice

        # it prices experts kept in system RAM, and no offload is proposed here
        notice(
            f"--host-memory-bandwidth {host_memory_bandwidth:g} is not used: "
            f"{m.name} ({fmt.name}) {'fits' if result.fits else 'has no offload to propose'} "
            f"on {tp} x {g.name} without experts in system RAM"
        )
    if json_out:
        print_json(
            {
                **result.to_dict(),
                "gpus": total_gpus,
                "dp_replicas": replicas,
                "expert_parallel": enable_expert_parallel,
                "offload_proposal": offload.to_dict() if offload else None,
            }
        )
    else:
        print_fit(result, g, m, replicas, enable_expert_parallel)
    if result.fits:
        return
    hint = fit_hint(result, g, m, fmt, loadable, tp, **fit_options)
    if offload is None:
        require_fit(result, hint)
    elif not json_out:
        from capsim.cli.offload_output import print_offload

        print_offload(offload, result, g, m, hint)


def dp_layout(
    engine: str, m: Model, tp: int, dp: int | None, expert_parallel: bool, dp_attention: bool
) -> tuple[int, int]:
    """(TP group, attention ranks) of fit's and explain's flags: vLLM's --dp N with
    --enable-expert-parallel on an MoE model is one expert-parallel group of tp x N GPUs
    with attention in N ranks (as predict simulates it); SGLang's --enable-dp-attention
    keeps the TP group and splits its attention into --dp ranks."""
    ranks = vllm_ep_ranks(engine, expert_parallel, dp_attention, dp) if m.moe else None
    if ranks is not None and ranks > 1:
        return vllm_ep_group(tp, ranks), ranks
    return tp, attention_ranks(dp_attention, dp, replicas=False, vllm_ep=ranks is not None)


def print_fit(r, g: GPU, m: Model, replicas: int, expert_parallel: bool = False) -> None:
    from capsim.physics.memory import GB, GIB

    table = Table(
        title=f"{m.name} ({r.quant}) on {r.tp * r.pp}x {g.name}"
        + (f" (TP{r.tp} x PP{r.pp}, the busiest stage's figures)" if r.pp > 1 else "")
        + (f", {replicas} replicas" if replicas > 1 else "")
        + (", expert parallel" if expert_parallel else "")
        + (f", data-parallel attention x{r.dp_attention}" if r.dp_attention > 1 else "")
        + f": {'FITS' if r.fits else 'DOES NOT FIT'}",
        show_header=False,
    )
    table.add_column("term", overflow="fold")
    table.add_column("per GPU", justify="right", overflow="fold")
    table.add_row("GPU memory", f"{r.memory_bytes / GIB:.2f} GiB")
    table.add_row(f"usable (x {r.gpu_memory_utilization:g})", f"{r.budget_bytes / GIB:.2f} GiB")
    table.add_row("weights", f"{r.weight_bytes / GIB:.2f} GiB ({r.weight_bytes / GB:.2f} GB)")
    drafter = r.weight_breakdown.get("drafter", 0.0)
    if drafter:
        table.add_row("  of which the speculative drafter's", f"{drafter / GIB:.2f} GiB")
    if r.weights_in_system_ram_bytes:
        table.add_row(
            "weights in system RAM (--cpu-offload-gb, read over the host link each pass)",
            f"{r.weights_in_system_ram_bytes / GIB:.2f} GiB",
        )
    table.add_row("activation peak", f"{r.activation_bytes / GIB:.2f} GiB")
    table.add_row(
        "runtime reserve (context, NCCL, graphs)", f"{r.runtime_reserve_bytes / GIB:.2f} GiB"
    )
    table.add_row("KV cache budget", f"{r.kv_budget_bytes / GIB:.2f} GiB")
    if r.kv_budget_bytes <= 0:
        console.print(table)
        return
    table.add_row("KV bytes per token", f"{r.kv_bytes_per_token:,.0f}")
    if r.kv_per_layer_type.get("drafter"):
        table.add_row("  of which the drafter's layers", f"{r.kv_per_layer_type['drafter']:,.0f}")
    if r.state_bytes_per_sequence:
        table.add_row(
            "linear-attention state per sequence", f"{r.state_bytes_per_sequence / 2**20:.1f} MiB"
        )
        if r.state_sequence_cap is not None:
            table.add_row(
                "state pool (the engine's own)",
                f"{r.state_pool_bytes / GIB:.2f} GiB: at most {r.state_sequence_cap:,} "
                "running requests",
            )
    if r.window_bytes_per_sequence:
        table.add_row(
            "sliding-window pages per sequence",
            f"{r.window_bytes_per_sequence / 2**20:.1f} MiB (the engine keeps the window only)",
        )
    if r.state_blocks_per_sequence and r.state_sequence_cap is None:
        held = [r.state_bytes_per_sequence and "state", r.window_bytes_per_sequence and "window"]
        table.add_row(
            f"{' and '.join(h for h in held if h)} pages in the KV pool",
            f"{r.state_blocks_per_sequence:,} blocks per running sequence",
        )
    if r.sliding_window:
        table.add_row("sliding-window layers hold at most", f"{r.sliding_window} tokens")
    if r.sliding_pool_ratio is not None:
        table.add_row(
            "sliding-window layers: a pool apart",
            f"{r.sliding_pool_ratio:g} x the full pool's tokens (SGLang's hybrid SWA "
            "memory; every layer allocated)",
        )
    ranks = (
        f" ({r.dp_attention} attention ranks of {r.tp // r.dp_attention} GPU(s), each with a "
        "pool of its own)"
        if r.dp_attention > 1
        else ""
    )
    table.add_row("KV capacity", f"{r.kv_capacity_tokens:,} tokens{ranks}")
    table.add_row("max_model_len", f"{r.max_model_len:,} (limit {r.max_model_len_limit:,})")
    table.add_row(
        f"sequences of {r.context_tokens:,} tokens that fit",
        f"{r.max_sequences:,} (max_num_seqs {r.max_num_seqs})",
    )
    console.print(table)


# ----------------------------------------------------------------------------- explain


def launch_text(sm, tokens: float) -> str:
    """How a step of ``tokens`` launches what no CUDA graph holds: the MLA attention ops
    piecewise graphs leave out (mla_attention_eager_us a layer) where the graphs hold the
    step, else every layer (eager or compiled, us a layer) and the all-reduces."""
    mla_us = sm.params.mla_attention_eager_us if sm.mla_attention_outside_us else 0.0
    if tokens <= sm.graph_max_tokens:
        return f"MLA attention outside the CUDA graphs, {mla_us:g} us x {sm.layers} layers"
    per_layer_us, kind = sm.dispatch_layer
    text = f"{kind}, {per_layer_us:g} us x {sm.layers} layers + all-reduces"
    if mla_us and kind != "eager":
        text += f" + MLA attention {mla_us:g} us x {sm.layers}"
    return text


def tiles_text(sm, step: StepBreakdown) -> str:
    """How a step's block-FP8 dense GEMMs fill the GPU (physics/gemm_tiles.py): their
    thread blocks against its multiprocessors, '' where the term does not apply."""
    report = sm.block_fp8_gemm_report(step.graph_tokens)
    if not report:
        return ""
    blocks = [b for _name, b, _sms, _share in report]
    return (
        f"{len(report)} GEMMs of {min(blocks)}-{max(blocks)} thread blocks on "
        f"{report[0][2]} multiprocessors, {sm.params.block_fp8_gemm_tile_columns:g}-column tiles"
    )


def step_rows(
    step: StepBreakdown,
    tokens_out: float,
    ridge: float | None,
    int8_gemm_flops_per_s: float | None = None,
    mla_floor: tuple[float, int] | None = None,
    launch: tuple[float, int, str] | None = None,
    pipeline_handoffs: bool = False,
    block_fp8_tiles: str = "",
) -> list[tuple[str, str]]:
    """The rows of one step's table. ``mla_floor``: (us a layer, layers) of what MLA
    layers pay beyond a GQA layer's floor (mla_layer_floor_share of the layer floor, and
    the early kernel stacks' mla_layer_overhead_us), shown as part of the overhead;
    ``launch``: how a step's launches outside CUDA graphs are made up (launch_text),
    shown beside them."""
    from capsim.physics.memory import GB

    ms = 1e3
    rows = [
        ("sequences / tokens", f"{step.sequences} / {step.tokens:,}"),
        ("weights read (dense part)", f"{step.weight_bytes / GB:.3f} GB"),
    ]
    if step.graph_tokens != step.tokens:
        rows.insert(1, ("CUDA graph (tokens, padded)", f"{step.graph_tokens:,}"))
    if step.experts_touched_per_layer:
        rows.append(
            (
                "routed experts read",
                f"{step.expert_bytes / GB:.3f} GB ({step.experts_touched_per_layer:.1f} "
                "experts/layer)",
            )
        )
    if step.ep_busiest_experts:
        rows.append(
            (
                "expert parallel, busiest GPU",
                f"{step.ep_busiest_experts:.2f} experts/layer, "
                f"{step.ep_pair_load:.2f}x the mean pairs",
            )
        )
    rows += [
        ("KV read / written", f"{step.kv_read_bytes / GB:.4f} / {step.kv_write_bytes / GB:.4f} GB"),
    ]
    if step.state_bytes:
        rows.append(
            (
                "linear-attention state traffic",
                f"{step.state_bytes / GB:.4f} GB, {step.t_state * 1e3:.3f} ms at "
                f"{fmt_sig(step.state_bytes_per_s / 1e9)} GB/s",
            )
        )
    rows.append(("sampler logits traffic (float32)", f"{step.sampler_bytes / GB:.4f} GB"))
    rows.append(
        (
            "elementwise kernels (norms, activation)",
            f"{step.activation_bytes / GB:.4f} GB, {step.t_elementwise * 1e3:.3f} ms",
        )
    )
    if step.score_bytes:
        rows.append(
            (
                "attention scores in memory (no flash attention)",
                f"{step.score_bytes / GB:.4f} GB, {step.t_scores * 1e3:.3f} ms",
            )
        )
    rows += [
        (
            "FLOPs (linear + attention)",
            f"{step.linear_flops / 1e12:.3f} + {step.attention_flops / 1e12:.3f} TFLOP",
        ),
        (
            "dense weights: memory | compute",
            f"{step.t_dense_memory * ms:.3f} | {step.t_dense_compute * ms:.3f} ms",
        ),
        *(
            [
                (
                    "of it: block-FP8 GEMMs' idle multiprocessors",
                    f"{step.t_block_fp8_tiles * ms:.3f} ms ({block_fp8_tiles})",
                )
            ]
            if step.t_block_fp8_tiles
            else []
        ),
        *(
            [
                (
                    "dense GEMMs on int8 tensor cores (MMQ)",
                    f"{fmt_sig(int8_gemm_flops_per_s / 1e12)} TFLOPS",
                )
            ]
            if int8_gemm_flops_per_s
            else []
        ),
        (
            "routed experts: memory | compute",
            f"{step.t_expert_memory * ms:.3f} | {step.t_expert_compute * ms:.3f} ms",
        ),
        *(
            [
                (
                    "routed experts' grouped GEMMs",
                    f"{fmt_sig(step.expert_gemm_flops_per_s / 1e12)} TFLOPS",
                )
            ]
            if step.experts_touched_per_layer
            else []
        ),
        (
            "attention: memory | compute",
            f"{step.t_attention_memory * ms:.3f} | {step.t_attention_compute * ms:.3f} ms",
        ),
        *(
            [
                (
                    "Gated DeltaNet chunked prefill kernels",
                    f"{fmt_sig(step.gdn_prefill_flops_per_s / 1e12)} TFLOPS"
                    + (
                        f" + {fmt_sig(step.gdn_prefill_token_seconds * 1e9)} ns/token/layer"
                        if step.gdn_prefill_token_seconds
                        else ""
                    ),
                )
            ]
            if step.gdn_chunked_tokens
            else []
        ),
        (
            "communication (all-reduce"
            + (", pipeline hand-offs" if pipeline_handoffs else "")
            + ")",
            f"{step.t_communication * ms:.3f} ms"
            + (f" ({step.allreduce_algorithm})" if step.allreduce_algorithm else ""),
        ),
        ("overhead (step, sequences, layers)", f"{step.t_overhead * ms:.3f} ms"),
    ]
    if mla_floor:
        per_layer_us, layers = mla_floor
        rows.append(
            (
                "of it: MLA blocks' extra kernels",
                f"{per_layer_us * layers / 1e3:.3f} ms ({per_layer_us:g} us x {layers} layers)",
            )
        )
    if step.t_offload:
        how = {
            "cpu": "the CPU reads them from system RAM",
            "copy": "copied to the GPU over the host link",
        }[step.offload_path]
        rows.append((f"experts in system RAM ({how})", f"{step.t_offload * ms:.3f} ms"))
    if step.t_host_hidden > 0:
        rows.append(
            (
                "host work hidden by async scheduling",
                f"{step.t_host_hidden * ms:.3f} of {step.t_host * ms:.3f} ms",
            )
        )
    if step.t_dispatch:
        how = f" ({launch})" if launch else ""
        rows.append(
            ("eager launches (CPU, overlap the GPU)", f"{step.t_dispatch * ms:.3f} ms{how}")
        )
    if step.t_draft:
        rows.append(("speculative drafter", f"{step.t_draft * ms:.3f} ms"))
    rows += [
        ("step time", f"{step.t_total * ms:.3f} ms"),
        ("bound by", step.bound),
        ("tokens per second", f"{tokens_out / step.t_total:,.1f}"),
        (
            "roofline: FLOP/byte (ridge)",
            f"{step.arithmetic_intensity:,.1f} ({fmt_num(ridge, 0)})",
        ),
    ]
    return rows


def explain_cmd(
    ctx: typer.Context,
    gpu: Annotated[str, typer.Option("--gpu", help="GPU name")],
    model: Annotated[str, typer.Option("--model", help="Model name")],
    quant: Annotated[str | None, typer.Option(*QUANT_FLAGS, help="Weight format")] = None,
    tp: TpOption = 1,
    pp: PpOption = 1,
    kv_dtype: Annotated[
        str, typer.Option(*KV_DTYPE_FLAGS, help="KV-cache dtype: auto, bf16, fp16, fp8")
    ] = "auto",
    batch: Annotated[
        int,
        typer.Option("--batch", min=1, max=1_000_000, help="Sequences in the decode step"),
    ] = 1,
    context: Annotated[int, typer.Option("--context", help="Tokens in each sequence's KV")] = 2048,
    prefill_chunk: Annotated[
        int | None,
        typer.Option("--prefill-chunk", min=1, help="Tokens of the prefill chunk"),
    ] = None,
    prefill_context: Annotated[
        int,
        typer.Option(
            "--prefill-context",
            min=0,
            help="Tokens already in KV before the prefill chunk (a later chunk of a long "
            "prompt; llama-bench's -d depth)",
        ),
    ] = 0,
    spec: SpecOption = None,
    spec_acceptance: SpecAcceptanceOption = None,
    power_limit: PowerLimitOption = None,
    interconnect: Annotated[
        str, typer.Option("--interconnect", help="GPU links: auto, pcie or nvlink")
    ] = "auto",
    enforce_eager: EnforceEagerOption = False,
    attention_backend: AttentionBackendOption = None,
    flash_attn: FlashAttnOption = None,
    async_scheduling: AsyncSchedulingOption = None,
    disable_custom_all_reduce: DisableCustomAllReduceOption = False,
    engine: EngineOption = "vllm",
    ubatch_size: UbatchOption = None,
    enable_expert_parallel: ExpertParallelOption = False,
    dp: AttentionRanksOption = None,
    enable_dp_attention: DpAttentionOption = False,
    n_cpu_moe: NCpuMoeOption = 0,
    host_memory_bandwidth: HostMemoryBandwidthOption = None,
    host_link_bandwidth: HostLinkOption = None,
    prefill_replicas: PrefillReplicasOption = 0,
    prefill_tp: PrefillTpOption = None,
    kv_transfer_bandwidth: KvTransferBandwidthOption = None,
    profile: Annotated[
        str,
        typer.Option(
            "--profile", help="Calibration profile: auto (as predict), none, NAME or PATH"
        ),
    ] = "auto",
    set_values: SetOption = None,
    json_out: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Break one decode step and one prefill chunk down: bytes, FLOPs, times, what bounds it."""
    import numpy as np

    from capsim.engine.setup import (
        engine_deployment,
        engine_fit_options,
        resolve_format,
        resolve_params,
    )
    from capsim.physics.drafter_memory import drafter_for
    from capsim.physics.step import build_step_model

    if batch < 1 or context < 0:
        raise CapsimUserError("--batch must be at least 1 and --context at least 0")
    refuse_links_without_tp([tp], interconnect, disable_custom_all_reduce, engine)
    cat = catalog(db)
    spec_cfg = spec_config(spec, spec_acceptance)
    overrides = parse_overrides(set_values)
    g = cat.gpu(gpu)
    eng = cat.engine(engine)
    refuse_flags_of_other_engines(ctx, eng.name)
    cat, (ref,) = resolve_models(cat, [model])
    m = cat.model(ref.name)
    refuse_overrides_no_model_reads(overrides, [m])
    quant = quant or ref.quant
    tp, dp_ranks = dp_layout(engine, m, tp, dp, enable_expert_parallel, enable_dp_attention)

    if prefill_replicas and prefill_tp:
        from capsim.physics.memory import check_tensor_parallel

        try:
            check_tensor_parallel(m, prefill_tp)
        except CapsimUserError as err:
            raise CapsimUserError(
                f"the prefill instances (TP {prefill_tp}): {err.message}", hint=err.hint
            ) from None
    from capsim.engine.flag_checks import check_flags_as_predict

    flash_attention = flash_attention_choice(flash_attn)
    check_flags_as_predict(
        eng,
        g,
        tp=tp,
        pp=pp,
        cpu_moe_layers=n_cpu_moe,
        host_memory_bandwidth_gbs=host_memory_bandwidth,
        host_link_gbs=host_link_bandwidth,
        expert_parallel=enable_expert_parallel,
        dp_attention=dp_ranks,
        enforce_eager=enforce_eager,
        prefill_replicas=prefill_replicas,
        prefill_tp=prefill_tp,
        kv_transfer_gbs=kv_transfer_bandwidth,
        ubatch_tokens=ubatch_size,
        async_scheduling=async_scheduling,
        custom_allreduce=False if disable_custom_all_reduce else None,
        kv_dtype=kv_dtype,
        flash_attention=flash_attention,
    )
    longest = m.max_position_embeddings
    if longest and context >= longest:
        raise CapsimUserError(
            f"--context {context:,} leaves no room for a new token in {m.name}'s "
            f"{longest:,}-token context",
            hint=f"--context is 0 to {longest - 1:,}",
        )
    # the format predict would run: the release format if it fits, else the first that does
    # the fit also counts how many sequences of the decode step's length the cache holds
    width = 1 if spec_cfg is None else spec_cfg.verify_width
    fit_options = engine_fit_options(
        eng,
        g,
        async_scheduling=async_scheduling,
        kv_dtype=kv_dtype,
        enforce_eager=enforce_eager,
        drafter=drafter_for(cat, spec_cfg, quant, m),
        context_tokens=context + width,
        cpu_moe_layers=n_cpu_moe,
        dp_attention=dp_ranks,
        expert_parallel=enable_expert_parallel,
        pp=pp,
    )
    fmt, quant_reason, fit = resolve_format(cat, g, m, quant, tp, eng, **fit_options)
    fit_note = None if fit.fits else f"does not fit on {tp}x {g.name}: {fit.reason}"
    dep = engine_deployment(
        eng,
        g,
        tp=tp,
        quant=fmt.name,
        kv_dtype=kv_dtype,
        power_limit_w=power_limit,
        interconnect=interconnect,
        enforce_eager=enforce_eager,
        spec=spec_cfg,
        async_scheduling=async_scheduling,
        custom_allreduce=False if disable_custom_all_reduce else None,
        ubatch_tokens=ubatch_size,
        cpu_moe_layers=n_cpu_moe,
        host_memory_bandwidth_gbs=host_memory_bandwidth,
        host_link_gbs=host_link_bandwidth,
        expert_parallel=enable_expert_parallel,
        dp_attention=fit.dp_attention,
        pp=pp,
        attention_backend=attention_backend,
        flash_attention=flash_attention,
    )
    from capsim.calibration.profiles import find_profile
    from capsim.physics.deployment import tensor_throttle_ratio

    fitted = find_profile(profile, g.hardware_class, eng.name)
    params = resolve_params(cat, g, overrides, engine=eng, profile=fitted)
    sm = build_step_model(cat, g, m, dep, params)
    decode, per_seq = sm.decode_step(np.full(batch, context))
    chunk = prefill_chunk or max(min(context, 8192), 1)
    kv_note = batch_kv_note(fit, batch, f"{tp}x {g.name}")
    if longest and chunk > longest:
        raise CapsimUserError(
            f"--prefill-chunk {chunk:,} is longer than {m.name}'s {longest:,}-token context",
            hint=f"--prefill-chunk is 1 to {longest:,}",
        )
    if longest and prefill_context + chunk > longest:
        raise CapsimUserError(
            f"--prefill-context {prefill_context:,} plus a {chunk:,}-token chunk exceeds "
            f"{m.name}'s {longest:,}-token context",
            hint=f"--prefill-context is 0 to {max(longest - chunk, 0):,} with this chunk",
        )
    prefill = sm.step(np.array([chunk]), np.array([prefill_context]))
    transfer = explained_kv_transfer(
        g, eng, fit, tp, sm.params, prefill_replicas, prefill_tp, kv_transfer_bandwidth, pp
    )
    peak = getattr(g.tensor_tflops, sm.compute_dtype)
    ridge = peak * 1e12 / (g.memory_bandwidth_gb_s * 1e9) if peak else None
    if json_out:
        print_json(
            {
                "gpu": g.name,
                "model": sm.model.name,
                "quant": sm.fmt.name,
                "quant_reason": quant_reason,
                "fits": fit.fits,
                "fit_note": fit_note,
                "kv_note": kv_note,
                "deployment": dep.model_dump(mode="json"),
                "compute_dtype": sm.compute_dtype,
                "native_format": sm.native,
                "profile": fitted.name if fitted else None,
                "efficiency": sm.params.model_dump(exclude={"groups"}),
                "ridge_flop_per_byte": ridge,
                "decode": {
                    **decode.to_dict(),
                    "tokens_per_sequence": per_seq,
                    "output_tok_s": batch * per_seq / decode.t_total,
                },
                "prefill": {
                    **prefill.to_dict(),
                    "context_tokens": prefill_context,
                    "prefill_tok_s": chunk / prefill.t_total,
                },
                "frontend_s_per_request": sm.frontend_seconds(chunk),
                "api_server_serial_s_per_request": sm.api_server_seconds(chunk),
                "api_server_round_s_at_batch": sm.stream_round_seconds(batch),
                "admission_lag_s_at_batch": decode.t_total if sm.admits_a_step_late else 0.0,
                "kv_transfer": kv_transfer_dict(transfer, prefill_context + chunk),
                "tensor_throttle_ratio": tensor_throttle_ratio(g, cat),
                "mla_decode_padding": sm.mla_decode_padding,
                "fp16_accumulate_speedup": sm.fp16_accumulate_speedup,
                "attention_backend": {
                    "name": sm.deployment.attention_backend,
                    "triton": sm.deployment.triton_attention,
                    "kv_read_share": (
                        sm.params.triton_attention_kv_share
                        if sm.deployment.triton_attention
                        else 1.0
                    ),
                    "extra_us_per_step": sm.triton_attention_floor_us,
                },
            }
        )
        return
    title = f"{sm.model.name} ({sm.fmt.name}) on {tp}x {g.name}"
    if pp > 1:
        title += f" x PP{pp} (a step passes every stage)"
    title += f", profile {fitted.name}" if fitted else ", uncalibrated"
    note = "" if sm.native else f"; {sm.fmt.name} runs weight-only ({sm.compute_dtype} compute)"
    if sm.deployment.weight_only and sm.native and sm.fmt.weight_only:
        # the GPU has the format's tensor cores; the engine's kernel takes 16-bit inputs
        note = f"; {sm.fmt.name} runs weight-only ({sm.compute_dtype} compute, the engine's kernel)"
    mla_floor = (sm.mla_layer_floor_us, sm.layers) if sm.mla_layer_floor_us else None
    for label, step, out in (
        (f"decode step: {batch} x 1 token at context {context:,}", decode, batch * per_seq),
        (
            f"prefill chunk: {chunk:,} tokens"
            + (f" after {prefill_context:,} in KV" if prefill_context else ""),
            prefill,
            chunk,
        ),
    ):
        table = Table(title=f"{title}: {label}{note}", show_header=False)
        table.add_column("term", overflow="fold")
        table.add_column("value", justify="right", overflow="fold")
        launch = launch_text(sm, step.tokens)
        rows = step_rows(
            step, out, ridge, sm.int8_gemm_rate, mla_floor, launch, pp > 1, tiles_text(sm, step)
        )
        for row in rows:
            table.add_row(*row)
        if dep.dp_attention > 1:
            table.add_row(*dp_attention_row(sm))
        console.print(table)
    frontend = sm.frontend_seconds(chunk)
    serial = sm.api_server_seconds(chunk)
    console.print(
        f"front end (API server, tokenizer, streaming): {frontend * 1e3:.1f} ms per request of "
        f"{chunk:,} prompt tokens, added to TTFT and end-to-end latency"
        + (
            f"; {serial * 1e3:.1f} ms of it serial in the API server (requests arriving "
            "together queue for it)"
            if serial > 0
            else ""
        ),
        highlight=False,
    )
    if transfer is not None:
        console.print(kv_transfer_line(transfer, prefill_context + chunk), highlight=False)
    round_s = sm.stream_round_seconds(batch)
    if round_s:
        console.print(
            f"the API server spends {sm.params.api_server_us_per_stream_chunk:g} us on each "
            f"streamed chunk: with {batch:,} requests streaming, a client sees its last token "
            f"and its next request reaches the engine a round of {round_s * 1e3:.1f} ms later",
            highlight=False,
        )
    if sm.admits_a_step_late:
        console.print(
            "async scheduling: each step is scheduled when the one before it is launched, so "
            "a request that reaches a busy engine waits out the running step and one more "
            f"before its prefill: {decode.t_total * 1e3:.1f} ms more (a decode step of "
            f"{batch:,}) than without async scheduling",
            highlight=False,
        )
    lines = (
        throttle_line(g, cat),
        attention_backend_line(sm, attention_backend),
        flash_attention_line(sm, flash_attention),
        mla_tile_line(sm),
        fp16_accumulate_line(sm),
        host_read_line(sm),
    )
    for line in lines:
        if line:
            console.print(line, highlight=False)
    if quant in (None, "auto"):
        console.print(f"weight format {quant_reason}", highlight=False)
    for warning in (fit_note, kv_note):
        if warning:
            console.print(
                f"[bold yellow]warning:[/] {escape(warning)}", markup=True, highlight=False
            )


def mla_tile_line(sm) -> str | None:
    """The MLA decode kernel's row tile in words, where it pads (physics/work_counts.py)."""
    if sm.mla_decode_padding == 1.0:
        return None
    dep = sm.deployment
    heads = sm.model.num_attention_heads / dep.attention_tp
    rows = heads * sm.decode_width
    return (
        f"MLA decode tile: {rows:g} query rows a sequence ({heads:g} heads a GPU x "
        f"{sm.decode_width} token{'s' if sm.decode_width > 1 else ''}) fill tiles of "
        f"{sm.params.mla_decode_row_tile} rows, so decode attention runs "
        f"{sm.mla_decode_padding:g}x the FLOPs it counts (prefill keeps its own)"
    )


def attention_backend_line(sm, asked: str | None) -> str | None:
    """The attention backend in words where it is named (asked for, or the engine's own
    choice for the model), with what a Triton backend costs beyond the default kernels."""
    dep = sm.deployment
    if dep.attention_backend is None:
        return None
    how = "asked for" if asked else f"{dep.engine}'s choice for {sm.model.name} on {sm.gpu.name}"
    p = sm.params
    if not dep.triton_attention or (
        p.triton_attention_kv_share == 1.0 and p.triton_attention_layer_us == 0.0
    ):
        return f"attention backend: {dep.attention_backend} ({how}), costed as the default kernels"
    return (
        f"attention backend: {dep.attention_backend} ({how}): Triton kernels read the KV "
        f"cache at {p.triton_attention_kv_share:.2f} of the default kernels' rate and add "
        f"{p.triton_attention_layer_us:g} us for each attention layer, "
        f"{sm.triton_attention_floor_us / 1e3:.2f} ms a step"
    )


def flash_attention_line(sm, asked: bool | None) -> str | None:
    """llama.cpp without flash attention in words (physics/score_terms.py): why (``asked``:
    --flash-attn as parsed, None for auto or not given), and what each score costs."""
    if not sm.scores_materialized:
        return None
    dep = sm.deployment
    why = "--flash-attn off" if asked is False else f"{dep.engine}'s default before b6327"
    l2 = f"the {sm.gpu.l2_cache_mb:g} MB L2" if sm.gpu.l2_cache_mb else "the L2"
    return (
        f"flash attention off ({why}): every attention score goes through memory "
        f"({sm.params.attention_score_bytes:g} B each, where a layer's scores outgrow {l2}), "
        "and each query is scored against every cached token, masked rather than skipped"
    )


def host_read_line(sm) -> str | None:
    """Experts in system RAM read by the CPU (physics/offload_terms.py): the bandwidth its
    matrix-vector products stream at, of the read bandwidth given."""
    if not sm.cpu_moe_layers:
        return None
    from capsim.physics.offload_terms import OP_OFFLOAD_MIN_BATCH as FROM

    given = sm.deployment.host_memory_bandwidth_gbs
    return (
        f"experts of {sm.cpu_moe_layers} layers in system RAM: below {FROM} tokens a pass the CPU "
        f"multiplies them, streaming {sm.host_memory_bw / 1e9:.1f} GB/s "
        f"(host_read_efficiency {sm.params.host_read_efficiency:g} of the {given:g} GB/s "
        "read bandwidth given; llama.cpp's CPU decode measured 84-91% of read bandwidth); "
        f"from {FROM} they are copied to the GPU over the host link at "
        f"{sm.host_link_bw / 1e9:.1f} "
        "GB/s"
    )


def fp16_accumulate_line(sm) -> str | None:
    """The FP16-accumulate term in words, where it applies (fp16_accumulate_speedup)."""
    speedup = sm.fp16_accumulate_speedup
    if speedup == 1.0:
        return None
    peak = getattr(sm.gpu.tensor_tflops, sm.compute_dtype)  # the peak the GEMM rate scales
    return (
        f"FP16 GEMMs accumulate in FP16 ({sm.deployment.engine}'s cuBLAS path): {sm.gpu.name} runs "
        f"them at {speedup:g}x its {peak:g} dense 16-bit (FP32-accumulate) TFLOPS "
        f"(fp16_accumulate_speedup)"
    )


def throttle_line(gpu, catalog) -> str | None:
    """The tensor-rate throttle term in words, where it changes anything
    (physics/tensor_throttle.py): the two balances, the ratio and the class's compute
    efficiencies before and after."""
    from capsim.physics.deployment import tensor_throttle_ratio
    from capsim.physics.efficiency import EfficiencyParams
    from capsim.physics.tensor_throttle import rescaled_efficiency

    ratio = tensor_throttle_ratio(gpu, catalog)
    if ratio is None or ratio == 1.0:
        return None
    cls = catalog.efficiency.entries[gpu.hardware_class]
    ref = catalog.gpu(cls.reference_gpu)
    base = EfficiencyParams().with_overrides(cls.params)
    shown = ", ".join(
        f"{label} {value:.2f} -> {rescaled_efficiency(value, ratio):.2f}"
        for name, label in (
            ("attention_compute_efficiency", "attention"),
            ("prefill_compute_efficiency", "prefill GEMMs"),
            ("moe_compute_efficiency", "grouped experts"),
        )
        if (value := getattr(base, name)) is not None
    )
    peak = gpu.tensor_tflops.bf16 or gpu.tensor_tflops.fp16
    ref_peak = ref.tensor_tflops.bf16 or ref.tensor_tflops.fp16
    return (
        f"tensor-rate throttle: {gpu.name} has {peak:g} dense 16-bit tensor TFLOPS beside "
        f"{gpu.vector_fp32_tflops:g} FP32 TFLOPS, its class reference {ref.name} {ref_peak:g} "
        f"beside {ref.vector_fp32_tflops:g}; ratio k = {ratio:.3f}, so compute-bound kernels "
        f"spend less of their time outside the tensor math and the class's compute "
        f"efficiencies are rescaled to e / (e + (1 - e) x k): {shown}"
    )


def explained_kv_transfer(
    gpu, engine, fit, tp: int, params, prefill_replicas, prefill_tp, link_gb_s, pp: int = 1
):
    """The KV transfer explain shows with --prefill-replicas (one decode replica of --tp
    GPUs; None without the flag; the flags predict refuses, refused alike)."""
    from capsim.engine.config import PredictConfig
    from capsim.engine.disaggregated_setup import check_disaggregation_flags
    from capsim.engine.flag_checks import check_pipeline_flags
    from capsim.physics.kv_transfer import kv_transfer

    config = PredictConfig(
        gpu=gpu.name,
        model="(explained)",
        tp=tp,
        pp=pp,
        engine=engine.name,
        prefill_replicas=prefill_replicas,
        prefill_tp=prefill_tp,
        kv_transfer_gbs=link_gb_s,
    )
    check_disaggregation_flags(config, engine)
    check_pipeline_flags(config, engine.name)
    if not prefill_replicas:
        return None
    return kv_transfer(
        gpu,
        decode_gpu_bytes=fit.kv_bytes_per_token,
        decode_tp=tp,
        prefill_tp=prefill_tp or tp,
        total_gpus=tp + prefill_replicas * (prefill_tp or tp),
        params=params,
        requested_gb_s=link_gb_s,
    )


def kv_transfer_dict(transfer, prompt_tokens: int) -> dict | None:
    """explain --json's KV transfer terms for a prompt of ``prompt_tokens``."""
    if transfer is None:
        return None
    return {
        "prompt_tokens": prompt_tokens,
        "busiest_gpu_bytes_per_token": transfer.busiest_bytes_per_token,
        "link": transfer.link.name,
        "link_gb_s": transfer.link.gb_s,
        "efficiency": transfer.efficiency,
        "latency_ms": transfer.latency_s * 1e3,
        "link_ms": transfer.link_seconds(prompt_tokens) * 1e3,
        "total_ms": transfer.seconds(prompt_tokens) * 1e3,
    }


def kv_transfer_line(transfer, prompt_tokens: int) -> str:
    """explain's sentence on the KV transfer of a prompt of ``prompt_tokens``."""
    terms = kv_transfer_dict(transfer, prompt_tokens)
    return (
        f"KV transfer, prefill to decode instance: {terms['total_ms']:.2f} ms for a prompt of "
        f"{prompt_tokens:,} tokens = {terms['latency_ms']:g} ms fixed (kv_transfer_latency_ms) "
        f"+ {prompt_tokens:,} x {terms['busiest_gpu_bytes_per_token'] / 1024:,.1f} KiB on the "
        f"busiest GPU over {terms['link']} at {terms['link_gb_s']:g} GB/s x "
        f"{terms['efficiency']:g} (kv_transfer_efficiency): {terms['link_ms']:.2f} ms; added "
        "to TTFT"
    )


def dp_attention_row(sm) -> tuple[str, str]:
    """The explain row of data-parallel attention: the ranks, the attention weights each
    GPU reads for its rank (GB), and the share of the step's KV it reads."""
    from capsim.physics.memory import GB, weight_bytes

    dep = sm.deployment
    attention = weight_bytes(sm.model, sm.fmt, dep.tp, attention_tp=dep.attention_tp)["attention"]
    return (
        "data-parallel attention",
        f"{dep.dp_attention} ranks of {dep.attention_tp} GPU(s): a GPU reads its rank's "
        f"attention weights ({attention / GB:.3f} GB) and 1/{dep.dp_attention} of the "
        "sequences' KV (ranks balanced); MLP and MoE over all GPUs",
    )


def batch_kv_note(fit, batch: int, where: str) -> str | None:
    """A warning when a decode step of ``batch`` sequences of ``fit.context_tokens`` tokens
    each is more than the KV cache holds at once (``fit.max_sequences``: whole blocks,
    sliding windows and any recurrent-state pool counted), else None."""
    if not fit.fits or batch <= fit.max_sequences:
        return None
    tokens_each, most = fit.context_tokens, fit.max_sequences
    sequences = "1 sequence" if batch == 1 else f"{batch:,} sequences"
    verb = "needs" if batch == 1 else "need"
    if fit.sliding_window is None and not fit.state_bytes_per_sequence:  # tokens alone
        need = (
            f"{verb} {batch * tokens_each:,} tokens of KV cache and "
            f"{fit.kv_capacity_tokens:,} fit on {where}"
        )
    else:
        need = f"{verb} more KV cache than {where} holds"
    limit = (
        "not one sequence this long fits"
        if most == 0
        else f"a server runs at most {most:,} of them at once (the rest wait or are preempted)"
    )
    return (
        f"{sequences} of {tokens_each:,} tokens {need}: {limit}, so this step is costed for "
        "a batch no server would run"
    )
