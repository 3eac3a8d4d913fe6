"""The HTTP side of ``capsim serve``: an OpenAI-compatible API in front of a simulated
deployment (capsim.serve.live), with vLLM's extra endpoints and error messages.

Endpoints: ``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` (streaming and
not, ``stream_options.include_usage`` and vLLM's ``continuous_usage_stats``,
``max_tokens`` / ``max_completion_tokens``, ``ignore_eos``, ``n`` = 1), ``/tokenize``,
``/health``, ``/version`` and ``/metrics`` (Prometheus, vLLM's names); capsim's own
``/capsim/info`` and ``/capsim/echo`` (the HTTP path timed at start-up, transport.py).

Prompt tokens are counted by ``count_tokens``, an estimate (see its docstring) unless the
prompt is given as token ids; ``/tokenize`` answers with the same count, so a client that
sizes its prompts with it (``capsim probe`` does) gets exactly the lengths it asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import ClassVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from capsim.files import loads_json
from capsim.serve.live import LIMITS, LiveDeployment
from capsim.serve.metrics import ServeMetrics
from capsim.serve.transport import ECHO_PATH, ECHO_WAIT_S, measure_round_trip, received_at

WORD_OR_MARK = re.compile(r"\w+|[^\w\s]")

CHAT_TOKENS_PER_MESSAGE = 4
"""Estimated chat-template tokens around each message (role header and separators), as in
OpenAI's published token-counting recipe for chat models (3-4 per message)."""

CHAT_TOKENS_FOR_REPLY = 3
"""Estimated template tokens that open the assistant's reply."""

MAX_BODY_BYTES = 32 * 2**20
"""Largest request body capsim serve reads, bytes (answered 413 above it, before reading
the rest): a 128k-token prompt is well under 1 MB."""
FILLER = " tok"
"""The text of every generated token: capsim serve simulates timing, not a model."""


def count_tokens(text: str) -> int:
    """Estimated tokens of ``text``: one per word and one per punctuation mark (a
    whitespace-and-punctuation split; real BPE tokenizers give about 1.0-1.5 tokens per
    English word). At least 1."""
    return max(1, len(WORD_OR_MARK.findall(text)))


def prompt_tokens_of(body: dict, chat: bool) -> int:
    """Prompt tokens of a completions or chat request (token ids are counted exactly)."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list", param="messages")
        total = CHAT_TOKENS_FOR_REPLY
        for message in messages:
            if not isinstance(message, dict):
                raise ApiError(400, "each message must be a JSON object", param="messages")
            content = message.get("content")
            if isinstance(content, list):  # content parts: count the text ones
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            if content is not None and not isinstance(content, str):
                raise ApiError(
                    400,
                    "a message's content must be a string or a list of content parts",
                    param="messages",
                )
            total += CHAT_TOKENS_PER_MESSAGE + (count_tokens(content) if content else 0)
        return total
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError(
            400, "prompt must be a string or a list of token ids (one prompt)", param="prompt"
        )
    return count_tokens(prompt)


class ApiError(Exception):
    """An error answered as vLLM's OpenAI server does: status and a JSON error body."""

    TYPES: ClassVar[dict[int, str]] = {
        400: "BadRequestError",
        404: "NotFoundError",
        413: "RequestTooLargeError",
    }

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def response(self) -> JSONResponse:
        return JSONResponse(
            {
                "error": {
                    "message": self.message,
                    "type": self.TYPES.get(self.status, "InternalServerError"),
                    "param": self.param,
                    "code": self.status,
                }
            },
            status_code=self.status,
        )


def sse_chunk(rid: str, kind: str, model: str, choices: list, usage: dict | None = None) -> str:
    """One server-sent event of a streamed completion (``kind``: text_completion or
    chat.completion.chunk), with ``usage`` when given."""
    payload = {"id": rid, "object": kind, "created": int(time.time()), "model": model}
    payload["choices"] = choices
    if usage is not None:
        payload["usage"] = usage
    return f"data: {json.dumps(payload)}\n\n"


