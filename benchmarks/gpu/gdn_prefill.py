#!/usr/bin/env python3
"""Time the chunked Gated DeltaNet prefill kernels (flash-linear-attention's Triton chain,
which vLLM and SGLang run by default) for one prompt, per tensor-parallel shard.

Runs on a machine with an NVIDIA GPU, PyTorch and ``fla-core`` (not part of the tests or
CI). For each catalog hybrid model's shard and prompt length it calls
``chunk_gated_delta_rule`` on one sequence (bf16 q/k/v, in-kernel q/k L2 norm as the engines
call it, a float32 final state) and reports the median of timed calls after warm-up (the
first calls autotune), twice: wall time between CUDA events around one call (which, for
short prompts, is the Python launch cost of the chain's kernels) and the sum of its kernels'
device times from the PyTorch profiler (what the GPU spends, as inside a CUDA graph). FLOPs
are counted as capsim counts them: 6 x key_dim x value_dim per value head and token (state
update and read-out).

Rows are written to a JSONL file as they are measured. Units: microseconds, TFLOP/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from fla.ops.gated_delta_rule import chunk_gated_delta_rule
from gdn_decode import gdn_shape


def time_prompt(model: str, tp: int, tokens: int, repeats: int = 10) -> dict:
    """Median microseconds of one prompt's chunked GDN forward on one shard."""
    s = gdn_shape(model)
    h, hv = s["key_heads"] // tp, s["value_heads"] // tp
    k, v = s["key_dim"], s["value_dim"]
    bf16, dev = torch.bfloat16, "cuda"
    q = torch.randn(1, tokens, h, k, device=dev, dtype=bf16)
    key = torch.randn(1, tokens, h, k, device=dev, dtype=bf16)
    val = torch.randn(1, tokens, hv, v, device=dev, dtype=bf16)
    g = F.logsigmoid(torch.randn(1, tokens, hv, device=dev, dtype=torch.float32))
    beta = torch.rand(1, tokens, hv, device=dev, dtype=bf16).sigmoid()
    cu = torch.tensor([0, tokens], device=dev, dtype=torch.long)

    def call():
        chunk_gated_delta_rule(
            q,
            key,
            val,
            g,
            beta,
            scale=k**-0.5,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu,
        )

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    us = statistics.median(samples)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            call()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_us = sum(e.time_range.elapsed_us() for e in kernels) / repeats
    flops = 6.0 * hv * k * v * tokens
    return {
        "model": model,
        "tp": tp,
        "key_heads": h,
        "value_heads": hv,
        "tokens": tokens,
        "wall_us": round(us, 2),
        "kernel_us": round(kernel_us, 2),
        "kernels_per_call": len(kernels) / repeats,
        "tflops": round(flops / kernel_us / 1e6, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default="qwen3.5-397b-a17b,qwen3.5-27b")
    ap.add_argument("--tps", default="8,4")
    ap.add_argument("--tokens", default="2048,8192,32768")
    args = ap.parse_args()
    t0 = time.monotonic()
    with args.out.open("a") as f:
        for model in args.models.split(","):
            for tp in map(int, args.tps.split(",")):
                for n in map(int, args.tokens.split(",")):
                    row = time_prompt(model, tp, n)
                    row["elapsed_s"] = round(time.monotonic() - t0, 1)
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
