"""Benchmark: `capsim import vllm-bench` on large detailed results (issue 47: a large file
hung past 5 minutes and drove the process past a gigabyte).

    .venv/bin/python benchmarks/bench_import.py

Writes two synthetic `vllm bench serve --save-detailed` results to a temporary folder
(600,000 one-token requests, 20 MB; 1,000 requests of 2,000 tokens, 17 MB), imports each in
a subprocess and prints wall time and peak resident memory. On the 2-core development
machine, 2026-11-29: 28.7 s and 3.1 s, peak 149 MB. Before the importer streamed its
records, summed each request's gaps once (not once per token: quadratic in the output
length) and synced the log once at the end (not after every record), the same 600,000
requests with generated texts (37 MB) took 105 s and 1.2 GB.
"""

from __future__ import annotations

import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CAPSIM = [sys.executable, "-m", "capsim"]


def result(requests: int, tokens: int) -> dict:
    rng = random.Random(0)
    return {
        "backend": "vllm",
        "model_id": "m",
        "num_prompts": requests,
        "max_concurrency": 8,
        "duration": 100.0,
        "completed": requests,
        "total_input_tokens": requests * 10,
        "total_output_tokens": requests * tokens,
        # as vllm bench computes them over the 100 s duration (capsim cross-checks them)
        "request_throughput": requests / 100.0,
        "output_throughput": requests * tokens / 100.0,
        "input_lens": [10] * requests,
        "output_lens": [tokens] * requests,
        "ttfts": [rng.random() for _ in range(requests)],
        "itls": [
            [round(rng.random() * 0.02, 5) for _ in range(tokens - 1)] for _ in range(requests)
        ],
        "errors": [""] * requests,
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for requests, tokens in ((600_000, 1), (1_000, 2_000)):
            path = Path(tmp) / f"bench-{requests}x{tokens}.json"
            path.write_text(json.dumps(result(requests, tokens)))
            out = Path(tmp) / f"run-{requests}.json"
            start = time.perf_counter()
            subprocess.run(
                [*CAPSIM, "import", "vllm-bench", str(path), "--out", str(out), "--force"],
                check=True,
                capture_output=True,
            )
            wall = time.perf_counter() - start
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            size = path.stat().st_size / 2**20
            print(
                f"{requests:,} requests x {tokens:,} tokens ({size:.0f} MB): {wall:.1f} s, "
                f"peak {peak:.0f} MB (largest child so far)"
            )


if __name__ == "__main__":
    main()
