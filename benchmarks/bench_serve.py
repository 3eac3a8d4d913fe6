"""Benchmark: does ``capsim serve`` behave like ``capsim predict`` says, in real time?

Run:  .venv/bin/python benchmarks/bench_serve.py [--speedup 1] [--levels 32,64,128,256]
          [--requests 256] [--input-tokens 512] [--output-tokens 64] [--hostile 32]

Starts ``capsim serve`` (RTX 3090, Qwen3-Coder-30B-A3B AWQ) in a subprocess, probes it
with ``capsim.probe`` at each level (closed loop), predicts the same workload with
``capsim.predict``, and prints per level the probe's output tok/s, TPOT and TTFT p50
(scaled back by the speedup) against the prediction, and how far the server's loop ran
behind the wall clock. Probe and server share this machine's cores, as a user's agent
framework and the server would.

``--hostile N``: meanwhile N clients send malformed requests (bad JSON, wrong types, unknown
model, negative max_tokens, deep nesting, a wrong content type...), each ``--hostile-pause``
seconds apart (default none), and their status codes are counted: the valid clients'
figures, against a run without them, show whether the bad requests disturb the simulated
timing (issue 47), and no answer may be 5xx. The bad clients run in a process of their own.
Measured 2026-11-29 on this 2-core host (server, probe and bad clients sharing it),
--levels 64,256 --requests 512: no 5xx in any run; C=256 within 1% of the prediction on
every figure with and without bad clients; output tok/s within 1.5% throughout; C=64's TTFT
p50 moved +2% and +48% in two runs alone, +44% and +79% beside 32 and 130 bad requests a
second (16 clients pausing 0.5 s and 0.1 s): the noise of this host is as large as the
effect, so the 5% the issue asks for cannot be shown here.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing
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


JSON = "application/json"
MALFORMED: list[tuple[str, bytes, str]] = [
    ("/v1/completions", b"{", JSON),
    ("/v1/completions", b"[]", JSON),
    ("/v1/completions", b'{"model": 5, "prompt": "a"}', JSON),
    ("/v1/completions", b'{"model": "nope", "prompt": "a", "max_tokens": 4}', JSON),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": -3}', JSON),
    ("/v1/completions", b'{"prompt": "a", "stream_options": "x"}', JSON),
    ("/v1/completions", b'{"prompt": [-1, 2], "max_tokens": 1}', JSON),
    ("/v1/completions", b'{"prompt": "a"}', "text/plain"),
    ("/v1/chat/completions", b'{"messages": "hi"}', JSON),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', JSON),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [1]}]}', JSON),
    ("/v1/chat/completions", b'{"messages": [{"role": "user"}], "n": 3}', JSON),
    ("/v1/chat/completions", b"[" * 10_000 + b"]" * 10_000, JSON),
]
"""Malformed requests of distinct kinds (path, body, content type), sent in turn."""


def hostile_clients(url: str, clients: int, pause_s: float, stop, codes) -> None:
    """``clients`` clients sending MALFORMED requests in turn (each waiting ``pause_s``
    between its requests) until ``stop`` (a multiprocessing Event) is set; the status codes
    they get are counted into ``codes`` (a managed dict). Run in a process of its own, so
    its work never holds up the probe's event loop in this one (as a thread it did: the
    GIL delayed the valid clients' reads and their measured TTFT)."""
    counts: collections.Counter = collections.Counter()

    async def one(client: httpx.AsyncClient, start: int) -> None:
        i = start
        while not stop.is_set():
            path, body, kind = MALFORMED[i % len(MALFORMED)]
            i += 1
            try:
                r = await client.post(url + path, content=body, headers={"content-type": kind})
                counts[r.status_code] += 1
            except httpx.HTTPError as exc:
                counts[type(exc).__name__] += 1
            if pause_s:
                await asyncio.sleep(pause_s)

    async def run() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            await asyncio.gather(*(one(client, k) for k in range(clients)))

    asyncio.run(run())
    codes.update(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speedup", type=float, default=1.0)
    parser.add_argument("--levels", default="32,64,128,256")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--input-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--hostile", type=int, default=0, help="clients sending bad requests")
    parser.add_argument(
        "--hostile-pause", type=float, default=0.0, help="s each bad client waits between sends"
    )
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve(port, args.speedup)
    manager = multiprocessing.Manager() if args.hostile else None
    stop = manager.Event() if manager else None
    codes = manager.dict() if manager else None
    worker = None
    if args.hostile:
        worker = multiprocessing.Process(
            target=hostile_clients, args=(url, args.hostile, args.hostile_pause, stop, codes)
        )
        worker.start()
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
        if worker is not None:
            stop.set()
            worker.join(timeout=60)
            codes = dict(codes)
            manager.shutdown()
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
    if codes is not None:
        bad = sum(n for code, n in codes.items() if not (isinstance(code, int) and code < 500))
        print(f"{args.hostile} clients sent malformed requests meanwhile: {dict(codes)}")
        print("no 5xx and no transport error" if not bad else f"{bad} answers were 5xx or errors")
    lag = info.get("max_lag_ms")
    if lag is not None:
        print(f"the server's loop ran at most {lag:.1f} ms behind the wall clock")


if __name__ == "__main__":
    main()
