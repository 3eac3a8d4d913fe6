"""Benchmark: how many configurations the planner simulates per second.

Run:  .venv/bin/python benchmarks/bench_planner.py [N]

Enumerates the issue's example search space (50 agents, 1,024 in / 512 out) over every
GPU in the catalog, counts 1, 2, 4, 8 and two models, takes the first N configurations
that fit (default 1,000) and simulates them in local processes, one per core. Prints
wall time and configurations per second.
"""

from __future__ import annotations

import os
import sys
import time

from capsim.catalog.loader import load_catalog
from capsim.planner.search import PlanRequest, enumerate_candidates, evaluate


def main(n: int) -> None:
    cat = load_catalog()
    req = PlanRequest(
        models=("qwen3-coder-30b-a3b", "qwen3.5-27b", "qwen2.5-coder-32b"),
        agents=50,
        input_tokens="1024",
        output_tokens="512",
        min_agent_tok_s=30,
        max_ttft_p90_s=5,
        gpu_counts=(1, 2, 4, 8),
    )
    start = time.perf_counter()
    candidates, pruned = enumerate_candidates(req, cat)
    enumerated = time.perf_counter() - start
    candidates = candidates[:n]
    start = time.perf_counter()
    items = evaluate(candidates, req, cat)
    wall = time.perf_counter() - start
    print(
        f"enumerated {len(candidates)} configurations ({pruned} pruned) in {enumerated:.2f} s; "
        f"simulated {len(items)} in {wall:.1f} s on {os.cpu_count()} cores "
        f"= {len(items) / wall:.1f} configurations/s"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
