"""capsim serve's own HTTP overhead, measured at start-up so that it is not counted twice.

The simulated front end (``frontend_request_ms`` and the tokenizer term) already stands for
everything a real server adds outside the engine's steps: HTTP, parsing, streaming. capsim
serve's own HTTP path (a client's request reaching the handler, a chunk reaching the client)
costs real time on top of it, which a client measures and which ``--speedup`` multiplies:
about 3 ms of wall clock on a loaded two-core host is 30 ms of simulated time at 10x, a
quarter of a first token's 100 ms. So the server times a few streaming requests to itself
through a real HTTP client before it reports healthy (``ECHO_PATH`` reads the body and
streams a chunk at once, as the completions handler does when a token is ready), and hands
each token to its stream that much before the simulated front end would deliver it
(``LiveDeployment.transport_s``). It cannot hand a token over before the step that made it
has run: at a high ``--speedup`` the simulated front end's latency in wall-clock terms
(10 ms / 10 = 1 ms) can be shorter than the server's own round trip. That difference is
taken off the request's arrival instead: it enters the simulation that much earlier (at
most the hold, ``live.HOLD_S``, by which the simulation trails the wall clock). What is
left is the host's wall-clock noise, a few tenths of a millisecond: several percent of a
first token at 10x on a two-core host that also runs the client.
"""

from __future__ import annotations

import asyncio
import json
import time

RECEIVED_KEY = "capsim.received"
"""ASGI scope key: the event loop's time when the request's bytes reached the server
(``stamped_protocol``), before its HTTP parsing and before any other request of the same
burst was handled."""

ECHO_PATH = "/capsim/echo"
"""Streams one SSE chunk and [DONE]: the server's HTTP path without the engine."""

ECHO_WAIT_S = 0.002
"""The echo hands its chunk over this long after the request arrived, through a timer and a
queue (the way a simulated step's tokens reach a stream, including the event loop's timer
lateness); measure_round_trip takes it off."""

SAMPLES = 15
"""Requests timed (after two that warm the connection); the fastest is kept. Other work on
the host only ever lengthens a round trip, and a round trip taken off that is longer than
the one a client later meets hands tokens over early, so the client would see the
simulated deployment faster than it is (a clean-clone CI run's start-up on a busy host made
C=4's TTFT p50 23% early at 10x with the median); the fastest errs the other way, by the
host's noise."""


async def measure_round_trip(url: str, samples: int = SAMPLES, timeout_s: float = 10.0) -> float:
    """The fastest of ``samples`` wall-clock times from sending a small streaming request
    to ``url`` + ECHO_PATH to reading its first chunk, through httpx as a client would,
    seconds; 0.0 if the server cannot be reached within ``timeout_s``."""
    import httpx

    # a probe-sized request (512 prompt token ids) and a completion chunk's JSON, parsed
    body = {"model": "echo", "prompt": list(range(512)), "max_tokens": 1, "stream": True}
    deadline = time.monotonic() + timeout_s
    times: list[float] = []
    warm = 2
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        while len(times) < samples:
            try:
                started = time.perf_counter()
                async with client.stream("POST", url + ECHO_PATH, json=body) as response:
                    lines = response.aiter_lines()
                    async for line in lines:
                        if line.startswith("data:"):
                            json.loads(line[5:])
                            break
                    elapsed = time.perf_counter() - started
                    async for _ in lines:  # the rest of the stream, as a client reads it
                        pass
            except httpx.HTTPError:  # not listening yet
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
                continue
            if warm:
                warm -= 1
            else:
                times.append(elapsed)
    return max(min(times) - ECHO_WAIT_S, 0.0) if times else 0.0


HEADER_SECONDS = 30.0
"""The longest a new connection may take to send its first request's line and headers
(then it is closed): a client that stalls there held a connection for good."""


def stamped_protocol():
    """uvicorn's h11 HTTP protocol that stamps each request's scope with the loop time its
    bytes arrived (``RECEIVED_KEY``). A burst of requests reaches the server in one turn
    of the event loop, but their handlers start one after another, each after the HTTP
    parsing of the whole burst and the handlers before it; a handler's own clock would
    let a request enter the simulation up to milliseconds late, ten times that at
    ``--speedup 10``. It also closes a connection whose first request has not arrived whole
    within HEADER_SECONDS. None where uvicorn's h11 protocol is not importable (the
    handler's clock is then used)."""
    try:
        from uvicorn.protocols.http.h11_impl import H11Protocol
    except ImportError:
        return None

    class StampedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            # a client that never finishes its request line and headers held the
            # connection for good (uvicorn times only idle keep-alive connections)
            self.loop.call_later(HEADER_SECONDS, self._close_if_no_request)

        def _close_if_no_request(self) -> None:
            if getattr(self, "scope", None) is None and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            received = self.loop.time()
            before = getattr(self, "scope", None)
            super().data_received(data)
            scope = getattr(self, "scope", None)
            if scope is not None and scope is not before:  # a new request began here
                scope[RECEIVED_KEY] = received

    return StampedH11Protocol


def received_at(scope: dict, loop) -> float:
    """When a request reached the server (loop time): its stamp, or now."""
    return scope.get(RECEIVED_KEY) or loop.time()
