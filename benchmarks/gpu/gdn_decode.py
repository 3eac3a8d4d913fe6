#!/usr/bin/env python3
"""Measure the Gated DeltaNet (linear attention) decode kernel: how fast it streams each
sequence's recurrent state, per tensor-parallel shard and batch.

Runs on a machine with an NVIDIA GPU, PyTorch and flash-linear-attention's ``fla-core``
(its Triton kernels; not part of the tests or CI). A decode step of a hybrid model (Qwen3.5,
Qwen3-Next) runs, in each linear-attention layer, the fused recurrent gated-delta-rule kernel
that vLLM and SGLang carry a copy of (same tiling: the [key_dim, value_dim] float32 state cut
into 8-column tiles, one warp each): it reads every scheduled sequence's state, applies one
token's decay, delta update and read-out, and writes the state back. The state is large (a
Qwen3.5-27B sequence holds 48 layers x 48 value heads x 128 x 128 float32 = 151 MB), so at
batch this kernel is a bandwidth term beside the weights and the KV cache.

For each catalog hybrid model's shard (heads divided by TP), batch and tokens per sequence
(1 for decode, more for a speculative verify), it captures ``layers`` calls on separate
state tensors in one CUDA graph (enough layers that the states stream from HBM, not L2) and
times replays with CUDA events. Beside each it times a plain device-to-device copy of the
same state bytes in the same graph shape: the achievable rate for that traffic.

Rows are written to a JSONL file as they are measured, so an interrupted run keeps them.

Units: times in microseconds (``*_us``), bytes in bytes, bandwidth in GB/s (1e9 B/s).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from decode_layers import timed_graph
from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd

ROOT = Path(__file__).resolve().parents[2]
STATE_BYTES = 4  # float32 state, as vLLM keeps Qwen3.5's (mamba_ssm_dtype float32)


def gdn_shape(name: str) -> dict:
    """Linear-attention dimensions of a catalog model (hardware_db/models/NAME.yaml)."""
    doc = yaml.safe_load((ROOT / "hardware_db" / "models" / f"{name}.yaml").read_text())
    la = doc["linear_attention"]
    return {
        "key_heads": la["num_key_heads"],
        "value_heads": la["num_value_heads"],
        "key_dim": la["key_head_dim"],
        "value_dim": la["value_head_dim"],
    }


def decode_inputs(n: int, t: int, h: int, hv: int, k: int, v: int, dev: str) -> dict:
    """One layer's per-token inputs for ``n`` sequences of ``t`` tokens (bf16 q/k/v, beta;
    float32 log-space decay), as the projections and gates hand them to the kernel."""
    bf16 = torch.bfloat16
    return {
        "q": torch.randn(n, t, h, k, device=dev, dtype=bf16),
        "k": torch.randn(n, t, h, k, device=dev, dtype=bf16),
        "v": torch.randn(n, t, hv, v, device=dev, dtype=bf16),
        "g": F.logsigmoid(torch.randn(n, t, hv, device=dev, dtype=torch.float32)),
        "beta": torch.rand(n, t, hv, device=dev, dtype=bf16).sigmoid(),
    }


def measure(
    model: str, tp: int, n: int, t: int, min_stream_bytes: float, max_layers: int, dev: str
) -> dict:
    """Time one (shard, batch, tokens) case; returns a result row."""
    s = gdn_shape(model)
    h, hv = s["key_heads"] // tp, s["value_heads"] // tp
    k, v = s["key_dim"], s["value_dim"]
    state_bytes = n * hv * k * v * STATE_BYTES  # one layer's states for the batch
    layers = max(1, min(max_layers, math.ceil(min_stream_bytes / state_bytes)))
    x = decode_inputs(n, t, h, hv, k, v, dev)
    states = [torch.randn(n, hv, k, v, device=dev, dtype=torch.float32) for _ in range(layers)]

    def step():
        for h0 in states:
            fused_recurrent_gated_delta_rule_fwd(
                q=x["q"],
                k=x["k"],
                v=x["v"],
                g=x["g"],
                beta=x["beta"],
                scale=k**-0.5,
                initial_state=h0,
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
            )

    kernel_us = timed_graph(step, replays=10, repeats=5) / layers
    copies = [torch.empty_like(h0) for h0 in states]

    def copy():
        for src, dst in zip(states, copies, strict=True):
            dst.copy_(src)

    copy_us = timed_graph(copy, replays=10, repeats=5) / layers
    io_bytes = sum(x[name].numel() * x[name].element_size() for name in x)
    io_bytes += n * t * hv * v * 2  # the bf16 output
    moved = 2 * state_bytes + io_bytes  # state read and written once, plus the token I/O
    return {
        "model": model,
        "tp": tp,
        "key_heads": h,
        "value_heads": hv,
        "key_dim": k,
        "value_dim": v,
        "batch": n,
        "tokens_per_sequence": t,
        "layers_in_graph": layers,
        "state_bytes_per_layer": state_bytes,
        "io_bytes_per_layer": io_bytes,
        "kernel_us": round(kernel_us, 3),
        "kernel_gb_s": round(moved / kernel_us / 1e3, 1),
        "copy_us": round(copy_us, 3),
        "copy_gb_s": round(2 * state_bytes / copy_us / 1e3, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSONL file for the rows")
    ap.add_argument(
        "--models",
        default="qwen3.5-27b,qwen3.5-35b-a3b,qwen3.5-397b-a17b",
        help="catalog hybrid models, comma-separated",
    )
    ap.add_argument("--tps", default="1,2,4,8", help="tensor-parallel sizes")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128,256,512")
    ap.add_argument("--tokens", default="1", help="tokens per sequence (1: decode)")
    ap.add_argument("--min-stream-mb", type=float, default=256.0, help="state bytes per graph")
    ap.add_argument("--max-layers", type=int, default=512)
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting cases after")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    start = time.monotonic()
    header = {
        "kind": "header",
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name() if dev == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "host": platform.node(),
    }
    try:
        import fla
        import triton

        header.update(fla=fla.__version__, triton=triton.__version__)
    except ImportError:
        pass
    with args.out.open("a") as f:
        f.write(json.dumps(header) + "\n")
        for model in args.models.split(","):
            s = gdn_shape(model)
            for tp in map(int, args.tps.split(",")):
                if s["key_heads"] % tp or s["value_heads"] % tp:
                    continue
                for t in map(int, args.tokens.split(",")):
                    for n in map(int, args.batches.split(",")):
                        if time.monotonic() - start > args.budget_s:
                            print("time budget spent; stopping", flush=True)
                            return
                        row = measure(
                            model, tp, n, t, args.min_stream_mb * 2**20, args.max_layers, dev
                        )
                        if dev == "cuda":
                            torch.cuda.empty_cache()  # this case's states are gone
                        f.write(json.dumps(row) + "\n")
                        f.flush()
                        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
