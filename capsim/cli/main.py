"""The ``capsim`` command: a thin typer layer over the Python API.

Commands parse options, call the API and print; they hold no physics. User errors
(:class:`capsim.errors.CapsimUserError`) print one line, a hint and did-you-mean
suggestions on stderr and exit with code 2, without a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.table import Table

from capsim.catalog import ENV_VAR
from capsim.cli.common import (
    PLAIN_HELP,
    AsyncSchedulingOption,
    DbOption,
    DisableCustomAllReduceOption,
    EngineOption,
    GpuMemoryUtilizationOption,
    JsonOption,
    MaxModelLenOption,
    MaxNumBatchedTokensOption,
    MaxNumSeqsOption,
    PowerLimitOption,
    SetOption,
    SpecAcceptanceOption,
    SpecOption,
    UbatchOption,
    catalog,
    console,
    err_console,
    fitted_table,
    fmt_num,
    fmt_sig,
    global_db,
    parse_overrides,
    print_json,
    resolve_models,
    spec_config,
    user_errors,
)
from capsim.errors import CapsimUserError

if TYPE_CHECKING:
    from capsim.catalog.loader import Catalog
    from capsim.catalog.schemas import GPU, Model
    from capsim.physics.step import StepBreakdown

APP_SETTINGS: dict[str, Any] = dict(
    name="capsim",
    help="Predict LLM serving throughput on your GPUs before you buy or reconfigure them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    **PLAIN_HELP,
)

cli = typer.Typer(**APP_SETTINGS)
"""The commands defined in this module; ``app`` adds those of the other cli modules."""
gpus_app = typer.Typer(
    help="List GPUs in the catalog, or show one.", add_completion=False, **PLAIN_HELP
)
models_app = typer.Typer(help="List models in the catalog, show one, import one.", **PLAIN_HELP)
cli.add_typer(gpus_app, name="gpus")
cli.add_typer(models_app, name="models")


AllOption = Annotated[
    bool, typer.Option("--all", help="Include test models and the CPU host entry")
]


def print_version(value: bool) -> None:
    """--version: the installed capsim's version, then exit."""
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("capsim")
        except PackageNotFoundError:
            text = "unknown (not installed)"
        console.print(f"capsim {text}", highlight=False)
        raise typer.Exit()


