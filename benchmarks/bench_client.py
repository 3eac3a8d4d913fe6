"""Measure the benchmark client's own cost per streamed chunk: is `vllm bench serve` a bottleneck?

A closed loop's next request is sent when the client has read the last chunk of the one
before, and `vllm bench serve` reads every stream in one asyncio process. If that process
spent long on each chunk, a second wave's requests would reach the server late and their
TTFT (clocked by the client) would include the client's backlog (issue 45, docs/dev/waves.md).
This script starts a trivial OpenAI-style server that streams each completion's chunks as
fast as the socket takes them (one core), runs vLLM's own benchmark client against it (the
other core) at two output lengths, and reads the client's CPU time (getrusage of the child)
and the benchmark's duration: the differences over the extra chunks are the client's time
per chunk.

Run (needs a vLLM install for its client, e.g. the CPU venv the live tests use):

    .venv/bin/python benchmarks/bench_client.py \\
        --vllm-python ~/.cache/capsim/vllm-cpu-venv/bin/python \\
        --tokenizer ~/.cache/capsim/tiny-models/tiny-qwen3 --streams 256

Measured 2026-12-02 on this 2-core 2.5 GHz virtual machine (vLLM 0.32.0's client, 512
requests, 16-token prompts): 256 streams, 256 against 1,024 tokens a request: 8.8 us a chunk
of wall time and 8.4 us of CPU; 32 streams, 32 against 256 tokens: 7.7 and 5.7 us. A round
over 256 streams is about 2.2 ms, against a decode step of about 33 ms for Llama-3.1-8B on
an H200 at 256 sequences: the client is not what holds a second wave back, and capsim has
no client term.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHUNK = (
    b'data: {"id":"cmpl-1","object":"text_completion","created":0,"model":"m",'
    b'"choices":[{"index":0,"text":" x","logprobs":null,"finish_reason":null}]}\n\n'
)


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            method = lines[0].split(" ", 1)[0]
            sizes = [h.split(":")[1] for h in lines[1:] if h.lower().startswith("content-length")]
            length = int(sizes[0]) if sizes else 0
            body = await reader.readexactly(length) if length else b""
            if method == "GET":
                payload = json.dumps({"object": "list", "data": [{"id": "m"}]}).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
                )
                await writer.drain()
                continue
            tokens = int(json.loads(body).get("max_tokens", 16))
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            for _ in range(tokens):
                writer.write(_chunked(CHUNK))
                await writer.drain()
                await asyncio.sleep(0)
            usage = {"prompt_tokens": 16, "completion_tokens": tokens, "total_tokens": tokens + 16}
            last = {
                "id": "cmpl-1",
                "object": "text_completion",
                "model": "m",
                "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                "usage": usage,
            }
            writer.write(_chunked(b"data: " + json.dumps(last).encode() + b"\n\n"))
            writer.write(_chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve(port: int) -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


CLIENT = """
import argparse, sys
from vllm.benchmarks.serve import add_cli_args, main
parser = argparse.ArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def run_client(args, port: int, tokens: int) -> tuple[float, float]:
    """One benchmark run: (the client's CPU seconds, the benchmark's duration in s)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(CLIENT)
    command = [
        "taskset", "-c", "1", args.vllm_python, f.name,
        "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}",
        "--endpoint", "/v1/completions", "--model", "m", "--tokenizer", args.tokenizer,
        "--dataset-name", "random", "--random-input-len", "16",
        "--random-output-len", str(tokens), "--ignore-eos",
        "--max-concurrency", str(args.streams), "--num-prompts", str(args.requests),
        "--disable-tqdm",
    ]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(command, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    os.unlink(f.name)
    found = re.search(r"Benchmark duration \(s\):\s+([\d.]+)", out.stdout)
    if not found:
        sys.exit(f"the client did not finish:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, float(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-python", required=True, help="a Python with vLLM installed")
    parser.add_argument("--tokenizer", required=True, type=str)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--short", type=int, default=256, help="tokens a request, short run")
    parser.add_argument("--long", type=int, default=1024, help="tokens a request, long run")
    parser.add_argument("--port", type=int, default=8399)
    args = parser.parse_args()
    if not Path(args.vllm_python).exists():
        sys.exit(f"--vllm-python {args.vllm_python}: no such file")
    here = Path(__file__).resolve()
    serve = (
        f"import asyncio, runpy; asyncio.run(runpy.run_path({str(here)!r})['_serve']({args.port}))"
    )
    server = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", serve])
    try:
        time.sleep(1.0)
        short = run_client(args, args.port, args.short)
        long = run_client(args, args.port, args.long)
    finally:
        server.terminate()
    chunks = args.requests * (args.long - args.short)
    print(
        f"{args.streams} streams, {args.short} against {args.long} tokens a request: "
        f"{(long[1] - short[1]) / chunks * 1e6:.1f} us a chunk of wall time, "
        f"{(long[0] - short[0]) / chunks * 1e6:.1f} us of the client's CPU; a round over "
        f"the streams {(long[1] - short[1]) / chunks * args.streams * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()
