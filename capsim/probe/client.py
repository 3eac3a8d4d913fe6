"""Streaming requests against an OpenAI-compatible server, timed chunk by chunk.

Each request streams (``stream: true``) with ``stream_options.include_usage`` and
``continuous_usage_stats`` (vLLM), so every chunk carries the cumulative completion tokens
and a chunk that carries several tokens (speculative decoding) counts them all. Servers
without continuous usage count one token per chunk, and the final usage gives the exact
total. The API key comes from an environment variable and is never printed or stored.

Every request ends with an outcome (capsim.metrics.OUTCOMES). It is ``ok`` only when the
stream ended with ``[DONE]`` after a ``finish_reason``, every event parsed, the usage agrees
with the tokens streamed, and an ``ignore_eos`` request got every token it asked for;
anything else is recorded as the fault it is, with the chunks measured before it.
The event stream is decoded by httpx-sse (the SSE format: ``data:`` fields, comments,
multi-line events).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx
from httpx_sse import EventSource, ServerSentEvent, SSEError

from capsim.engine.limits import MAX_ENGINE_COUNT
from capsim.files import loads_json
from capsim.metrics import RequestRecord


@dataclass
class RequestSpec:
    request_id: str
    prompt: str | list[int]
    max_tokens: int
    ignore_eos: bool = True


def build_payload(spec: RequestSpec, model: str, endpoint: str) -> dict:
    payload: dict = {
        "model": model,
        "max_tokens": spec.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "temperature": 0.0,
    }
    if spec.ignore_eos:
        payload["ignore_eos"] = True
    if endpoint == "chat":
        payload["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        payload["prompt"] = spec.prompt
    return payload


def endpoint_path(endpoint: str) -> str:
    return "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"


@dataclass(frozen=True)
class Timeouts:
    """Limits of one request, in seconds.

    * ``connect``: opening the TCP connection.
    * ``first_byte``: from sending the request until the first event of the stream (or the
      headers of an error answer); it covers queueing and prefill.
    * ``chunk``: the longest silence between two events of the stream after the first.
    * ``total``: the whole request, from sending to the end of the stream.
    """

    connect: float = 10.0
    first_byte: float = 300.0
    chunk: float = 60.0
    total: float = 600.0


EXCERPT = 200
"""Characters of a server's text kept in a failure's reason."""

STREAM_BASE_BYTES = 64 * 1024
STREAM_BYTES_PER_TOKEN = 2048
"""A request's event stream may carry STREAM_BASE_BYTES + STREAM_BYTES_PER_TOKEN x
max_tokens characters: a vLLM or SGLang chunk of one token with its usage is 300-700
bytes; a stream past that (one line without an end, a stream that never ends) is a
malformed stream, not memory the probe gives it."""

ERROR_BODY_BYTES = 64 * 1024
"""What the probe reads of an answer that is not 200 (its excerpt is the reason)."""


class StreamTooLarge(Exception):
    """A stream carried more than its share of characters (StreamBudget)."""


class StreamBudget:
    """The response as httpx-sse reads it (its headers and text), ending with
    StreamTooLarge once the text passes ``limit`` characters."""

    def __init__(self, response: httpx.Response, limit: int):
        self.headers = response.headers
        self.response = response
        self.limit = limit

    async def aiter_text(self):
        read = 0
        async for text in self.response.aiter_text():
            read += len(text)
            if read > self.limit:
                raise StreamTooLarge(f"the stream passed {self.limit:,} characters")
            yield text


def excerpt(text: str, limit: int = EXCERPT) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def chunk_text(choice: dict) -> tuple[str, str]:
    """(answer text, reasoning text) of one streamed choice."""
    if "text" in choice:
        return choice.get("text") or "", ""
    delta = _typed(choice, "delta", dict) or {}
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
    return delta.get("content") or "", reasoning


def _typed(obj: dict, key: str, kind: type):
    """``obj[key]`` if absent, null or of ``kind``; a chunk of another shape is malformed."""
    value = obj.get(key)
    if value is not None and not isinstance(value, kind):
        raise ValueError(f"'{key}' is {type(value).__name__}, not {kind.__name__}")
    return value


def _count(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ENGINE_COUNT:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ValueError(f"token count {shown} is not a whole number from 0 to 2**31")
    return value


class StreamReader:
    """Takes a request's events one at a time and decides how the request ended."""

    def __init__(self, spec: RequestSpec, record: RequestRecord):
        self.spec = spec
        self.record = record
        self.usage_tokens = 0  # cumulative completion tokens the usage reported so far
        self.exact = True  # every chunk with tokens carried a cumulative usage
        self.usage_seen = False
        self.done = False
        self.failure: tuple[str, str] | None = None

    def fail(self, outcome: str, reason: str) -> None:
        if self.failure is None:
            self.failure = (outcome, reason)

    def feed(self, event: ServerSentEvent, now: float) -> bool:
        """Take one event (arrived at ``now``, seconds); True when the stream is over."""
        data = event.data.strip()
        if event.event == "error":
            self.fail("server_error_event", f"server error: {excerpt(data)}")
            return True
        if data == "[DONE]":
            self.done = True
            return True
        if not data:
            return False
        try:
            obj = loads_json(data, duplicate_keys=True)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            return self._chunk(obj, now)
        except ValueError as exc:
            self.fail(
                "malformed_stream",
                f"malformed stream: after {self.streamed} tokens ({str(exc)[:80]}): "
                f"data: {excerpt(data)}",
            )
            return True

    @property
    def streamed(self) -> int:
        return sum(self.record.chunk_tokens or [])

    def _chunk(self, obj: dict, now: float) -> bool:
        record = self.record
        if obj.get("error"):
            err = obj["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            self.fail("server_error_event", f"server error: {excerpt(str(message))}")
            return True
        choices = _typed(obj, "choices", list) or []
        usage = _typed(obj, "usage", dict) or {}
        choice = choices[0] if choices else {}
        if not isinstance(choice, dict):
            raise ValueError(f"a choice is {type(choice).__name__}, not dict")
        answer, reasoning = chunk_text(choice)
        tokens = None
        if usage.get("completion_tokens") is not None:
            total = _count(usage["completion_tokens"])
            if total < self.usage_tokens:
                raise ValueError(f"usage fell from {self.usage_tokens} to {total} tokens")
            # this chunk's tokens: what the usage counts beyond the tokens already streamed
            # (a server that reports usage only at the end counts one per chunk till then)
            tokens = max(total - self.streamed, 0)
            self.usage_tokens = total
            self.usage_seen = True
            record.output_tokens = total
        if usage.get("prompt_tokens") is not None:
            record.input_tokens = _count(usage["prompt_tokens"])
        details = _typed(usage, "prompt_tokens_details", dict) or {}
        if details.get("cached_tokens"):
            record.cached_tokens = _count(details["cached_tokens"])
        if choices and (answer or reasoning or tokens):
            if tokens is None:
                self.exact = False
            record.chunk_times.append(now)
            record.chunk_tokens.append(1 if tokens is None else tokens)
            if self.streamed > self.spec.max_tokens:  # a server that does not stop
                raise ValueError(f"more tokens than max_tokens {self.spec.max_tokens}")
            if record.first_token is None:
                record.first_token = now
            if answer and record.first_answer_token is None:
                record.first_answer_token = now
        if choice.get("finish_reason"):
            record.finish_reason = str(choice["finish_reason"])
        return False

    def outcome(self) -> tuple[str, str | None]:
        """(outcome, reason) of a stream that ended without a transport fault."""
        if self.failure is not None:
            return self.failure
        record, streamed = self.record, self.streamed
        if not self.usage_seen:
            record.output_tokens = streamed
        if not self.done:
            return "incomplete", (
                f"incomplete: the stream ended without [DONE] after {streamed} tokens"
                + ("" if record.finish_reason else " and without a finish_reason")
            )
        if record.finish_reason is None:
            return "incomplete", f"incomplete: [DONE] after {streamed} tokens, no finish_reason"
        if record.finish_reason == "error":
            return "server_error_event", f"server error: finish_reason 'error' after {streamed}"
        if record.finish_reason == "abort":
            return "incomplete", f"incomplete: the server aborted it after {streamed} tokens"
        if record.first_token is None:
            return "incomplete", "incomplete: no tokens: the stream ended without output"
        if self.usage_seen and (
            record.output_tokens < streamed or (self.exact and record.output_tokens != streamed)
        ):
            return "malformed_stream", (
                f"malformed stream: the usage says {record.output_tokens} completion tokens, "
                f"the stream carried {streamed}"
            )
        if self.spec.ignore_eos and record.output_tokens < self.spec.max_tokens:
            return "incomplete", (
                f"incomplete: {record.output_tokens} of {self.spec.max_tokens} tokens with "
                f"ignore_eos (finish_reason '{record.finish_reason}')"
            )
        return "ok", None


async def stream_one(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    endpoint: str,
    spec: RequestSpec,
    clock,
    headers: dict[str, str] | None = None,
    timeouts: Timeouts | None = None,
) -> RequestRecord:
    """Send one streaming request and time every chunk (times in seconds from
    ``clock()``). Never raises for what the server does: every fault becomes the record's
    outcome. ``timeouts`` bounds the first byte, the gaps and the total (the client's
    own ``httpx.Timeout`` bounds connecting)."""
    limits = timeouts or Timeouts()
    record = RequestRecord(
        request_id=spec.request_id,
        send=clock(),
        chunk_times=[],
        chunk_tokens=[],
        max_tokens=spec.max_tokens,
    )
    reader = StreamReader(spec, record)
    loop = asyncio.get_running_loop()
    end = loop.time() + limits.total
    armed = ""  # which limit the deadline now enforces

    def arm(deadline: asyncio.Timeout, limit: str, seconds: float) -> None:
        nonlocal armed
        at = loop.time() + seconds
        armed = limit if at < end else "total"
        deadline.reschedule(min(at, end))

    outcome, reason = "ok", None
    try:
        async with asyncio.timeout(None) as deadline:
            arm(deadline, "first byte", limits.first_byte)
            async with client.stream(
                "POST",
                url + endpoint_path(endpoint),
                json=build_payload(spec, model, endpoint),
                headers=headers,
            ) as response:
                record.http_status = response.status_code
                if response.status_code != 200:
                    outcome, reason = "http_error", await _http_error(response)
                else:
                    budget = STREAM_BASE_BYTES + STREAM_BYTES_PER_TOKEN * spec.max_tokens
                    events = EventSource(StreamBudget(response, budget))  # type: ignore[arg-type]
                    async for event in events.aiter_sse():
                        now = clock()
                        arm(deadline, "between chunks", limits.chunk)
                        if reader.feed(event, now):
                            break
                    outcome, reason = reader.outcome()
    except TimeoutError:
        outcome, reason = "timeout", _timeout_reason(armed, limits, reader.streamed)
    except httpx.TimeoutException as exc:
        limit = "connect" if isinstance(exc, httpx.ConnectTimeout) else exc.__class__.__name__
        outcome, reason = "timeout", f"timeout ({limit}): {exc.__class__.__name__}"
    except (SSEError, httpx.DecodingError, StreamTooLarge) as exc:
        outcome, reason = "malformed_stream", f"malformed stream: {excerpt(str(exc))}"
    except httpx.HTTPError as exc:
        outcome, reason = (
            "connection_error",
            (
                f"connection: {exc.__class__.__name__} after {reader.streamed} tokens: "
                f"{str(exc)[:150]}"
            ),
        )
    record.finish = clock()
    if outcome != "ok" and not reader.usage_seen:
        record.output_tokens = reader.streamed
    record.outcome = outcome
    record.error = reason
    return record


def _timeout_reason(limit: str, limits: Timeouts, streamed: int) -> str:
    """``timeout (LIMIT): ...`` for the limit whose deadline passed."""
    if limit == "total":
        return f"timeout (total): not finished within {limits.total:g} s ({streamed} tokens)"
    seconds = limits.first_byte if limit == "first byte" else limits.chunk
    return f"timeout ({limit}): nothing for {seconds:g} s after {streamed} tokens"


async def _http_error(response: httpx.Response) -> str:
    """``http STATUS: [Retry-After VALUE: ]body excerpt`` of an answer that is not 200."""
    read = bytearray()
    async for chunk in response.aiter_bytes():
        read += chunk[: ERROR_BODY_BYTES - len(read)]
        if len(read) >= ERROR_BODY_BYTES:
            break
    body = bytes(read).decode(errors="replace").strip()
    retry = response.headers.get("retry-after")
    wait = f"Retry-After {retry}: " if retry else ""
    return f"http {response.status_code}: {wait}{excerpt(body, 300)}"


@dataclass(frozen=True)
class SmallAnswer:
    """An answer read whole within its limits (fetch_small)."""

    status_code: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self):
        """The body as JSON (ValueError when it is not)."""
        return loads_json(self.body, duplicate_keys=True)


class AnswerTooLarge(Exception):
    """An answer past its byte limit (fetch_small)."""


async def fetch_small(
    client: httpx.AsyncClient, method: str, url: str, limit: int, seconds: float, **kwargs
) -> SmallAnswer:
    """``method url`` read whole, within ``seconds`` in all (a server that sends a byte
    every few seconds never trips a read timeout) and ``limit`` bytes; raises
    httpx.HTTPError, TimeoutError or AnswerTooLarge."""
    body = bytearray()
    async with asyncio.timeout(seconds):
        async with client.stream(method, url, **kwargs) as response:
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > limit:
                    raise AnswerTooLarge(f"more than {limit:,} bytes")
            return SmallAnswer(response.status_code, bytes(body))


class Clock:
    """Seconds since the run started (monotonic)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start