@cli.callback()
def main(
    db: DbOption = None,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """capsim: capacity simulator for self-hosted LLM serving."""
    global_db[:] = list(db or [])


# ----------------------------------------------------------------------------- gpus


@gpus_app.callback(invoke_without_command=True)
@user_errors
def gpus_list(
    ctx: typer.Context,
    json_out: JsonOption = False,
    show_all: AllOption = False,
    db: DbOption = None,
) -> None:
    """List GPUs: memory, bandwidth, cache, tensor throughput, power and price."""
    if ctx.invoked_subcommand:
        return
    cat = catalog(db)
    gpus = [g for g in cat.gpus if show_all or g.listed]
    if json_out:
        print_json([g.model_dump(mode="json") for g in gpus])
        return
    columns = [("name", "left", False)] + [
        (col, "right", col in ("L2 MB", "FP8 TF", "TDP W"))
        for col in ("GB", "GB/s", "L2 MB", "BF16 TF", "FP8 TF", "TDP W", "USD (date)")
    ]
    rows = []
    for g in gpus:
        rows.append(
            [
                g.name,
                fmt_num(g.memory_gb, 0),
                fmt_num(g.memory_bandwidth_gb_s, 0),
                fmt_num(g.l2_cache_mb, 0),
                fmt_num(g.tensor_tflops.bf16, 0),
                fmt_num(g.tensor_tflops.fp8, 0),
                fmt_num(g.tdp_w, 0),
                f"{g.price.usd:,.0f} ({g.price.date.year})" if g.price else "—",
            ]
        )
    title = f"GPUs ({len(gpus)}); 'capsim gpus show NAME' for details"
    console.print(fitted_table(title, columns, rows))


def gpu_derived(g: GPU) -> dict[str, Any]:
    """Figures derived from a GPU's specs (ridge point of the roofline)."""
    bf16 = g.tensor_tflops.bf16
    return {
        "memory_bytes": g.memory_bytes,
        "ridge_flop_per_byte_bf16": bf16 * 1e12 / (g.memory_bandwidth_gb_s * 1e9) if bf16 else None,
    }


@gpus_app.command("show")
@user_errors
def gpus_show(name: str, json_out: JsonOption = False, db: DbOption = None) -> None:
    """Show one GPU with every field and its sources."""
    from capsim.catalog.schemas import DTYPES

    g = catalog(db).gpu(name)
    derived = gpu_derived(g)
    if json_out:
        print_json({**g.model_dump(mode="json"), "derived": derived})
        return
    table = Table(title=g.display_name, show_header=False)
    table.add_column("field", overflow="fold")
    table.add_column("value", overflow="fold")
    table.add_row("name (aliases)", f"{g.name} ({', '.join(g.aliases) or '—'})")
    table.add_row("architecture / class", f"{g.architecture} / {g.hardware_class}")
    table.add_row("memory", f"{g.memory_gb:g} GB {g.memory_type or ''}")
    if g.usable_memory_gb:
        table.add_row("usable by the GPU", f"{g.usable_memory_gb:g} GB")
    table.add_row("bandwidth", f"{g.memory_bandwidth_gb_s:,.0f} GB/s")
    table.add_row("L2 / last-level cache", fmt_num(g.l2_cache_mb, 0, " MB"))
    for dtype in DTYPES:
        table.add_row(
            f"dense {dtype} tensor", fmt_num(getattr(g.tensor_tflops, dtype), 1, " TFLOPS")
        )
    table.add_row("native formats", ", ".join(g.native_formats))
    for ic in g.interconnects:
        desc = f"{ic.kind}"
        if ic.generation:
            desc += f" gen {ic.generation:g}"
        if ic.lanes:
            desc += f" x{ic.lanes}"
        table.add_row(
            "interconnect", f"{desc}: {fmt_num(ic.bandwidth_gb_s_per_direction)} GB/s/dir"
        )
    table.add_row("TDP", fmt_num(g.tdp_w, 0, " W"))
    if g.price:
        table.add_row("price", f"{g.price.usd:,.0f} USD ({g.price.kind}, {g.price.date})")
    ridge = derived["ridge_flop_per_byte_bf16"]
    table.add_row("roofline ridge (bf16)", fmt_num(ridge, 0, " FLOP/byte"))
    for s in g.sources:
        table.add_row("source", s.title + (f" <{s.url}>" if s.url else ""))
    if g.notes:
        table.add_row("notes", g.notes)
    console.print(table)


# ----------------------------------------------------------------------------- models


def model_derived(m: Model, cat: Catalog) -> dict[str, Any]:
    """Figures derived from a model's dimensions: parameters, weights and KV per token."""
    from capsim.physics.memory import kv_layout, weight_bytes
    from capsim.physics.parameters import parameter_breakdown

    p = parameter_breakdown(m)
    derived: dict[str, Any] = {"parameters": p.as_dict()}
    weights = {}
    for q in ("bf16", "fp8", "awq-int4"):
        fmt = cat.quant(q)
        weights[q] = sum(weight_bytes(m, fmt).values())
    if m.dtype not in weights:
        weights[m.dtype] = sum(weight_bytes(m, cat.quant(m.dtype)).values())
    derived["weight_bytes"] = weights
    for kv in ("auto", "fp8"):
        lay = kv_layout(m, kv)
        derived[f"kv_{kv}"] = {
            "bytes_per_token": lay.bytes_per_token,
            "full_bytes_per_token": lay.full_bytes_per_token,
            "sliding_bytes_per_token": lay.sliding_bytes_per_token,
            "state_bytes_per_sequence": lay.state_bytes_per_sequence,
            "per_layer_type": lay.per_layer_type,
        }
    derived["layers"] = {
        t: m.count_layers(t) for t in ("full_attention", "sliding_attention", "linear_attention")
    }
    return derived


@models_app.callback(invoke_without_command=True)
@user_errors
def models_list(
    ctx: typer.Context,
    json_out: JsonOption = False,
    show_all: AllOption = False,
    db: DbOption = None,
) -> None:
    """List models with their computed total and active parameters."""
    from capsim.physics.memory import kv_layout
    from capsim.physics.parameters import parameter_breakdown

    if ctx.invoked_subcommand:
        return
    cat = catalog(db)
    models = [m for m in cat.models if show_all or m.listed]
    if json_out:
        out = []
        for m in models:
            p = parameter_breakdown(m)
            out.append(
                {
                    **m.model_dump(mode="json"),
                    "total_params": p.total,
                    "active_params": p.active,
                }
            )
        print_json(out)
        return
    headers = ("name", "HF id", "type", "layers", "total B", "active B", "KV KiB/tok", "ctx")
    optional = ("HF id", "ctx", "KV KiB/tok", "layers")
    columns = [
        (col, "left" if col in ("name", "HF id", "type") else "right", col in optional)
        for col in headers
    ]
    rows = []
    for m in models:
        p = parameter_breakdown(m)
        kind = "MoE" if m.is_moe else "dense"
        if m.mla:
            kind += "+MLA"
        if "linear_attention" in m.layer_pattern:
            kind += "+linear"
        if "sliding_attention" in m.layer_pattern:
            kind += "+SWA"
        rows.append(
            [
                m.name,
                m.hf_id,
                kind,
                str(m.num_layers),
                f"{p.total / 1e9:.1f}",
                f"{p.active / 1e9:.1f}",
                f"{kv_layout(m).bytes_per_token / 1024:.0f}",
                f"{m.max_position_embeddings:,}" if m.max_position_embeddings else "—",
            ]
        )
    title = f"Models ({len(models)}); 'capsim models show NAME' for details"
    console.print(fitted_table(title, columns, rows))


@models_app.command("show")
@user_errors
def models_show(name: str, json_out: JsonOption = False, db: DbOption = None) -> None:
    """Show one model's dimensions and derived figures (parameters, weights, KV per token)."""
    from capsim.physics.memory import GB
    from capsim.physics.parameters import parameter_breakdown

    cat, (ref,) = resolve_models(catalog(db), [name])
    m = cat.model(ref.name)
    derived = model_derived(m, cat)
    if json_out:
        print_json({**m.model_dump(mode="json"), "derived": derived})
        return
    p = parameter_breakdown(m)
    table = Table(title=f"{m.display_name} ({m.hf_id})", show_header=False)
    table.add_column("field", overflow="fold")
    table.add_column("value", overflow="fold")
    table.add_row("architecture", m.architecture)
    table.add_row(
        "layers",
        f"{m.num_layers} ("
        + ", ".join(f"{v} {k}" for k, v in derived["layers"].items() if v)
        + ")",
    )
    table.add_row(
        "hidden / heads / KV heads / head dim",
        f"{m.hidden_size} / {m.num_attention_heads} / {m.num_kv_heads} / {m.head_dim}",
    )
    if m.moe:
        table.add_row(
            "experts",
            f"{m.moe.num_experts} routed (top-{m.moe.experts_per_token}, width "
            f"{m.moe.moe_intermediate_size}), {m.moe.num_shared_experts} shared",
        )
    if m.mla:
        table.add_row("MLA", f"kv_lora_rank {m.mla.kv_lora_rank}, rope {m.mla.qk_rope_head_dim}")
    if m.mtp_layers:
        table.add_row("MTP layers", str(m.mtp_layers))
    table.add_row("total parameters", f"{p.total / 1e9:.2f} B")
    table.add_row("active parameters", f"{p.active / 1e9:.2f} B")
    if m.published:
        table.add_row(
            "published",
            f"{m.published.total_b:g} B total"
            + (f", {m.published.active_b:g} B active" if m.published.active_b else ""),
        )
    for q, b in derived["weight_bytes"].items():
        table.add_row(f"weights at {q}", f"{b / GB:.1f} GB")
    kv = derived["kv_auto"]
    table.add_row("KV per token (16-bit)", f"{kv['bytes_per_token']:,.0f} bytes")
    table.add_row("KV per token (fp8)", f"{derived['kv_fp8']['bytes_per_token']:,.0f} bytes")
    if kv["state_bytes_per_sequence"]:
        table.add_row(
            "linear-attention state", f"{kv['state_bytes_per_sequence'] / 2**20:.1f} MiB/seq"
        )
    for s in m.sources:
        table.add_row("source", s.title + (f" <{s.url}>" if s.url else ""))
    console.print(table)


@models_app.command("import-hf")
@user_errors
def models_import_hf(
    config: Annotated[Path, typer.Argument(help="A Hugging Face config.json")],
    name: Annotated[str, typer.Option("--name", help="Catalog name for the model")],
    hf_id: Annotated[str | None, typer.Option("--hf-id", help="Hub id, e.g. org/model")] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help=f"Catalog directory to write into (default: first ${ENV_VAR} "
            "directory, else ./capsim-db)",
        ),
    ] = None,
    json_out: JsonOption = False,
) -> None:
    """Write a model YAML from a Hugging Face config.json into a user catalog directory."""
    from capsim.catalog.hf_import import model_from_hf_config, read_config, write_model_yaml
    from capsim.catalog.loader import user_db_dirs
    from capsim.physics.parameters import parameter_breakdown

    model = model_from_hf_config(read_config(config), name, hf_id=hf_id, source=str(config))
    if out is None:
        env_dirs = user_db_dirs()
        out = env_dirs[0] if env_dirs else Path("capsim-db")
    path = write_model_yaml(model, out)
    p = parameter_breakdown(model)
    if json_out:
        print_json(
            {
                "path": str(path),
                "name": model.name,
                "total_params": p.total,
                "active_params": p.active,
            }
        )
        return
    console.print(
        f"wrote {path} ({p.total / 1e9:.2f} B parameters, {p.active / 1e9:.2f} B active); "
        f"use it with --db {out}"
    )


