"""The HTTP side of ``capsim serve``: an OpenAI-compatible API in front of a simulated
deployment (capsim.serve.live), with vLLM's extra endpoints and error messages.

Endpoints: ``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` (streaming and
not, ``stream_options.include_usage`` and vLLM's ``continuous_usage_stats``,
``max_tokens`` / ``max_completion_tokens``, ``ignore_eos``, ``n`` = 1), ``/tokenize``,
``/health``, ``/version`` and ``/metrics`` (Prometheus, vLLM's names); capsim's own
``/capsim/info`` and ``/capsim/echo`` (the HTTP path timed at start-up, transport.py).

Prompt tokens are counted by ``capsim.serve.requests.count_tokens``, an estimate (see its
docstring) unless the prompt is given as token ids; ``/tokenize`` answers with the same
count, so a client that sizes its prompts with it (``capsim probe`` does) gets exactly the
lengths it asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from capsim.files import loads_json
from capsim.serve.extra_fields import check_extra_fields, check_token_ids, check_tokenize_fields
from capsim.serve.live import LIMITS, LiveDeployment
from capsim.serve.metrics import ServeMetrics
from capsim.serve.requests import (
    ApiError,
    bad,
    check_sampling,
    check_stream,
    check_tools,
    lax_bool,
    max_tokens_of,
    model_name,
    prompt_tokens_of,
)
from capsim.serve.transport import ECHO_PATH, ECHO_WAIT_S, measure_round_trip, received_at

MAX_BODY_BYTES = 16 * 2**20
"""Largest request body capsim serve reads, bytes (answered 413 above it, before reading
the rest): a 128k-token prompt is well under 1 MB, a 1M-token one as token ids about 8 MB.
Parsed, a body of short numbers takes about 8 bytes a byte (of objects and arrays, far more:
those are refused by count, capsim.files.MAX_JSON_CONTAINERS), so a few bodies at once stay
well under 1 GB (three 32 MB bodies took the server to 1.8 GB)."""
BODY_BUDGET_BYTES = 64 * 2**20
"""Request bodies read, parsed and counted at once, bytes in all (BodyBudget): 128 bodies of
15 MB arriving together took the server to 3.4 GB (issue 47); past the budget a body waits
for the ones ahead of it."""

INLINE_BYTES = 64 * 1024
"""Bodies up to this size are parsed and their prompts counted on the event loop (tens of
microseconds); longer ones in a thread, where their time does not hold the streams up."""

BODY_SECONDS = 8.0
"""The longest a request's body may take to arrive, whole (answered 408 after it): a client
that sends half a body and stalls, or declares a chunk larger than it sends, held its
connection open for good. The largest body served (MAX_BODY_BYTES, 16 MB) arrives within it
at 20 Mbit/s; a request body of an agent's chat, tens of KB, in milliseconds."""

FILLER = " tok"
"""The text of every generated token: capsim serve simulates timing, not a model."""


