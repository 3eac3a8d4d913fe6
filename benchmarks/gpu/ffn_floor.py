#!/usr/bin/env python3
"""Measure how much of a decoder layer's fixed GPU time (its kernel floor) its dense FFN's
kernels take, the part an MoE layer replaces with its fused-experts call.

Runs on a machine with an NVIDIA GPU and PyTorch (not part of the tests or CI). With shapes
small enough that every kernel is bound by its fixed cost, not its bytes or FLOPs, it times
decode steps (CUDA-graph replays, fused elementwise kernels as vLLM's torch.compile fuses
them) of ``n`` layers in three variants:

- ``dense``: add-RMSNorm, QKV GEMM, KV-cache write, attention, output GEMM, add-RMSNorm,
  gate/up GEMM, SiLU-and-multiply, down GEMM;
- ``router``: the same with the FFN's three kernels replaced by the router GEMM an MoE
  layer runs before its fused-experts call (hidden x experts);
- ``attention_only``: no FFN kernels at all.

dense - router is what capsim must take off the dense layer's floor for an MoE layer (whose
fused-experts call, timed on its own by vLLM's benchmark_moe.py, brings its own fixed cost).

Units: microseconds per layer.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from decode_layers import timed_graph
from fused_ops import add_rms_norm, silu_mul


class FloorLayers:
    """``n`` tiny decoder layers; ``variant`` picks the FFN's kernels."""

    def __init__(self, n: int, batch: int, variant: str, hidden: int = 256, experts: int = 128):
        dev, dt = ("cuda" if torch.cuda.is_available() else "cpu"), torch.bfloat16
        self.variant, self.batch = variant, batch
        self.h, self.kvh, self.hd = 4, 1, 64
        qkv = (self.h + 2 * self.kvh) * self.hd

        def w(*size):
            return torch.randn(*size, device=dev, dtype=dt) * 0.02

        self.layers = [
            {
                "n1": torch.ones(hidden, device=dev, dtype=dt),
                "n2": torch.ones(hidden, device=dev, dtype=dt),
                "qkv": w(qkv, hidden),
                "o": w(hidden, self.h * self.hd),
                "gate_up": w(2 * hidden, hidden),
                "down": w(hidden, hidden),
                "router": w(experts, hidden),
                "k": w(batch, self.kvh, 17, self.hd),
                "v": w(batch, self.kvh, 17, self.hd),
            }
            for _ in range(n)
        ]
        self.x = torch.randn(batch, hidden, device=dev, dtype=dt)
        self.res = torch.zeros_like(self.x)
        self.out = torch.empty_like(self.x)
        self.logits = torch.empty(batch, experts, device=dev, dtype=dt)

    def step(self) -> None:
        h, res, b = self.x, self.res, self.batch
        g = self.h // self.kvh
        for p in self.layers:
            hn, res = add_rms_norm(h, res, p["n1"], 1e-6, False)
            q, k, v = F.linear(hn, p["qkv"]).split(
                [self.h * self.hd, self.kvh * self.hd, self.kvh * self.hd], -1
            )
            p["k"][:, :, 16] = k.view(b, self.kvh, self.hd)
            p["v"][:, :, 16] = v.view(b, self.kvh, self.hd)
            att = F.scaled_dot_product_attention(q.view(b, self.kvh, g, self.hd), p["k"], p["v"])
            h = F.linear(att.reshape(b, self.h * self.hd), p["o"])
            if self.variant == "attention_only":
                continue
            hn, res = add_rms_norm(h, res, p["n2"], 1e-6, False)
            if self.variant == "router":
                torch.mm(hn, p["router"].t(), out=self.logits)
                h = hn
            else:
                h = F.linear(silu_mul(F.linear(hn, p["gate_up"]), False), p["down"])
        torch.add(h, res, out=self.out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    meta = {"kind": "meta", "device": torch.cuda.get_device_properties(0).name}
    with args.out.open("a") as f:
        f.write(json.dumps(meta) + "\n")
        for batch in (int(b) for b in args.batches.split(",")):
            for variant in ("dense", "router", "attention_only"):
                layers = FloorLayers(args.layers, batch, variant)
                us = timed_graph(layers.step, replays=50) / args.layers
                row = {"kind": "ffn_floor", "variant": variant, "batch": batch, "us_per_layer": us}
                f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
