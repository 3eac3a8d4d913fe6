"""Streaming requests against an OpenAI-compatible server, timed chunk by chunk.

Each request streams (``stream: true``) with ``stream_options.include_usage`` and
``continuous_usage_stats`` (vLLM), so every chunk carries the cumulative completion tokens
and a chunk that carries several tokens (speculative decoding) counts them all. Servers
without continuous usage count one token per chunk, and the final usage gives the exact
total. The API key comes from an environment variable and is never printed or stored.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx

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


def chunk_text(obj: dict) -> tuple[str, str]:
    """(answer text, reasoning text) of one streamed chunk."""
    choices = obj.get("choices") or []
    if not choices:
        return "", ""
    choice = choices[0]
    if "text" in choice:
        return choice.get("text") or "", ""
    delta = choice.get("delta") or {}
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
    return delta.get("content") or "", reasoning


async def stream_one(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    endpoint: str,
    spec: RequestSpec,
    clock,
    headers: dict[str, str] | None = None,
) -> RequestRecord:
    """Send one streaming request and time every chunk (times from ``clock()``)."""
    record = RequestRecord(
        request_id=spec.request_id, send=clock(), chunk_times=[], chunk_tokens=[]
    )
    completion_so_far = 0
    first_answer = None
    try:
        async with client.stream(
            "POST",
            url + endpoint_path(endpoint),
            json=build_payload(spec, model, endpoint),
            headers=headers,
        ) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")[:300]
                record.error = f"http {response.status_code}: {body}"
                record.finish = clock()
                return record
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = clock()
                try:
                    obj = json.loads(data)
                except json.JSONDecodeError:
                    continue
                if obj.get("error"):
                    record.error = f"server error: {str(obj['error'])[:200]}"
                    break
                answer, reasoning = chunk_text(obj)
                usage = obj.get("usage") or {}
                tokens = None
                if usage.get("completion_tokens") is not None:
                    tokens = int(usage["completion_tokens"]) - completion_so_far
                    completion_so_far = int(usage["completion_tokens"])
                    record.output_tokens = completion_so_far
                if usage.get("prompt_tokens") is not None:
                    record.input_tokens = int(usage["prompt_tokens"])
                if usage.get("prompt_tokens_details"):
                    cached = (usage["prompt_tokens_details"] or {}).get("cached_tokens")
                    if cached:
                        record.cached_tokens = int(cached)
                if answer or reasoning or (tokens and obj.get("choices")):
                    count = tokens if tokens is not None else 1
                    if count > 0 or answer or reasoning:
                        record.chunk_times.append(now)
                        record.chunk_tokens.append(max(count, 1 if tokens is None else count))
                    if record.first_token is None:
                        record.first_token = now
                    if answer and first_answer is None:
                        first_answer = now
            record.finish = clock()
    except httpx.TimeoutException as exc:
        record.error = f"timeout: {exc.__class__.__name__}"
        record.finish = clock()
    except httpx.HTTPError as exc:
        record.error = f"connection: {exc.__class__.__name__}: {str(exc)[:150]}"
        record.finish = clock()
    if record.error is None:
        if record.output_tokens == 0:
            record.output_tokens = sum(record.chunk_tokens or [])
        if record.first_token is None:
            record.error = "no tokens: the stream ended without output"
    record.first_answer_token = first_answer
    return record


class Clock:
    """Seconds since the run started (monotonic)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start
