"""Benchmark: the probe's own client cost, so we know it is not the bottleneck.

Run:  .venv/bin/python benchmarks/bench_probe.py

Starts the mock streaming server (capsim.probe.mock_server) with a fixed per-token delay
and no batching slowdown, then probes it at 1 and 256 concurrent streams. If the client
kept up, the measured time per output token equals the server's delay; the excess is what
the client adds. Also reports the client's CPU time per streamed chunk.
"""

from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path

from capsim.probe.mock_server import free_port, spawn
from capsim.probe.runner import ProbeConfig, run_probe

TOKEN_DELAY_S = 0.01


def main() -> None:
    port = free_port()
    server = spawn(port, token_delay_s=TOKEN_DELAY_S, per_stream_delay_s=0.0)
    try:
        for c in (1, 256):
            cfg = ProbeConfig(
                url=f"http://127.0.0.1:{port}",
                model="mock-model",
                concurrency=[c],
                requests=c * 2,
                input_tokens=64,
                output_tokens=100,
                warmup=False,
            )
            usage0 = resource.getrusage(resource.RUSAGE_SELF)
            wall0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                summary = run_probe(cfg, Path(tmp) / "bench.json")
            wall = time.perf_counter() - wall0
            usage1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
            m = summary.levels[0].metrics
            chunks = m.output_tokens
            print(
                f"{c:4d} streams: {m.output_tok_s:8,.0f} tok/s received, TPOT "
                f"{m.tpot_ms.mean:6.2f} ms (server {TOKEN_DELAY_S * 1e3:.2f} ms, client adds "
                f"{m.tpot_ms.mean - TOKEN_DELAY_S * 1e3:+.2f} ms), client CPU "
                f"{cpu / chunks * 1e6:6.1f} us/chunk ({cpu / wall:.0%} of one core), "
                f"failed {m.failed}"
            )
    finally:
        server.kill()


if __name__ == "__main__":
    main()
