"""Benchmark: simulation speed of the engine.

Run:  .venv/bin/python benchmarks/bench_engine.py

1. A sweep of --concurrency 1..64 with 1,000 requests per level (closed workload,
   1,024 in / 512 out) on one RTX 3090 with Qwen3-Coder-30B-A3B AWQ.
2. 100,000 closed-loop agent requests (2,000 agents x 50 turns) on 8 replicas.
Prints wall time, simulated steps and SimPy events.
"""

from __future__ import annotations

import time

from capsim.catalog.loader import load_catalog
from capsim.engine.simulate import PredictConfig, predict


def sweep() -> None:
    cat = load_catalog()
    config = PredictConfig(
        gpu="rtx3090",
        model="qwen3-coder-30b-a3b",
        quant="awq-int4",
        concurrency=list(range(1, 65)),
        requests=1000,
        input_tokens="1024",
        output_tokens="512",
    )
    start = time.perf_counter()
    result = predict(config, cat)
    elapsed = time.perf_counter() - start
    steps = sum(lv.steps for lv in result.levels)
    events = sum(lv.events for lv in result.levels)
    print(f"sweep 1..64 x 1,000 requests: {elapsed:.2f} s, {steps:,} steps in {events:,} events")


def agents() -> None:
    cat = load_catalog()
    config = PredictConfig(
        gpu="h100-sxm",
        model="qwen3-coder-30b-a3b",
        quant="fp8",
        dp=8,
        workload="agents",
        concurrency=[2000],
        turns=50,
        input_tokens="1024",
        output_tokens="uniform:64,256",
        tool_tokens="uniform:32,128",
        think_time="uniform:0.5,2",
        router="prefix_aware",
        max_model_len=32768,
    )
    start = time.perf_counter()
    result = predict(config, cat)
    elapsed = time.perf_counter() - start
    lv = result.levels[0]
    print(
        f"agents 2,000 x 50 turns = {lv.metrics.requests:,} requests on 8 replicas: "
        f"{elapsed:.2f} s, {lv.steps:,} steps in {lv.events:,} events, "
        f"output {lv.metrics.output_tok_s:,.0f} tok/s, prefix hit rate "
        f"{lv.prefix_cache_hit_rate:.0%}"
    )


if __name__ == "__main__":
    sweep()
    agents()