def create_app(
    deployment: LiveDeployment,
    served_names: list[str],
    version: str = "0",
    self_url: str | None = None,
) -> Starlette:
    """The Starlette application serving ``deployment`` under ``served_names`` (the first
    is the name /v1/models lists). With ``self_url`` (where this app will listen), it
    measures its own HTTP round trip at start-up (capsim.serve.transport) and answers
    /health with 503 until it has."""
    setup = deployment.setup
    max_model_len = setup.max_model_len
    metrics = ServeMetrics(deployment, served_names[0])
    created = int(time.time())
    headers = {"x-capsim-simulated": "true"}

    def check_model(body: dict) -> str:
        name = body.get("model") or served_names[0]
        if name not in served_names:
            raise ApiError(404, f"The model `{name}` does not exist.", param="model")
        return name

    def max_tokens_of(body: dict, prompt_tokens: int) -> int:
        value = body.get("max_completion_tokens", body.get("max_tokens"))
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ApiError(400, f"max_tokens must be an integer, got {value!r}.", "max_tokens")
        if value is not None and value < 1:
            raise ApiError(400, f"max_tokens must be at least 1, got {value}.", "max_tokens")
        if prompt_tokens >= max_model_len or (
            value is not None and prompt_tokens + value > max_model_len
        ):
            asked = prompt_tokens + (value or 0)
            raise ApiError(
                400,
                f"This model's maximum context length is {max_model_len} tokens. However, "
                f"you requested {asked} tokens ({prompt_tokens} in the messages, "
                f"{value or 0} in the completion). Please reduce the length of the "
                "messages or completion.",
                param="max_tokens" if value else "messages",
            )
        return value if value is not None else max_model_len - prompt_tokens

    async def read_body(request: Request) -> dict:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise ApiError(413, f"The request body is over {MAX_BODY_BYTES >> 20} MB.")
        raw = bytearray()
        async for part in request.stream():
            raw += part
            if len(raw) > MAX_BODY_BYTES:
                raise ApiError(413, f"The request body is over {MAX_BODY_BYTES >> 20} MB.")
        try:
            body = loads_json(bytes(raw) or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"Invalid JSON in the request body: {exc}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "The request body must be a JSON object.")
        return body

    async def final_tokens(live) -> int:
        """The tokens of a request once it has finished."""
        while True:
            event = await live.queue.get()
            if event.finished:
                return event.tokens

    async def disconnected(request: Request) -> None:
        """Return once the client has closed its connection (the body is read already, so
        the next ASGI message is the disconnect; vLLM's API server listens the same way)."""
        while (await request.receive())["type"] != "http.disconnect":
            pass

    async def generate(request: Request, chat: bool) -> Response:
        arrived = received_at(request.scope, asyncio.get_running_loop())
        try:
            body = await read_body(request)
            model = check_model(body)
            n = body.get("n", 1)
            if n != 1:
                raise ApiError(400, "capsim serve supports n = 1 only.", param="n")
            prompt_tokens = prompt_tokens_of(body, chat)
            max_tokens = max_tokens_of(body, prompt_tokens)
            options = body.get("stream_options")
            if options is not None and not isinstance(options, dict):
                raise ApiError(400, "stream_options must be a JSON object.", "stream_options")
        except ApiError as exc:
            return exc.response()
        live = deployment.submit(prompt_tokens, max_tokens, arrived)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        kind = "chat.completion" if chat else "text_completion"

        def usage(tokens: int) -> dict:
            return {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": tokens,
                "total_tokens": prompt_tokens + tokens,
            }

        if not body.get("stream"):
            answer = asyncio.ensure_future(final_tokens(live))
            gone = asyncio.ensure_future(disconnected(request))
            await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not answer.done():  # the client went away before its answer: vLLM aborts it
                answer.cancel()
                deployment.abort(live)
                return Response(status_code=499)  # nobody reads it
            gone.cancel()
            tokens = answer.result()
            text = FILLER * tokens
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": text}}
                if chat
                else {"index": 0, "text": text, "logprobs": None}
            )
            choice["finish_reason"] = "length"
            return JSONResponse(
                {
                    "id": rid,
                    "object": kind,
                    "created": int(time.time()),
                    "model": model,
                    "choices": [choice],
                    "usage": usage(tokens),
                },
                headers=headers,
            )

        options = body.get("stream_options") or {}
        if not isinstance(options, dict):  # checked before the request was admitted
            options = {}
        include_usage = bool(options.get("include_usage"))
        continuous = include_usage and bool(options.get("continuous_usage_stats"))
        chunk_kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list, tokens: int | None = None) -> str:
            return sse_chunk(
                rid, chunk_kind, model, choices, None if tokens is None else usage(tokens)
            )

        async def events() -> AsyncIterator[str]:
            done = False
            try:
                if chat:
                    first = {"index": 0, "delta": {"role": "assistant", "content": ""}}
                    yield chunk([{**first, "finish_reason": None}], 0 if continuous else None)
                sent = 0
                while True:
                    event = await live.queue.get()
                    while not event.finished and not live.queue.empty():
                        event = live.queue.get_nowait()  # behind: send what is there at once
                    new = event.tokens - sent
                    done = event.finished
                    if new > 0 or event.finished:
                        reason = "length" if event.finished else None
                        text = FILLER * max(new, 0)
                        choice = (
                            {"index": 0, "delta": {"content": text}}
                            if chat
                            else {"index": 0, "text": text, "logprobs": None}
                        )
                        choice["finish_reason"] = reason
                        sent = event.tokens
                        yield chunk([choice], sent if continuous else None)
                    if event.finished:
                        break
                if include_usage:
                    yield chunk([], sent)
                yield "data: [DONE]\n\n"
            finally:
                if not done:  # the client went away mid-stream: vLLM aborts the request
                    deployment.abort(live)

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    async def models(_: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": created,
                        "owned_by": "capsim (simulated)",
                        "root": setup.model.hf_id,
                        "parent": None,
                        "max_model_len": max_model_len,
                    }
                    for name in served_names
                ],
            },
            headers=headers,
        )

    async def tokenize(request: Request) -> Response:
        try:
            body = await read_body(request)
            check_model(body)
            chat = "messages" in body
            count = prompt_tokens_of(body, chat)
        except ApiError as exc:
            return exc.response()
        return JSONResponse(
            {"count": count, "max_model_len": max_model_len, "tokens": list(range(count))}
        )

    ready = asyncio.Event()

    async def health(_: Request) -> Response:
        return Response(status_code=200 if ready.is_set() else 503)

    async def echo(request: Request) -> Response:
        """The HTTP path of a streamed completion without the engine (transport.py): the
        body read, and the chunk handed to the stream through a timer and a queue, as the
        simulation hands a token over when its step ends (``ECHO_WAIT_S`` later, which the
        measurement takes off)."""
        loop = asyncio.get_running_loop()
        arrived = received_at(request.scope, loop)
        try:
            await read_body(request)
        except ApiError as exc:
            return exc.response()
        handed: asyncio.Queue[str] = asyncio.Queue()
        choice = {"index": 0, "text": FILLER, "logprobs": None, "finish_reason": None}
        first = sse_chunk("cmpl-" + uuid.uuid4().hex, "text_completion", served_names[0], [choice])
        loop.call_at(arrived + ECHO_WAIT_S, handed.put_nowait, first)

        async def lines() -> AsyncIterator[str]:
            yield await handed.get()
            yield "data: [DONE]\n\n"

        return StreamingResponse(lines(), media_type="text/event-stream")

    async def measure_transport() -> None:
        try:
            if self_url is not None:
                deployment.transport_s = await measure_round_trip(self_url)
        finally:
            ready.set()

    async def version_info(_: Request) -> Response:
        return JSONResponse({"version": f"capsim-serve {version}", "simulated": True})

    async def prometheus(_: Request) -> Response:
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4")

    async def info(_: Request) -> Response:
        """What is simulated, how fast, and the server's own timing overhead."""
        return JSONResponse(
            {
                "gpu": setup.gpu.name,
                "model": setup.model.name,
                "quant": setup.fmt.name,
                "tp": setup.config.tp,
                "replicas": setup.dp,
                "max_model_len": max_model_len,
                "kv_cache_tokens": setup.num_blocks * setup.scheduler.block_size,
                "speedup": deployment.speedup,
                "max_lag_ms": deployment.max_lag_s * 1e3,
                "http_round_trip_ms": deployment.transport_s * 1e3,
                "steps": deployment.steps,
                "limits": LIMITS,
            }
        )

    task: list[asyncio.Task] = []

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task.append(asyncio.create_task(deployment.run()))
        task.append(asyncio.create_task(measure_transport()))
        yield
        for t in task:
            t.cancel()

    return Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/health", health),
            Route("/version", version_info),
            Route("/metrics", prometheus),
            Route("/capsim/info", info),
            Route(ECHO_PATH, echo, methods=["POST"]),
        ],
        lifespan=lifespan,
    )
