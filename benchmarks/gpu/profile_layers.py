#!/usr/bin/env python3
"""Split the GPU time of the benchmark's decoder layers by kernel (torch profiler).

Runs on a machine with an NVIDIA GPU and PyTorch (not part of the tests or CI). For a few
prefill (``prefill_layers.PrefillLayers``) and decode (``decode_layers.Layers``) shapes it
runs the layers eagerly under ``torch.profiler`` and writes, per configuration, every CUDA
kernel's name, calls and total time per layer, and the time in each class of kernel: GEMMs,
attention and the rest (elementwise: norms, residual adds, activation, casts, copies). That
shows how much of a layer the elementwise kernels take and at what bandwidth, which the
whole-layer timings cannot.

Units: microseconds per layer (``*_us``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from decode_layers import Layers, load_shape
from prefill_layers import PrefillLayers
from torch.profiler import ProfilerActivity, profile

GEMM_MARKERS = ("gemm", "nvjet", "xmma", "cutlass", "sm90", "matmul", "cublas")
ATTENTION_MARKERS = ("flash", "cudnn", "fmha", "attention", "sdpa")


def kernel_class(name: str) -> str:
    """gemm, attention or elementwise, from a kernel's name."""
    low = name.lower()
    if any(m in low for m in ATTENTION_MARKERS):
        return "attention"
    if any(m in low for m in GEMM_MARKERS):
        return "gemm"
    return "elementwise"


def profile_step(step, layers: int, runs: int = 3) -> dict:
    """Kernels of ``runs`` eager steps: per-layer time by kernel and by class (us)."""
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            step()
        torch.cuda.synchronize()
    kernels = {}
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if not us or ev.key.startswith("cuda") or ev.key.startswith("Memcpy"):
            continue
        kernels[ev.key] = {
            "calls_per_layer": ev.count / runs / layers,
            "us_per_layer": us / runs / layers,
            "class": kernel_class(ev.key),
        }
    by_class: dict[str, float] = {}
    for k in kernels.values():
        by_class[k["class"]] = by_class.get(k["class"], 0.0) + k["us_per_layer"]
    return {"by_class_us_per_layer": by_class, "kernels": kernels}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--prefill",
        default="llama-3.1-8b:1:16384,llama-3.1-8b:8:16384,llama-3.3-70b:8:8192,"
        "llama-3.3-70b:1:2048",
        help="model:tp:tokens prefill configurations",
    )
    ap.add_argument(
        "--decode",
        default="llama-3.1-8b:1:256,llama-3.1-8b:8:256,llama-3.3-70b:8:64",
        help="model:tp:batch decode configurations (context 16)",
    )
    ap.add_argument("--formats", default="bf16,fp8")
    ap.add_argument("--fused", action="store_true", help="vLLM's fused elementwise kernels")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        for kind, specs in (("prefill", args.prefill), ("decode", args.decode)):
            for spec in filter(None, specs.split(",")):
                name, tp, size = spec.split(":")
                shape = load_shape(name)
                for fmt in args.formats.split(","):
                    n = 2
                    if kind == "prefill":
                        obj = PrefillLayers(
                            shape, int(tp), n, int(size), fmt, "cudnn", "cuda", args.fused
                        )
                    else:
                        obj = Layers(shape, int(tp), n, int(size), 16, fmt, args.fused)
                    row = {
                        "kind": f"{kind}_profile",
                        "model": name,
                        "tp_shard": int(tp),
                        "weights": fmt,
                        "elementwise": "fused" if args.fused else "eager",
                        "tokens": int(size),
                        "layers_built": n,
                        **profile_step(obj.step, n),
                    }
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    print(json.dumps({k: v for k, v in row.items() if k != "kernels"}))
                    del obj
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