# ----------------------------------------------------------------------------- quants


@cli.command("quants")
@user_errors
def quants_list(json_out: JsonOption = False, db: DbOption = None) -> None:
    """List weight formats: bits per weight and what stays unquantised."""
    cat = catalog(db)
    if json_out:
        print_json(
            [
                {**q.model_dump(mode="json"), "bits_per_weight": q.bits_per_weight}
                for q in cat.quant_formats
            ]
        )
        return
    table = Table(
        title="Weight formats",
        box=box.SIMPLE_HEAD,
        show_lines=True,
        pad_edge=False,
        collapse_padding=True,
    )
    for col in ("name", "format", "bits/\nweight", "compute", "quantises", "kept 16-bit"):
        # names and figures whole (tensors one a line); the description wraps at spaces
        table.add_column(
            col,
            justify="right" if col == "bits/\nweight" else "left",
            no_wrap=col != "format",
            overflow="fold",
        )
    for q in cat.quant_formats:
        table.add_row(
            q.name,
            q.display_name,
            f"{q.bits_per_weight:.3f}",
            q.compute_dtype,
            "\n".join(q.quantized_tensors),  # one a line: long names are never broken
            "\n".join(q.unquantized_tensors),
        )
    console.print(table)


def reserve_text(reserve) -> str:
    """An engine's admission reserve: the share of running requests' output still to come
    held back in the KV pool, from its start to its floor ('-': none)."""
    if reserve is None:
        return "-"
    low = reserve.init_ratio * reserve.min_ratio_factor
    return f"{reserve.init_ratio:g}-{low:.2g}"


