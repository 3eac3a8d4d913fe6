"""An OpenAI-compatible streaming server that misbehaves on purpose, for the probe's tests.

Requests to ``/v1/completions`` and ``/v1/chat/completions`` are numbered from 1 in the
order they arrive. ``at={n: fault}`` gives request n a fault, ``every={k: fault}`` every
k-th request (the first matching entry wins, ``at`` before ``every``); the rest stream
``max_tokens`` tokens as vLLM does (continuous usage, ``finish_reason`` on the last token,
a usage chunk, ``[DONE]``). The faults (``FAULTS``):

* ``http_500``, ``http_429`` (with ``Retry-After: 2``): an error answer instead of a stream.
* ``slow_headers``: the response headers come after ``stall_s``.
* ``stall``: ``stall_s`` of silence after 3 tokens, then the rest.
* ``slow``: every token takes ``slow_token_s`` (for the total timeout).
* ``malformed``: after 3 tokens, a ``data:`` line that is not JSON, then the rest.
* ``no_done``: every token, finish_reason and usage, but no ``[DONE]`` (a clean end).
* ``truncated``: a clean end after 3 tokens, with neither finish_reason nor ``[DONE]``.
* ``short``: ``finish_reason: stop`` on the 4th token, then ``[DONE]`` (ignore_eos asked
  for all).
* ``abort``: ``finish_reason: abort`` on the 4th token, then ``[DONE]``.
* ``reset``: the connection is reset (TCP RST) after 3 tokens.
* ``error_event``: an ``{"error": ...}`` object after 3 tokens, then ``[DONE]``.
* ``usage_mismatch``: every token, but the final usage claims 5 more than were streamed.
* ``not_sse``: a 200 answer with a JSON body instead of an event stream.
* ``huge_line``: after 3 tokens, 300 kB of a ``data:`` line that never ends, then a close.
* ``endless``: 50 tokens more than ``max_tokens``.
* ``usage_huge``: the 4th token's usage claims 10**30 completion tokens.

``metrics`` picks what ``/metrics`` answers: ``ok`` (vLLM counters), ``garbage`` (only
unparseable lines), ``mixed`` (the counters among unparseable lines) or ``missing`` (404);
``tokenize=False`` leaves out ``/tokenize``, ``tokenize_constant`` answers three tokens for
any prompt; ``models`` picks what ``/v1/models`` answers: ``ok``, ``garbage`` (not JSON),
``list`` (a bare list), ``ids_not_str`` (an id that is a number), ``data_null``, ``huge``
(17 MB of one model list) or ``drip`` (a byte a second, never finishing); ``metrics``
``huge`` answers 9 MB of counters. The server binds 127.0.0.1 only, runs in a
thread of the test process, never sleeps longer than ``MAX_SLEEP_S`` at a time, and its
``close()`` cancels whatever is still running.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from dataclasses import dataclass, field

from capsim.probe.mock_server import count_prompt_tokens

FAULTS = (
    "http_500",
    "http_429",
    "slow_headers",
    "stall",
    "slow",
    "malformed",
    "no_done",
    "truncated",
    "short",
    "abort",
    "reset",
    "error_event",
    "usage_mismatch",
    "not_sse",
    "huge_line",
    "endless",
    "usage_huge",
)
MAX_SLEEP_S = 30.0
BROKEN_AFTER = 3
"""Tokens a stream carries before its fault."""


@dataclass
class Served:
    """One completion request as the server saw it."""

    number: int
    fault: str | None
    prompt: str = ""


@dataclass
class FaultServer:
    at: dict[int, str] = field(default_factory=dict)
    every: dict[int, str] = field(default_factory=dict)
    model: str = "fault-model"
    token_delay_s: float = 0.001
    stall_s: float = 2.0
    slow_token_s: float = 0.1
    metrics: str = "ok"
    tokenize: bool = True
    tokenize_constant: bool = False
    models: str = "ok"
    context: int | None = None  # /tokenize refuses a longer prompt with 400, as vLLM does
    served: list[Served] = field(default_factory=list)

    def __post_init__(self) -> None:
        for fault in [*self.at.values(), *self.every.values()]:
            if fault not in FAULTS:
                raise ValueError(f"unknown fault '{fault}'")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self.generated = 0  # tokens streamed, for /metrics

    # lifecycle -------------------------------------------------------------------------

    def start(self) -> FaultServer:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, "127.0.0.1", 0), self._loop
        ).result(timeout=10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def probe_args(self, *extra: str) -> list[str]:
        """``capsim probe`` at this server's model, one level of concurrency 1 without a
        warm-up, followed by ``extra``."""
        return ["probe", "--url", self.url, "--model", self.model, "-c", "1", "--no-warmup", *extra]

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def fault_for(self, number: int) -> str | None:
        if number in self.at:
            return self.at[number]
        for k, fault in self.every.items():
            if number % k == 0:
                return fault
        return None

    # HTTP ------------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        except asyncio.CancelledError:  # close() ends what is still running
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _one_request(self, reader, writer) -> bool:
        """Answer one request; False when the connection is done."""
        request_line = await reader.readline()
        if not request_line:
            return False
        method, path, _ = request_line.decode().split(" ", 2)
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value.strip())
        body = json.loads(await reader.readexactly(length)) if length else {}
        if method == "GET" and path == "/v1/models":
            await self._models(writer)
        elif method == "POST" and path == "/tokenize" and self.tokenize:
            count = 3 if self.tokenize_constant else count_prompt_tokens(body.get("prompt", ""))
            if self.context is not None and count > self.context:
                message = f"This model's maximum context length is {self.context} tokens."
                await _answer(writer, 400, json.dumps({"error": {"message": message}}))
            else:
                tokens = list(range(count))
                await _answer(writer, 200, json.dumps({"count": count, "tokens": tokens}))
        elif method == "GET" and path == "/metrics" and self.metrics != "missing":
            await _answer(writer, 200, self._metrics_text(), "text/plain")
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            number = len(self.served) + 1
            fault = self.fault_for(number)
            prompt = body.get("prompt")
            self.served.append(Served(number, fault, prompt if isinstance(prompt, str) else ""))
            return await self._complete(writer, body, fault)
        else:
            await _answer(writer, 404, '{"error": "not found"}')
        return True

    async def _models(self, writer) -> None:
        entry = {"id": self.model, "object": "model"}
        bodies = {
            "ok": json.dumps({"object": "list", "data": [entry]}),
            "garbage": "<html>not json</html>",
            "list": json.dumps([entry]),
            "ids_not_str": json.dumps({"data": [{"id": 7}]}),
            "data_null": json.dumps({"data": None}),
            "huge": json.dumps({"data": [entry], "padding": "x" * (17 * 2**20)}),
        }
        if self.models == "drip":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
            writer.write(b"Content-Length: 1000000\r\n\r\n")
            for _ in range(int(MAX_SLEEP_S)):
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(1.0)
            return
        await _answer(writer, 200, bodies[self.models])

    def _metrics_text(self) -> str:
        good = [
            f'vllm:generation_tokens_total{{model_name="{self.model}"}} {self.generated}',
            f'vllm:num_requests_running{{model_name="{self.model}"}} 0',
        ]
        garbage = ["<html>oops</html>", "vllm:broken{model_name= 12", "just some words here"]
        lines = {"ok": good, "garbage": garbage, "mixed": garbage[:1] + good + garbage[1:]}
        if self.metrics == "huge":  # 9 MB of well-formed counters
            return "".join(f'padding_total{{n="{i}"}} {i}\n' for i in range(400_000))
        return "\n".join(lines[self.metrics]) + "\n"

    async def _complete(self, writer, req: dict, fault: str | None) -> bool:
        """Stream (or fail) one completion; False when the connection must close."""
        if fault == "http_500":
            await _answer(writer, 500, '{"error": "internal server error"}')
            return True
        if fault == "http_429":
            await _answer(writer, 429, '{"error": "too many requests"}', retry_after=2)
            return True
        if fault == "not_sse":
            await _answer(writer, 200, '{"choices": [{"text": "all at once"}]}')
            return True
        if fault == "slow_headers":
            await _sleep(self.stall_s)
        chat = "messages" in req
        prompt = req["messages"][-1]["content"] if chat else req.get("prompt")
        prompt_tokens = count_prompt_tokens(prompt)
        n = int(req.get("max_tokens") or 16)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
        )

        async def event(payload: str) -> None:
            data = f"data: {payload}\n\n".encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()

        def chunk(i: int, reason: str | None, completion: int) -> str:
            text = {"delta": {"content": " tok"}} if chat else {"text": " tok"}
            return json.dumps(
                {
                    "object": "chunk",
                    "model": self.model,
                    "choices": [{"index": 0, **text, "finish_reason": reason}],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion},
                }
            )

        async def end(done: bool = True) -> bool:
            if done:
                await event("[DONE]")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return True

        delay = self.slow_token_s if fault == "slow" else self.token_delay_s
        if fault == "endless":
            n += 50
        for i in range(n):
            await _sleep(delay)
            if i == BROKEN_AFTER:
                if fault == "stall":
                    await _sleep(self.stall_s)
                elif fault == "malformed":
                    await event('{"object": "chunk", "choices": [{"text": " to')
                elif fault == "truncated":
                    return await end(done=False)
                elif fault in ("short", "abort"):
                    self.generated += 1
                    await event(chunk(i, "stop" if fault == "short" else "abort", i + 1))
                    return await end()
                elif fault == "error_event":
                    await event(json.dumps({"error": {"message": "engine died", "code": 500}}))
                    return await end()
                elif fault == "huge_line":
                    data = b"data: " + b"x" * 300_000
                    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    await writer.drain()
                    return await end(done=False)
                elif fault == "usage_huge":
                    await event(chunk(i, None, 10**30))
                    return await end()
                elif fault == "reset":
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return False
            self.generated += 1
            await event(chunk(i, "length" if i == n - 1 else None, i + 1))
        claimed = n + 5 if fault == "usage_mismatch" else n
        final = {"object": "chunk", "model": self.model, "choices": []}
        final["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": claimed}
        await event(json.dumps(final))
        return await end(done=fault != "no_done")


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(min(seconds, MAX_SLEEP_S))


async def _answer(
    writer: asyncio.StreamWriter,
    status: int,
    body: str,
    content_type: str = "application/json",
    retry_after: int | None = None,
) -> None:
    reason = {
        200: "OK",
        400: "Bad Request",
        404: "Not Found",
        429: "Too Many Requests",
        500: "Server Error",
    }
    extra = f"Retry-After: {retry_after}\r\n" if retry_after is not None else ""
    data = body.encode()
    writer.write(
        f"HTTP/1.1 {status} {reason[status]}\r\nContent-Type: {content_type}\r\n{extra}"
        f"Content-Length: {len(data)}\r\nConnection: keep-alive\r\n\r\n".encode()
        + data
    )
    await writer.drain()
