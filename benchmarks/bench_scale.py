"""Benchmark: simulation speed and peak memory as the request count grows.

Run:  .venv/bin/python benchmarks/bench_scale.py [--sizes 1e4,1e5,1e6,1e7] [--concurrency 16,64]

Each size is one ``capsim predict --json`` of a single closed-loop level (RTX 3090,
Qwen3-Coder-30B-A3B AWQ, 1,024 in / 512 out by default) in a process of its own, so its peak RSS
is its own (os.wait4). Prints wall time (the whole command: start-up, the shipped
profile's band reruns, the simulation), requests per second of wall time and peak RSS.
Up to request_log.REQUEST_BUFFER requests a level is exact; beyond it requests are
folded into streaming accumulators and memory stops growing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(concurrency: int, requests: int, gpu: str, model: str, output_tokens: str) -> dict:
    """One predict in a child process: wall seconds, peak RSS (MiB) and its metrics."""
    command = [
        sys.executable,
        "-m",
        "capsim",
        "predict",
        "--gpu",
        gpu,
        "--model",
        model,
        "--concurrency",
        str(concurrency),
        "--requests",
        str(requests),
        "--output-tokens",
        output_tokens,
        "--json",
    ]
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        child = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode:
            raise SystemExit(f"{' '.join(command)} exited with {child.returncode}")
        out.seek(0)
        point = json.load(out)["results"][0]["points"][0]
    return {"wall_s": wall, "rss_mib": usage.ru_maxrss / 1024, "point": point}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1e4,1e5,1e6,1e7", help="request counts")
    parser.add_argument("--concurrency", default="16", help="levels, comma-separated")
    parser.add_argument("--gpu", default="rtx3090")
    parser.add_argument("--model", default="qwen3-coder-30b-a3b")
    parser.add_argument(
        "--output-tokens",
        default="512",
        help="output lengths: 512 (equal requests: a closed loop's repeating periods are "
        "laid down, engine/periodic.py) or e.g. uniform:384,640 (every request simulated)",
    )
    args = parser.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    print(
        f"{'C':>4} {'requests':>12} {'wall s':>9} {'requests/s':>11} {'peak RSS MiB':>13} "
        f"{'out tok/s':>10} {'TTFT p90 ms':>12} {'ITL p99 ms':>11}",
        flush=True,
    )
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        for requests in sizes:
            r = run(concurrency, requests, args.gpu, args.model, args.output_tokens)
            p = r["point"]
            print(
                f"{concurrency:>4} {requests:>12,} {r['wall_s']:>9.1f} "
                f"{requests / r['wall_s']:>11,.0f} {r['rss_mib']:>13,.0f} "
                f"{p['output_tok_s']:>10,.1f} {p['ttft_ms']['p90']:>12,.1f} "
                f"{p['itl_ms']['p99']:>11,.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
