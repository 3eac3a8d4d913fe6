"""A small OpenAI-compatible streaming server for tests and for timing the probe itself.

It is a test double, not a model: ``/v1/completions`` and ``/v1/chat/completions`` stream
``max_tokens`` tokens (the word ``tok``), one chunk per token, with vLLM-style
``continuous_usage_stats``, ``finish_reason`` on the last token and ``[DONE]``; each token
takes ``token_delay_s + per_stream_delay_s x active streams``, so aggregate throughput
rises and then flattens with concurrency like a batching server's. It also answers
``/v1/models``, ``/tokenize`` (one token per word) and ``/metrics`` with vLLM-named
counters and gauges. Standard library only (asyncio streams).

Run it alone with ``python -m capsim.probe.mock_server --port 8123``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field


@dataclass
class MockState:
    model: str = "mock-model"
    max_model_len: int = 4096
    token_delay_s: float = 0.002
    per_stream_delay_s: float = 0.0005
    active: int = 0
    prompt_tokens_total: float = 0.0
    generation_tokens_total: float = 0.0
    requests_total: float = 0.0
    peak_active: int = 0
    log: list[str] = field(default_factory=list)


def count_prompt_tokens(prompt) -> int:
    if isinstance(prompt, list):
        return len(prompt)
    return len(str(prompt).split())


async def _respond(
    writer: asyncio.StreamWriter, status: str, body: bytes, content_type: str = "application/json"
) -> None:
    writer.write(
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n".encode()
        + body
    )
    await writer.drain()


async def _stream(writer: asyncio.StreamWriter, state: MockState, req: dict, chat: bool):
    prompt = req.get("messages", [{}])[-1].get("content") if chat else req.get("prompt")
    prompt_tokens = count_prompt_tokens(prompt)
    n = int(req.get("max_tokens") or 16)
    state.active += 1
    state.peak_active = max(state.peak_active, state.active)
    state.requests_total += 1
    state.prompt_tokens_total += prompt_tokens
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
    )

    def chunk(payload: str) -> bytes:
        data = payload.encode()
        return f"{len(data):x}\r\n".encode() + data + b"\r\n"

    try:
        await asyncio.sleep(state.token_delay_s * 2)  # "prefill"
        for i in range(n):
            await asyncio.sleep(state.token_delay_s + state.per_stream_delay_s * state.active)
            state.generation_tokens_total += 1
            reason = "length" if i == n - 1 else None  # as vLLM: on the last token
            if chat:
                choice = {"index": 0, "delta": {"content": " tok"}, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": " tok", "finish_reason": reason}
            body = {
                "id": "x",
                "object": "chunk",
                "model": state.model,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": i + 1,
                    "total_tokens": prompt_tokens + i + 1,
                },
            }
            writer.write(chunk(f"data: {json.dumps(body)}\n\n"))
            await writer.drain()
        final = {
            "id": "x",
            "object": "chunk",
            "model": state.model,
            "choices": [],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": n,
                "total_tokens": prompt_tokens + n,
            },
        }
        writer.write(
            chunk(f"data: {json.dumps(final)}\n\n") + chunk("data: [DONE]\n\n") + b"0\r\n\r\n"
        )
        await writer.drain()
    finally:
        state.active -= 1


def _metrics_text(state: MockState) -> str:
    return "\n".join(
        [
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{model_name="{state.model}"}} {state.active}',
            f'vllm:num_requests_waiting{{model_name="{state.model}"}} 0',
            f'vllm:kv_cache_usage_perc{{model_name="{state.model}"}} {min(state.active / 64, 1)}',
            f'vllm:prompt_tokens_total{{model_name="{state.model}"}} {state.prompt_tokens_total}',
            f'vllm:generation_tokens_total{{model_name="{state.model}"}} '
            f"{state.generation_tokens_total}",
            f'vllm:num_preemptions_total{{model_name="{state.model}"}} 0',
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="1024"} 1',
            "",
        ]
    )


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: MockState):
    try:
        while True:
            request_line = await reader.readline()
            if not request_line:
                break
            method, path, _ = request_line.decode().split(" ", 2)
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value.strip())
            body = json.loads(await reader.readexactly(length)) if length else {}
            if method == "GET" and path == "/v1/models":
                data = {
                    "object": "list",
                    "data": [
                        {
                            "id": state.model,
                            "object": "model",
                            "owned_by": "mock",
                            "max_model_len": state.max_model_len,
                        }
                    ],
                }
                await _respond(writer, "200 OK", json.dumps(data).encode())
            elif method == "POST" and path == "/tokenize":
                tokens = list(range(count_prompt_tokens(body.get("prompt", ""))))
                data = {
                    "count": len(tokens),
                    "tokens": tokens,
                    "max_model_len": state.max_model_len,
                }
                await _respond(writer, "200 OK", json.dumps(data).encode())
            elif method == "GET" and path == "/metrics":
                await _respond(writer, "200 OK", _metrics_text(state).encode(), "text/plain")
            elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
                await _stream(writer, state, body, chat=path.endswith("chat/completions"))
            else:
                await _respond(writer, "404 Not Found", b'{"error": "not found"}')
    except (ConnectionError, asyncio.IncompleteReadError, ValueError):
        pass
    finally:
        writer.close()


async def serve(host: str, port: int, state: MockState) -> asyncio.base_events.Server:
    return await asyncio.start_server(lambda r, w: handle(r, w, state), host, port)


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(port: int, token_delay_s: float = 0.002, per_stream_delay_s: float = 0.0005):
    """Start the mock server in a subprocess and wait until it accepts connections."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "capsim.probe.mock_server",
            "--port",
            str(port),
            "--token-delay",
            str(token_delay_s),
            "--per-stream-delay",
            str(per_stream_delay_s),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the mock server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--token-delay", type=float, default=0.002)
    parser.add_argument("--per-stream-delay", type=float, default=0.0005)
    args = parser.parse_args()
    state = MockState(token_delay_s=args.token_delay, per_stream_delay_s=args.per_stream_delay)

    async def run():
        server = await serve(args.host, args.port, state)
        async with server:
            await server.serve_forever()

    asyncio.run(run())


if __name__ == "__main__":
    main()
