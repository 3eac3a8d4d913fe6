"""Benchmark: does ``capsim serve`` behave like ``capsim predict`` says, in real time?

Run:  .venv/bin/python benchmarks/bench_serve.py [--speedup 1] [--levels 32,64,128,256]
          [--requests 256] [--input-tokens 512] [--output-tokens 64]

Starts ``capsim serve`` (RTX 3090, Qwen3-Coder-30B-A3B AWQ) in a subprocess, probes it
with ``capsim.probe`` at each level (closed loop), predicts the same workload with
``capsim.predict``, and prints per level the probe's output tok/s, TPOT and TTFT p50
(scaled back by the speedup) against the prediction, and how far the server's loop ran
behind the wall clock. Probe and server share this machine's cores, as a user's agent
framework and the server would.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

import capsim
from capsim.catalog.loader import load_catalog
from capsim.probe.mock_server import free_port

DEPLOYMENT = {"gpu": "rtx3090", "model": "qwen3-coder-30b-a3b", "quant": "awq-int4"}


def serve(port: int, speedup: float) -> subprocess.Popen:
    flags = [f"--{k}={v}" for k, v in DEPLOYMENT.items()]
    command = [sys.executable, "-m", "capsim", "serve", *flags, f"--port={port}"]
    proc = subprocess.Popen(
        [*command, f"--speedup={speedup}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("capsim serve did not start: " + proc.stderr.read().decode()[-2000:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speedup", type=float, default=1.0)
    parser.add_argument("--levels", default="32,64,128,256")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--input-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=64)
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve(port, args.speedup)
    try:
        out = Path(tempfile.mkdtemp()) / "run.json"
        measured = capsim.probe(
            url=url,
            model=DEPLOYMENT["model"],
            concurrency=levels,
            input_tokens=args.input_tokens,
            output_tokens=args.output_tokens,
            requests=args.requests,
            out=out,
        )
        info = httpx.get(url + "/capsim/info").json()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    predicted = capsim.predict(
        **DEPLOYMENT,
        concurrency=levels,
        input_tokens=str(args.input_tokens),
        output_tokens=str(args.output_tokens),
        requests=args.requests,
        catalog=load_catalog(),
    )
    by_level = {int(level.level): level.metrics for level in predicted.levels}
    s = args.speedup
    print(f"capsim serve --speedup {s:g} against capsim predict (measured / predicted - 1)")
    print(f"{'C':>5} {'output tok/s':>22} {'TPOT ms':>22} {'TTFT p50 ms':>24}")
    for level in measured.levels:
        m, p = level.metrics, by_level[level.concurrency]
        tok = m.output_tok_s / s
        tpot = m.tpot_ms.mean * s
        ttft = m.ttft_ms.p50 * s
        print(
            f"{level.concurrency:>5} {tok:9.1f} {tok / p.output_tok_s - 1:+7.1%}"
            f" {'':4}{tpot:9.2f} {tpot / p.tpot_ms.mean - 1:+7.1%}"
            f" {'':4}{ttft:10.1f} {ttft / p.ttft_ms.p50 - 1:+7.1%}"
        )
    lag = info.get("max_lag_ms")
    if lag is not None:
        print(f"the server's loop ran at most {lag:.1f} ms behind the wall clock")


if __name__ == "__main__":
    main()
