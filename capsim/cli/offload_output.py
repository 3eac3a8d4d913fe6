"""capsim fit's answer when a MoE model does not fit on its GPU but llama.cpp can keep some
routed experts in system RAM: the configurations that fit (planner/offload.py) as a table
priced at measured hosts, and the command to simulate the fastest."""

from __future__ import annotations

from rich import box
from rich.markup import escape

from capsim.cli.common import console, fitted_table
from capsim.physics.memory import GIB
from capsim.planner.offload import USER_HOST, OffloadProposal


def offload_table(proposal: OffloadProposal, title: str):
    """One row per configuration: offloaded layers, bytes in system RAM, the KV cache left
    and one request's decode speed at each host (never cut at 80 columns: the hosts past
    the user's own are optional)."""
    columns = [
        ("n-cpu-moe\n(layers)", "right", False),
        ("experts in\nsystem RAM", "right", False),
        ("KV cache\ntokens", "right", False),
    ]
    for name, bandwidth in proposal.hosts.items():
        label = proposal.host_labels[name]
        header = f"tok/s\n{label}" if name == USER_HOST else f"tok/s\n{label}\n{bandwidth:g} GB/s"
        columns.append((header, "right", name != USER_HOST))
    rows = [
        [
            f"{o.n_cpu_moe} of {o.moe_layers}",
            f"{o.experts_in_system_ram_bytes / GIB:.1f} GiB",
            f"{o.kv_capacity_tokens:,}",
            *(f"{o.decode_tok_s[name]:.1f}" for name in proposal.hosts),
        ]
        for o in proposal.options
    ]
    context = proposal.fewest.context_tokens
    caption = (
        f"tok/s: decode speed of one request with {context:,} tokens in context, "
        "uncalibrated (against published llama-bench runs capsim's decode with experts in "
        "system RAM came out 5-35% fast with MXFP4 experts: docs/physics.md); host "
        "bandwidths as measured (hardware_db/hosts/, sources there), yours with "
        "--host-memory-bandwidth"
    )
    return fitted_table(
        title,
        columns,
        rows,
        caption=caption,
        cell_padding=2,  # SIMPLE_HEAD with collapsed padding: two spaces between columns
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )


def print_offload(proposal: OffloadProposal, fit, gpu, model, hint: str) -> None:
    """The GPU alone does not hold ``model``: say so, show what fits with llama.cpp
    offloading experts, and the command that simulates the fastest of them."""
    console.print(
        f"{escape(model.name)} ({fit.quant}) does not fit on {fit.tp}x {gpu.name} alone: "
        f"{escape(fit.reason)}"
    )
    title = (
        f"It fits with llama.cpp ({proposal.quant}) keeping the routed experts of some MoE "
        "layers in system RAM (--n-cpu-moe)"
    )
    console.print(offload_table(proposal, title))
    fewest = proposal.fewest
    mine = USER_HOST in proposal.hosts
    console.print(
        f"simulate the fastest: {escape(fewest.command)}"
        + ("" if mine else "  (put your host's measured GB/s in)")
    )
    if hint:
        console.print(f"other ways: {escape(hint)}")
