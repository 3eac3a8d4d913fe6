"""Benchmark: simulation speed of the engine.

Run:  .venv/bin/python benchmarks/bench_engine.py

1. A sweep of --concurrency 1..64 with 1,000 requests per level (closed workload,
   1,024 in / 512 out) on one RTX 3090 with Qwen3-Coder-30B-A3B AWQ.
2. 100,000 closed-loop agent requests (2,000 agents x 50 turns) on 8 replicas.
Prints wall time, CPU time (this process and its workers), steps and SimPy events, and
how many requests were laid down as copies of a repeating period (engine/periodic.py)
rather than simulated. Sweep levels, and replicas that never interact (session-affine
routing), run in parallel processes, so wall time on several cores is below CPU time.
"""

from __future__ import annotations

import resource
import time

from capsim.catalog.loader import load_catalog
from capsim.engine.config import PredictConfig
from capsim.engine.simulate import predict


def cpu_seconds() -> float:
    """CPU time of this process and its finished worker processes, seconds."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    workers = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


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
    start, cpu = time.perf_counter(), cpu_seconds()
    result = predict(config, cat)
    elapsed, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    simulated = [lv for lv in result.levels if lv.service_of is None]
    steps = sum(lv.steps for lv in simulated)
    events = sum(lv.events for lv in simulated)
    repeated = sum(lv.repeated_requests for lv in simulated)
    shared = len(result.levels) - len(simulated)
    base = min((lv.service_of for lv in result.levels if lv.service_of), default=None)
    print(
        f"sweep 1..64 x 1,000 requests: {elapsed:.2f} s ({cpu:.1f} s CPU), "
        f"{len(simulated)} levels simulated ({steps:,} steps in {events:,} events; "
        f"{repeated:,} of their requests laid down as repeated periods), "
        f"{shared} derived from saturated level {base:.0f}"
        if base
        else f"sweep 1..64 x 1,000 requests: {elapsed:.2f} s ({cpu:.1f} s CPU), "
        f"{steps:,} steps in {events:,} events"
    )


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
    start, cpu = time.perf_counter(), cpu_seconds()
    result = predict(config, cat)
    elapsed, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    lv = result.levels[0]
    print(
        f"agents 2,000 x 50 turns = {lv.metrics.requests:,} requests on 8 replicas: "
        f"{elapsed:.2f} s ({cpu:.1f} s CPU), {lv.steps:,} steps in {lv.events:,} events, "
        f"output {lv.metrics.output_tok_s:,.0f} tok/s, prefix hit rate "
        f"{lv.prefix_cache_hit_rate:.0%}"
    )


if __name__ == "__main__":
    sweep()
    agents()