class BodyBudget:
    """Bytes of request bodies held at once (BODY_BUDGET_BYTES): ``take`` waits until the
    bytes fit (a lone body always does), ``give`` hands them back. A body takes all its
    bytes before it is read, so no two bodies each wait for the other's."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self.changed = asyncio.Condition()

    async def take(self, n: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            self.used += n

    async def give(self, n: int) -> None:
        if n:
            async with self.changed:
                self.used -= n
                self.changed.notify_all()


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
    default_max_tokens: int | None = None,
) -> Starlette:
    """The Starlette application serving ``deployment`` under ``served_names`` (the first
    is the name /v1/models lists). With ``self_url`` (where this app will listen), it
    measures its own HTTP round trip at start-up (capsim.serve.transport) and answers
    /health with 503 until it has. ``default_max_tokens``: what a request that sets no
    max_tokens may generate at most (vLLM's ``--override-generation-config
    '{"max_new_tokens": N}'``); None: up to max_model_len, as vLLM without it."""
    setup = deployment.setup
    max_model_len = setup.max_model_len
    metrics = ServeMetrics(deployment, served_names[0])
    created = int(time.time())
    headers = {"x-capsim-simulated": "true"}

    vocab_size = setup.model.vocab_size

    def check_length(prompt_tokens: int, value: int | None) -> int:
        """The tokens a request may generate, refused as vLLM does when prompt and
        completion together pass max_model_len."""
        if prompt_tokens >= max_model_len or (
            value is not None and prompt_tokens + value > max_model_len
        ):
            asked = prompt_tokens + (value or 0)
            over = "more than " if prompt_tokens > max_model_len else ""
            raise ApiError(
                400,
                f"This model's maximum context length is {max_model_len} tokens. However, "
                f"you requested {over}{asked} tokens ({over}{prompt_tokens} in the messages, "
                f"{value or 0} in the completion). Please reduce the length of the "
                "messages or completion.",
                param="max_tokens" if value else "messages",
            )
        if value is not None:
            return value
        room = max_model_len - prompt_tokens
        return room if default_max_tokens is None else min(room, default_max_tokens)

    async def count_prompt(body: dict, chat: bool, size: int) -> int:
        """Prompt tokens, at most just past max_model_len: a long prompt (a body of
        ``size`` bytes past INLINE_BYTES) is counted off the event loop, so the streams in
        flight keep going meanwhile; a short one at once (a thread's hand-off costs more
        than its counting, on every request)."""
        if size <= INLINE_BYTES:
            return prompt_tokens_of(body, chat, vocab_size, max_model_len)
        return await asyncio.to_thread(prompt_tokens_of, body, chat, vocab_size, max_model_len)

    budget = BodyBudget(BODY_BUDGET_BYTES)

    @contextlib.asynccontextmanager
    async def request_body(request: Request, json_only: bool = True):
        """The request's JSON object (read_body) and its size in bytes, which it holds of
        the BodyBudget until the block ends (also when reading it failed)."""
        held = [0]
        try:
            yield await read_body(request, held, json_only), held[0]
        finally:
            await budget.give(held[0])

    async def read_body(request: Request, held: list[int], json_only: bool = True) -> dict:
        """The request's JSON object; the bytes it takes of the BodyBudget are put in
        ``held`` (request_body gives them back)."""
        if json_only:
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                raise ApiError(415, "Unsupported Media Type: Only 'application/json' is allowed")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise ApiError(413, f"The request body is over {MAX_BODY_BYTES >> 20} MB.")
        # a declared body's bytes are taken before it is read; a body without a length
        # (chunked) takes INLINE_BYTES and more as it arrives, doubling: four stalled
        # chunked bodies that each took the largest (16 MB) held the whole budget and the
        # valid requests behind them waited out BODY_SECONDS. Two growing bodies that wait
        # on each other end at BODY_SECONDS (408), never for good.
        need = int(declared) if declared.isdigit() else INLINE_BYTES
        raw = bytearray()
        try:
            async with asyncio.timeout(BODY_SECONDS):
                await budget.take(need)
                held[0] = need
                async for part in request.stream():
                    raw += part
                    if len(raw) > MAX_BODY_BYTES:
                        raise ApiError(413, f"The request body is over {MAX_BODY_BYTES >> 20} MB.")
                    if len(raw) > held[0]:  # an undeclared body grew past what it took
                        more = min(max(held[0], len(raw) - held[0]), MAX_BODY_BYTES)
                        await budget.take(more)
                        held[0] += more
        except ClientDisconnect:  # gone before the body was whole: nobody reads the answer
            raise ApiError(400, "There was an error parsing the body.") from None
        except TimeoutError:
            raise ApiError(
                408, f"The request body did not arrive within {BODY_SECONDS:g} s."
            ) from None
        try:
            data = bytes(raw) or b"null"
            if len(data) <= INLINE_BYTES:
                body = loads_json(data, duplicate_keys=True)
            else:  # a long body is parsed off the event loop
                body = await asyncio.to_thread(loads_json, data)
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
            # what the body holds of the budget goes back once the prompt is counted
            async with request_body(request) as (body, size):
                model = model_name(body, served_names)
                check_sampling(body, chat)
                if chat:
                    check_tools(body)
                check_extra_fields(body, chat, vocab_size, max_model_len)
                stream, include_usage, continuous = check_stream(body)
                asked = max_tokens_of(body, chat)
                prompt_tokens = await count_prompt(body, chat, size)
                max_tokens = check_length(prompt_tokens, asked)
        except ApiError as exc:
            return exc.response()
        del body  # not kept while the request streams
        live = deployment.submit(prompt_tokens, max_tokens, arrived)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        kind = "chat.completion" if chat else "text_completion"

        def usage(tokens: int) -> dict:
            return {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": tokens,
                "total_tokens": prompt_tokens + tokens,
            }

        if not stream:
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
            async with request_body(request) as (body, size):
                model_name(body, served_names)
                chat = "messages" in body
                check_tokenize_fields(body, chat)
                strings = lax_bool(body, "return_token_strs")
                count = await count_prompt(body, chat, size)
                check_length(count, None)
        except ApiError as exc:
            return exc.response()
        answer = {"count": count, "max_model_len": max_model_len, "tokens": list(range(count))}
        if strings:  # vLLM's TokenizeResponse: one string a token (here the filler's)
            answer["token_strs"] = [FILLER] * count
        return JSONResponse(answer)

    async def detokenize(request: Request) -> Response:
        """vLLM's /detokenize: token ids back to text (capsim's is filler, a piece a token),
        the ids checked against the vocabulary as vLLM checks them."""
        try:
            async with request_body(request) as (body, _):
                model_name(body, served_names)
                if body.get("tokens") is None:
                    raise bad("tokens", "tokens must be a list of token ids (integers).")
                tokens = body["tokens"]
                if isinstance(tokens, list) and len(tokens) > max_model_len:
                    raise bad(
                        "tokens",
                        f"{len(tokens)} tokens are more than max_model_len {max_model_len}.",
                    )
                check_token_ids(body, "tokens", vocab_size)
        except ApiError as exc:
            return exc.response()
        return JSONResponse({"prompt": FILLER * len(tokens)})

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
            async with request_body(request, json_only=False):
                pass
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
                "pid": os.getpid(),
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

    async def http_error(_: Request, exc: HTTPException) -> Response:
        """Starlette's own 404 and 405 as vLLM answers them: a JSON error object."""
        answer = ApiError(exc.status_code, str(exc.detail)).response()
        answer.headers.update(exc.headers or {})
        return answer

    return Starlette(
        exception_handlers={HTTPException: http_error},
        routes=[
            Route("/v1/models", models),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/detokenize", detokenize, methods=["POST"]),
            Route("/health", health),
            Route("/version", version_info),
            Route("/metrics", prometheus),
            Route("/capsim/info", info),
            Route(ECHO_PATH, echo, methods=["POST"]),
        ],
        lifespan=lifespan,
    )