@cli.command("engines")
@user_errors
def engines_list(json_out: JsonOption = False, db: DbOption = None) -> None:
    """List serving engines and the defaults capsim simulates for each."""
    cat = catalog(db)
    if json_out:
        print_json([e.model_dump(mode="json") for e in cat.engines])
        return
    table = Table(title="Serving engines (pass with --engine)")
    table.add_column("name", no_wrap=True)
    table.add_column("step tokens / sequences", overflow="fold")
    table.add_column("graphs", no_wrap=True)
    for col in ("ubatch", "mixes prefill", "reserve ratio"):
        table.add_column(col, overflow="fold", max_width=9)
    for e in cat.engines:
        limits = "\n".join(
            f"{row.max_num_batched_tokens}/{row.max_num_seqs}"
            + (f" (>= {row.min_memory_gb:g} GB)" if row.min_memory_gb else "")
            for row in e.batch_defaults
        )
        table.add_row(
            e.name,
            limits,
            e.graph_capture,
            str(e.ubatch_tokens or "-"),
            "yes" if e.mixes_prefill_and_decode else "no",
            reserve_text(e.admission_reserve),
        )
    console.print(table)


# ----------------------------------------------------------------------------- fit


@cli.command("fit")
@user_errors
def fit_cmd(
    gpu: Annotated[str, typer.Option("--gpu", help="GPU name, e.g. rtx3090")],
    model: Annotated[str, typer.Option("--model", help="Model name, e.g. qwen3-coder-30b-a3b")],
    quant: Annotated[
        str | None, typer.Option("--quant", help="Weight format (default: the model's release)")
    ] = None,
    gpus: Annotated[
        int | None, typer.Option("--gpus", help="GPUs in total (default: --tp)")
    ] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size")] = 1,
    kv_dtype: Annotated[str, typer.Option("--kv-dtype", help="auto, bf16, fp16, fp8")] = "auto",
    gpu_memory_utilization: GpuMemoryUtilizationOption = None,
    max_model_len: MaxModelLenOption = None,
    max_num_seqs: MaxNumSeqsOption = None,
    max_num_batched_tokens: MaxNumBatchedTokensOption = None,
    context: Annotated[
        int | None,
        typer.Option("--context", help="Sequence length for 'sequences that fit' (tokens)"),
    ] = None,
    enforce_eager: Annotated[bool, typer.Option("--enforce-eager", help="No CUDA graphs")] = False,
    mtp: Annotated[
        bool, typer.Option("--mtp", help="Load the MTP module (MTP speculation)")
    ] = False,
    engine: EngineOption = "vllm",
    json_out: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Does MODEL fit on GPU? Weights, activations, KV cache capacity per GPU."""
    from capsim.engine.setup import engine_fit_options
    from capsim.physics.memory import fit_hint, memory_fit, require_fit

    cat, (ref,) = resolve_models(catalog(db), [model])
    g = cat.gpu(gpu)
    m = cat.model(ref.name)
    fmt = cat.quant(quant or ref.quant or m.dtype)
    total_gpus = gpus if gpus is not None else tp
    if total_gpus < 1 or total_gpus % tp:
        raise CapsimUserError(
            f"--gpus {total_gpus} is not a multiple of --tp {tp}",
            hint="GPUs are used as data-parallel replicas of one TP group each",
        )
    replicas = total_gpus // tp
    options = dict(
        kv_dtype=kv_dtype,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        context_tokens=context,
        enforce_eager=enforce_eager,
        include_mtp=mtp,
    )
    options = engine_fit_options(cat.engine(engine), g, **options)
    result = memory_fit(g, m, fmt, tp=tp, **options)
    if json_out:
        print_json({**result.to_dict(), "gpus": total_gpus, "dp_replicas": replicas})
    else:
        print_fit(result, g, m, replicas)
    if not result.fits:
        require_fit(result, fit_hint(g, m, fmt, list(cat.quant_formats), tp, **options))


def print_fit(r, g: GPU, m: Model, replicas: int) -> None:
    from capsim.physics.memory import GB, GIB

    table = Table(
        title=f"{m.name} ({r.quant}) on {r.tp}x {g.name}"
        + (f", {replicas} replicas" if replicas > 1 else "")
        + f": {'FITS' if r.fits else 'DOES NOT FIT'}",
        show_header=False,
    )
    table.add_column("term", overflow="fold")
    table.add_column("per GPU", justify="right", overflow="fold")
    table.add_row("GPU memory", f"{r.memory_bytes / GIB:.2f} GiB")
    table.add_row(f"usable (x {r.gpu_memory_utilization:g})", f"{r.budget_bytes / GIB:.2f} GiB")
    table.add_row("weights", f"{r.weight_bytes / GIB:.2f} GiB ({r.weight_bytes / GB:.2f} GB)")
    table.add_row("activation peak", f"{r.activation_bytes / GIB:.2f} GiB")
    table.add_row(
        "runtime reserve (context, NCCL, graphs)", f"{r.runtime_reserve_bytes / GIB:.2f} GiB"
    )
    table.add_row("KV cache budget", f"{r.kv_budget_bytes / GIB:.2f} GiB")
    if r.kv_budget_bytes <= 0:
        console.print(table)
        return
    table.add_row("KV bytes per token", f"{r.kv_bytes_per_token:,.0f}")
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
        elif r.state_blocks_per_sequence:
            table.add_row(
                "state pages in the KV pool",
                f"{r.state_blocks_per_sequence:,} blocks per running sequence",
            )
    if r.sliding_window:
        table.add_row("sliding-window layers hold at most", f"{r.sliding_window} tokens")
    table.add_row("KV capacity", f"{r.kv_capacity_tokens:,} tokens")
    table.add_row("max_model_len", f"{r.max_model_len:,} (limit {r.max_model_len_limit:,})")
    table.add_row(
        f"sequences of {r.context_tokens:,} tokens that fit",
        f"{r.max_sequences:,} (max_num_seqs {r.max_num_seqs})",
    )
    console.print(table)


# ----------------------------------------------------------------------------- explain


def step_rows(
    step: StepBreakdown,
    tokens_out: float,
    ridge: float | None,
    int8_gemm_flops_per_s: float | None = None,
) -> list[tuple[str, str]]:
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
            "communication (all-reduce)",
            f"{step.t_communication * ms:.3f} ms"
            + (f" ({step.allreduce_algorithm})" if step.allreduce_algorithm else ""),
        ),
        ("overhead (step, sequences, layers)", f"{step.t_overhead * ms:.3f} ms"),
    ]
    if step.t_host_hidden > 0:
        rows.append(
            (
                "host work hidden by async scheduling",
                f"{step.t_host_hidden * ms:.3f} of {step.t_host * ms:.3f} ms",
            )
        )
    if step.t_dispatch:
        rows.append(("eager launches (CPU, overlap the GPU)", f"{step.t_dispatch * ms:.3f} ms"))
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


@cli.command("explain")
@user_errors
def explain_cmd(
    gpu: Annotated[str, typer.Option("--gpu", help="GPU name")],
    model: Annotated[str, typer.Option("--model", help="Model name")],
    quant: Annotated[str | None, typer.Option("--quant", help="Weight format")] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size")] = 1,
    kv_dtype: Annotated[str, typer.Option("--kv-dtype")] = "auto",
    batch: Annotated[int, typer.Option("--batch", help="Sequences in the decode step")] = 1,
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
    interconnect: Annotated[str, typer.Option("--interconnect")] = "auto",
    enforce_eager: Annotated[bool, typer.Option("--enforce-eager")] = False,
    async_scheduling: AsyncSchedulingOption = None,
    disable_custom_all_reduce: DisableCustomAllReduceOption = False,
    engine: EngineOption = "vllm",
    ubatch_size: UbatchOption = None,
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
    from capsim.physics.step import build_step_model

    if batch < 1 or context < 0:
        raise CapsimUserError("--batch must be at least 1 and --context at least 0")
    cat = catalog(db)
    spec_cfg = spec_config(spec, spec_acceptance)
    overrides = parse_overrides(set_values)
    g = cat.gpu(gpu)
    eng = cat.engine(engine)
    cat, (ref,) = resolve_models(cat, [model])
    m = cat.model(ref.name)
    quant = quant or ref.quant
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
        include_mtp=spec_cfg is not None and spec_cfg.method == "mtp",
        context_tokens=context + width,
    )
    fmt, quant_reason, fit = resolve_format(cat, g, m, quant, tp, **fit_options)
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
    )
    from capsim.calibration.profiles import find_profile

    fitted = find_profile(profile, g.hardware_class, eng.name)
    params = resolve_params(cat, g, overrides, engine=eng, profile=fitted)
    sm = build_step_model(cat, g, m, dep, params)
    decode, per_seq = sm.decode_step(np.full(batch, context))
    chunk = prefill_chunk or max(min(context, 8192), 1)
    kv_note = batch_kv_note(fit, batch, f"{tp}x {g.name}")
    if longest and prefill_context + chunk > longest:
        raise CapsimUserError(
            f"--prefill-context {prefill_context:,} plus a {chunk:,}-token chunk exceeds "
            f"{m.name}'s {longest:,}-token context",
            hint=f"--prefill-context is 0 to {max(longest - chunk, 0):,} with this chunk",
        )
    prefill = sm.step(np.array([chunk]), np.array([prefill_context]))
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
            }
        )
        return
    title = f"{sm.model.name} ({sm.fmt.name}) on {tp}x {g.name}"
    title += f", profile {fitted.name}" if fitted else ", uncalibrated"
    note = "" if sm.native else f"; {sm.fmt.name} runs weight-only ({sm.compute_dtype} compute)"
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
        for row in step_rows(step, out, ridge, sm.int8_gemm_rate):
            table.add_row(*row)
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
    if quant in (None, "auto"):
        console.print(f"weight format {quant_reason}", highlight=False)
    for warning in (fit_note, kv_note):
        if warning:
            console.print(f"[bold yellow]warning:[/] {warning}", highlight=False)


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


COMMANDS = {
    "predict": ("capsim.cli.predict", "predict_cmd"),
    "validate": ("capsim.cli.validate", "validate_cmd"),
    "calibrate": ("capsim.cli.calibrate", "calibrate_cmd"),
    "calibrate-kernels": ("capsim.cli.calibrate", "calibrate_kernels_cmd"),
    "plan": ("capsim.cli.plan", "plan_cmd"),
    "capacity": ("capsim.cli.capacity", "capacity_cmd"),
    "serve": ("capsim.cli.serve", "serve_cmd"),
}
"""Commands defined in other cli modules: (module, function), in the order --help lists
them. A command line names one, so only its module is imported (start-up time)."""

GROUPS = {
    "probe": ("capsim.cli.probe", "probe_app"),
    "import": ("capsim.cli.importers", "import_app"),
}
"""Command groups defined in other cli modules: (module, Typer)."""


def _add_command(target: typer.Typer, name: str) -> None:
    """Register the command or group ``name`` of another cli module on ``target``."""
    import importlib

    if name in COMMANDS:
        module, attr = COMMANDS[name]
        target.command(name)(user_errors(getattr(importlib.import_module(module), attr)))
    else:
        module, attr = GROUPS[name]
        target.add_typer(getattr(importlib.import_module(module), attr), name=name)


@functools.cache
def full_app() -> typer.Typer:
    """Every command: this module's and the other cli modules' (registered once)."""
    for name in [*GROUPS, *COMMANDS]:
        _add_command(cli, name)
    return cli


def __getattr__(name: str) -> Any:
    if name == "app":  # the whole command line, for tests and ``python -m``
        return full_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def app_for(args: list[str]) -> typer.Typer:
    """The command line that ``args`` needs: the global callback and the one command or
    group they name (so typer builds only its options, and no other command's module is
    imported), or every command where they name none, or one this module does not know
    (--help, a typo: the full listing and its did-you-mean)."""
    name = args[0] if args and not args[0].startswith("-") else None
    own = {info.name: info for info in cli.registered_commands}
    groups = {info.name: info for info in cli.registered_groups}
    if name is None or not (name in own or name in groups or name in COMMANDS or name in GROUPS):
        return full_app()
    slim = typer.Typer(**APP_SETTINGS)
    slim.registered_callback = cli.registered_callback
    if name in own:
        slim.registered_commands.append(own[name])
    elif name in groups:
        slim.registered_groups.append(groups[name])
    else:
        _add_command(slim, name)
    return slim


EXIT_INTERRUPTED = 130


def _exit_interrupted(say: bool) -> None:
    """Leave at once after Ctrl-C, output flushed (``say``: print that it was interrupted,
    where the command has not said so itself): worker pools stopped mid-work leave
    concurrent.futures' exit hook racing its own threads (a spurious traceback at
    interpreter shutdown), and there is nothing left to clean up (what finished was
    printed or written as it finished)."""
    import os

    if say:
        err_console.print("interrupted", highlight=False)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(EXIT_INTERRUPTED)


def run() -> None:
    """Console-script entry point."""
    try:
        app_for(sys.argv[1:])()
    except KeyboardInterrupt:
        _exit_interrupted(say=True)
    except SystemExit as exc:
        if exc.code == EXIT_INTERRUPTED:
            _exit_interrupted(say=False)
        raise


if __name__ == "__main__":
    run()
