"""Benchmark: how long one step-time evaluation takes (the engine calls it once per step).

Run:  .venv/bin/python benchmarks/bench_step.py
Prints microseconds per StepModel.step call for batches of 1 to 256 decode sequences and
for a mixed decode + prefill-chunk step, on a dense, an MoE and a hybrid model.
"""

from __future__ import annotations

import time

import numpy as np

from capsim.catalog.loader import load_catalog
from capsim.physics.deployment import Deployment
from capsim.physics.step import build_step_model

CASES = [
    ("rtx3090", "qwen3-coder-30b-a3b", Deployment(quant="awq-int4")),
    ("rtx3090", "qwen2.5-coder-32b", Deployment(quant="awq-int4")),
    ("rtx3090", "qwen3.5-27b", Deployment(tp=4, quant="awq-int4", kv_dtype="fp8")),
    ("b200", "qwen3.5-27b", Deployment(quant="fp8", kv_dtype="fp8")),
]


def time_step(sm, new: np.ndarray, ctx: np.ndarray, repeat: int = 2000) -> float:
    """Mean microseconds per sm.step(new, ctx) call."""
    sm.step(new, ctx)
    start = time.perf_counter()
    for _ in range(repeat):
        sm.step(new, ctx)
    return (time.perf_counter() - start) / repeat * 1e6


def main() -> None:
    cat = load_catalog()
    print(f"{'gpu':10s} {'model':22s} {'batch':>6s} {'us/step':>9s}")
    for gpu, model, dep in CASES:
        sm = build_step_model(cat, gpu, model, dep)
        for batch in (1, 8, 64, 256):
            new = np.ones(batch, dtype=int)
            ctx = np.full(batch, 2048)
            us = time_step(sm, new, ctx)
            print(f"{gpu:10s} {model:22s} {batch:6d} {us:9.1f}")
        mixed_new = np.append(np.ones(63, dtype=int), 1024)
        mixed_ctx = np.append(np.full(63, 2048), 0)
        us = time_step(sm, mixed_new, mixed_ctx)
        print(f"{gpu:10s} {model:22s} {'63+pf':>6s} {us:9.1f}")


if __name__ == "__main__":
    main()
