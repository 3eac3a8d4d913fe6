"""capsim gpus, models, quants and engines: what the catalog holds, listed and shown."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.table import Table

from capsim.catalog import ENV_VAR
from capsim.cli.common import (
    PLAIN_HELP,
    DbOption,
    ForceOption,
    JsonOption,
    catalog,
    console,
    err_console,
    fitted_table,
    fmt_num,
    print_json,
    resolve_models,
    user_errors,
)

if TYPE_CHECKING:
    from capsim.catalog.gpu_schema import GPU
    from capsim.catalog.loader import Catalog
    from capsim.catalog.model_schema import Model


gpus_app = typer.Typer(
    help="List GPUs in the catalog, or show one.", add_completion=False, **PLAIN_HELP
)
models_app = typer.Typer(help="List models in the catalog, show one, import one.", **PLAIN_HELP)

AllOption = Annotated[
    bool, typer.Option("--all", help="Include test models and the CPU host entry")
]


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
    from capsim.physics.kv_layout import kv_layout
    from capsim.physics.memory import weight_bytes
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
        t: m.count_layers(t)
        for t in ("full_attention", "sliding_attention", "linear_attention", "mamba")
    }
    if m.ffn_pattern:  # hybrids whose mixer and FFN layers are separate blocks
        derived["layers"]["moe"] = sum(m.ffn_kind(i) == "moe" for i in range(m.num_layers))
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
    from capsim.physics.kv_layout import kv_layout
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
    if m.full_attention:
        fa = m.full_attention
        table.add_row(
            "full-attention layers",
            f"{fa.num_kv_heads} KV heads x {fa.head_dim}"
            + (", keys are the values (no v_proj)" if fa.k_eq_v else ""),
        )
    if m.kv_shared_layers:
        table.add_row(
            "KV-shared layers",
            f"the last {m.kv_shared_layers} (no cache of their own)"
            + ("; their MLPs twice as wide" if m.double_wide_mlp else ""),
        )
    if m.per_layer_input:
        table.add_row(
            "per-layer embeddings",
            f"{p.per_layer_embeddings / 1e9:.2f} B (looked up per token, not read by a step)",
        )
    if m.moe:
        table.add_row(
            "experts",
            f"{m.moe.num_experts} routed (top-{m.moe.experts_per_token}, width "
            f"{m.moe.moe_intermediate_size}), {m.moe.num_shared_experts} shared"
            + (f" (shared width {m.moe.shared_width})" if m.moe.num_shared_experts else "")
            + (f"; on a {m.moe.latent_size} latent" if m.moe.latent_size else ""),
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
            + (f", {m.published.active_b:g} B active" if m.published.active_b else "")
            + (
                f" (with {m.vision.params_b:g} B of encoders)"
                if m.published.includes_vision and m.vision
                else ""
            ),
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
    force: ForceOption = False,
) -> None:
    """Write a model YAML from a Hugging Face config.json into a user catalog directory."""
    from capsim.catalog.hf_import import (
        model_from_hf_config,
        quant_file_beside,
        read_config,
        write_model_yaml,
    )
    from capsim.catalog.loader import user_db_dirs
    from capsim.files import file_stem, refuse_overwrite
    from capsim.physics.parameters import parameter_breakdown

    file_stem(name, "--name")
    import re

    from capsim.catalog.schemas import CATALOG_KEY_PATTERN
    from capsim.errors import CapsimUserError

    if not re.fullmatch(CATALOG_KEY_PATTERN, name):  # 'a,b' would be two --model names
        raise CapsimUserError(
            f"--name {name!r} cannot be a catalog name",
            hint="letters, digits, '.', '_', '+' and '-', starting with a letter or digit "
            "(no comma, '@', '/' or space: commands read those as separators)",
        )
    from capsim.files import name_read_as_value, name_suggestion

    why = name_read_as_value(name)
    if why is not None:  # 'vllm serve NaN' was plan's winner; a --csv's model column 'true'
        raise CapsimUserError(
            f"--name '{name}' {why}: a catalog name is read back from results (--json, "
            "--csv) and command lines, where it would be taken for that",
            hint="no word such as true, null, nan or inf, no number and no '..'",
            suggestions=[name_suggestion(name, "model")],
        )
    if hf_id is not None and not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", hf_id):
        # written into the YAML and offered as the checkpoint to serve: it must be an id
        raise CapsimUserError(
            f"--hf-id {hf_id!r} is not a Hugging Face repo id",
            hint="ORG/NAME, e.g. Qwen/Qwen3-8B",
        )
    model = model_from_hf_config(
        read_config(config),
        name,
        hf_id=hf_id,
        source=str(config),
        quant_file=quant_file_beside(config),
    )
    built_in = catalog(None)
    formats = built_in.quant_formats
    if model.dtype not in formats.entries:  # the catalog would refuse the file it writes
        # (loader.check_references: a model's dtype is a weight format's name)
        from capsim.errors import CapsimUserError, close_matches

        raise CapsimUserError(
            f"{config}: the checkpoint's weights are '{model.dtype}' (its quantization_config "
            "or torch_dtype), not a weight format capsim knows",
            hint="capsim quants lists them; a checkpoint of another format imports as it is",
            suggestions=close_matches(model.dtype, formats.names()),
        )
    out_given = out is not None
    if out is None:
        env_dirs = user_db_dirs()
        out = env_dirs[0] if env_dirs else Path("capsim-db")
    target = out / "models" / f"{model.name}.yaml"
    refuse_overwrite([target], "--out", True)  # the folder: a file, a device, not writable
    refuse_overwrite([target], "--name", force)  # the file: there already
    if out_given:  # the catalog folder and its models/ are created, in a folder that exists
        from capsim.files import refuse_missing_folder

        refuse_missing_folder(out.parent, "--out", out)
    refuse_a_name_lookups_confuse(model.name, built_in, out / "models", target)
    # a name the built-in catalog already answers to: the new file replaces that model
    # wherever --db names this directory, which the user should hear of
    shadowed = built_in.models.find(model.name)
    path = write_model_yaml(model, out)
    p = parameter_breakdown(model)
    if json_out:
        print_json(
            {
                "path": str(path),
                "name": model.name,
                "total_params": p.total,
                "active_params": p.active,
                "replaces_built_in": shadowed.name if shadowed is not None else None,
            }
        )
        return
    console.print(
        f"wrote {path} ({p.total / 1e9:.2f} B parameters, {p.active / 1e9:.2f} B active); "
        f"use it with --db {out}"
    )
    if shadowed is not None:
        err_console.print(
            f"note: '{model.name}' is also the built-in model {shadowed.name} "
            f"({shadowed.hf_id}); with --db {out} this file replaces it. Pick another --name "
            "to keep both",
            highlight=False,
            soft_wrap=True,
        )


def refuse_a_name_lookups_confuse(name: str, cat, folder: Path, target: Path) -> None:
    """An imported model's --name that is another entry's but for case and separators (the
    built-in 'llama-3.1-8b' for 'LLAMA_3.1_8B' or its alias 'llama3.1-8b'), or another file
    of the folder written into: the catalog refuses a folder that holds it (lookups could
    not tell the two apart), so the import wrote a file that made every command with that
    --db exit 2 (issue 47, round 5). Refused before anything is written."""
    from capsim.errors import CapsimUserError, normalise_name

    key = normalise_name(name)
    twin = next((n for n in cat.models.entries if n != name and normalise_name(n) == key), None)
    if twin is not None:
        raise CapsimUserError(
            f"--name '{name}' is the model '{twin}' but for case and separators: lookups "
            "could not tell them apart, and the catalog would refuse the file",
            hint=f"--name {twin} to replace that model where --db names the folder, or a "
            "name of its own",
        )
    try:
        others = [p for p in folder.glob("*.y*ml") if p != target and p.suffix in (".yaml", ".yml")]
    except OSError:
        return
    clash = next((p for p in others if normalise_name(p.stem) == key), None)
    if clash is not None:
        raise CapsimUserError(
            f"--name '{name}' is the model of '{clash}' but for case and separators: the "
            "catalog would refuse a folder holding both",
            hint=f"--name {clash.stem} --force to replace it, or a name of its own",
        )


# ----------------------------------------------------------------------------- quants


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
    older = [(e.name, g) for e in cat.engines for g in e.generations]
    if older:
        console.print(
            "Older releases (--engine NAME@VERSION, e.g. vllm@0.7.3; a release takes every "
            "range that holds it, in this order):",
            soft_wrap=True,
        )
        for name, g in older:
            changes = generation_changes(g)
            console.print(
                f"  {name} {g.versions}: {g.label}" + (f" ({changes})" if changes else ""),
                soft_wrap=True,
                highlight=False,
            )
    read = [(e.name, e.releases) for e in cat.engines if e.releases is not None]
    if read:
        console.print(
            "Releases read (a version outside them is predicted as the nearest, with a note):",
            soft_wrap=True,
        )
        for name, r in read:
            console.print(
                f"  {name}: {r.oldest} to {r.newest}"
                if r.oldest
                else f"  {name}: up to {r.newest} (oldest not stated)",
                soft_wrap=True,
                highlight=False,
            )
    backends = [(e.name, key, b) for e in cat.engines for key, b in e.backends.items()]
    if backends:
        console.print(
            "Backends (--engine NAME:BACKEND, e.g. llama.cpp:vulkan; default: the GPU "
            "vendor's own):",
            soft_wrap=True,
        )
        for name, key, b in backends:
            classes = ", ".join(sorted(b.class_params))
            console.print(
                f"  {name}:{key}: {b.label}, on {', '.join(b.vendors)} GPUs"
                + (f" (sets parameters for {classes})" if classes else ""),
                soft_wrap=True,
                highlight=False,
            )


def generation_changes(gen) -> str:
    """What an engine generation sets, in a few words: its fields, then its parameters
    (those for one hardware class after the class name)."""
    from capsim.catalog.engine_schema import GENERATION_FIELDS

    parts = []
    for field in GENERATION_FIELDS:
        value = getattr(gen, field)
        if value is None:
            continue
        if field == "batch_defaults":
            rows = ", ".join(f"{r.max_num_batched_tokens}/{r.max_num_seqs}" for r in value)
            parts.append(f"batch_defaults {rows}")
        elif isinstance(value, list):  # weight_formats: the names, not a Python list
            parts.append(f"{field} {' '.join(value)}")
        else:
            parts.append(f"{field} {value}")
    parts += [f"{k} {v:g}" for k, v in gen.params.items()]
    for hw_class, params in gen.class_params.items():
        parts.append(
            f"{hw_class}: "
            + ", ".join(
                f"{k} {'unset' if v is None else format(v, 'g')}" for k, v in params.items()
            )
        )
    return "; ".join(parts)
