"""capsim serve's engine (capsim.serve.live) driven on a virtual clock: the pacing of its
steps and tokens, checked against ``capsim predict`` without the wall clock, so the
figures are the same on any host, however busy (issue 48). The HTTP round trip on the
wall clock is tests/test_serve.py's."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

import capsim
from capsim.calibration.applied import calibrated_setup
from capsim.catalog.loader import load_catalog
from capsim.cli.common import predict_config
from capsim.metrics import RequestRecord, level_metrics
from capsim.serve.live import HOLD_S, LiveDeployment
from tests.virtual_clock import run_on_virtual_clock

CAT = load_catalog()
DEPLOYMENT = dict(gpu="rtx3090", model="qwen3-coder-30b-a3b", quant="awq-int4")


def live_deployment(speedup: float, **extra) -> LiveDeployment:
    """The deployment ``capsim serve`` builds for DEPLOYMENT (cli/serve.py), with
    ``extra`` PredictConfig fields."""
    config = predict_config(**DEPLOYMENT, **extra, workload="closed", concurrency=[1], requests=1)
    deployment = LiveDeployment(calibrated_setup(config, CAT), speedup)
    deployment.wake_early_s = 0.0  # the virtual clock wakes exactly
    return deployment


async def closed_loop(
    deployment: LiveDeployment, clients: int, requests: int, prompt: int, output: int
) -> list[RequestRecord]:
    """``clients`` clients that send ``requests`` requests in all, each the next as soon
    as its last one ended (capsim probe's closed loop), reading the token events as the
    HTTP handler does; times are simulated seconds (loop time times the speedup)."""
    loop = asyncio.get_running_loop()
    driver = asyncio.ensure_future(deployment.run())
    # the driving loop sets its origin; the simulation runs HOLD_S behind the wall clock,
    # so a request sent in that first stretch would enter late (a real server has been up
    # for longer than that when its first request comes)
    await asyncio.sleep(HOLD_S)
    order = iter(range(requests))
    records: list[RequestRecord] = []
    scale = deployment.speedup

    async def client() -> None:
        for i in order:
            send = loop.time()
            live = deployment.submit(prompt, output)
            times, tokens, seen = [], [], 0
            while True:
                event = await live.queue.get()
                times.append(loop.time() * scale)
                tokens.append(event.tokens - seen)
                seen = event.tokens
                if event.finished:
                    break
            records.append(
                RequestRecord(
                    request_id=str(i),
                    send=send * scale,
                    first_token=times[0],
                    finish=times[-1],
                    input_tokens=prompt,
                    output_tokens=seen,
                    outcome="ok",
                    chunk_times=times,
                    chunk_tokens=tokens,
                )
            )

    await asyncio.gather(*(client() for _ in range(clients)))
    driver.cancel()
    return records


@pytest.mark.parametrize(
    ("speedup", "extra"), [(1.0, {}), (10.0, {}), (10.0, {"prefill_replicas": 1})]
)
def test_serve_paces_a_closed_loop_as_predict_simulates_it(speedup, extra):
    """The same closed workload through the live engine and through predict: throughput,
    TPOT and TTFT p50 within 0.01% (the same simulation, so the same figures up to float
    rounding), at any speedup, disaggregated too (a prefill instance beside the replica). A
    server that did not pace its steps, skipped the prefill or the front end's latency, or
    scaled time wrongly, misses by 30% or more."""
    levels, requests, prompt, output = [1, 4], 12, 512, 256
    predicted = capsim.predict(
        **DEPLOYMENT,
        concurrency=levels,
        input_tokens=str(prompt),
        output_tokens=str(output),
        requests=requests,
        catalog=CAT,
        **extra,
        # capsim serve streams through its own front end, which a client meets for real:
        # it does not simulate the engine's API-server round (front_end.py) on top
        efficiency_overrides={"api_server_us_per_stream_chunk": 0.0},
    )
    for level in predicted.levels:
        c = int(level.level)
        records = run_on_virtual_clock(
            closed_loop(live_deployment(speedup, **extra), c, requests, prompt, output)
        )
        assert len(records) == requests and all(r.output_tokens == output for r in records)
        served, model = level_metrics(records, c, "closed"), level.metrics
        for name, got, want in [
            ("tok/s", served.output_tok_s, model.output_tok_s),
            ("TPOT", served.tpot_ms.mean, model.tpot_ms.mean),
            ("TTFT p50", served.ttft_ms.p50, model.ttft_ms.p50),
        ]:
            assert got == pytest.approx(want, rel=1e-4), f"C={c} {name}: {got} vs {want}"


def test_requests_without_max_tokens_get_vllms_defaults():
    """A completion without max_tokens generates vLLM's 16; a chat request up to the
    context limit, or what --override-generation-config's max_new_tokens allows (with no
    end-of-sequence token, 'up to the limit' held a client for many minutes: issue 47)."""
    from starlette.testclient import TestClient

    from capsim.serve.app import create_app

    def tokens(client, path: str, body: dict) -> int:
        r = client.post(path, json={"model": "m", **body})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["completion_tokens"]

    # one client a deployment: its lifespan starts the deployment's driving loop once
    with TestClient(create_app(live_deployment(1000.0), ["m"])) as plain:
        assert tokens(plain, "/v1/completions", {"prompt": "a b c"}) == 16
        assert tokens(plain, "/v1/completions", {"prompt": "a b c", "max_tokens": 4}) == 4
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    with TestClient(create_app(live_deployment(1000.0), ["m"], default_max_tokens=7)) as capped:
        assert tokens(capped, "/v1/chat/completions", chat) == 7
        assert tokens(capped, "/v1/chat/completions", {**chat, "max_tokens": 3}) == 3


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{", "not JSON"),
        ("[1]", "JSON object"),
        ('{"max_new_tokens": 0}', "from 1"),
        ('{"max_new_tokens": 2.5}', "whole number"),
        ('{"max_new_tokens": true}', "whole number"),
    ],
)
def test_a_bad_generation_config_is_exit_2(text, words):
    from typer.testing import CliRunner

    from capsim.cli.main import app

    args = ["serve", "--gpu", "rtx3090", "--model", "qwen3-8b"]
    r = CliRunner().invoke(app, [*args, "--override-generation-config", text])
    assert r.exit_code == 2 and words in r.stderr, r.output


def test_the_body_budget_holds_bodies_back_past_its_bytes():
    """Bodies read at once hold at most the budget (128 bodies of 15 MB took the server to
    3.4 GB, issue 47); a body alone always fits, and one held back goes on when bytes are
    given back."""
    import asyncio

    from capsim.serve.app import BodyBudget

    async def scenario():
        budget = BodyBudget(100)
        await budget.take(150)  # alone: fits although over the budget
        waiting = asyncio.ensure_future(budget.take(10))
        await asyncio.sleep(0.01)
        assert not waiting.done() and budget.used == 150
        await budget.give(150)
        await asyncio.wait_for(waiting, 1.0)
        assert budget.used == 10
        await budget.take(90)
        blocked = asyncio.ensure_future(budget.take(1))
        await asyncio.sleep(0.01)
        assert not blocked.done()
        blocked.cancel()

    asyncio.run(scenario())


def test_a_body_that_stalls_is_answered_408(monkeypatch):
    """A client that sends half a body and stops held its connection open for good."""
    import asyncio

    import httpx

    from capsim.serve import app as serve_app

    monkeypatch.setattr(serve_app, "BODY_SECONDS", 0.3)

    async def scenario():
        application = serve_app.create_app(live_deployment(1000.0), ["m"])

        async def stalled():
            yield b'{"model": "m", "prompt": "'
            await asyncio.sleep(5)
            yield b'"}'

        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            r = await client.post(
                "/v1/completions",
                content=stalled(),
                headers={"content-type": "application/json"},
            )
        return r

    r = asyncio.run(scenario())
    assert r.status_code == 408 and "did not arrive within 0.3 s" in r.json()["error"]["message"]


def test_a_connection_that_never_finishes_its_headers_is_closed(monkeypatch):
    """A client that sends half a request line and headers and stops held its connection
    for good (uvicorn times only idle keep-alive connections, issue 47's third audit)."""
    import time

    from starlette.applications import Starlette

    from capsim.serve import transport

    monkeypatch.setattr(transport, "HEADER_SECONDS", 0.5)
    with connected_to(Starlette()) as client:
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # no blank line: never whole
        started = time.monotonic()
        assert client.recv(100) == b""  # closed by the server
        assert time.monotonic() - started < 5


@contextlib.contextmanager
def connected_to(application):
    """``application`` served by uvicorn on a free local port (capsim serve's HTTP
    protocol) in a thread; yields a client socket connected to it (10 s timeout), and
    stops the server on the way out."""
    import socket
    import threading
    import time

    import uvicorn

    from capsim.serve import transport

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(
        application,
        host="127.0.0.1",
        port=port,
        http=transport.stamped_protocol(),
        log_level="error",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if server.started:
                break
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_a_chunk_declared_larger_than_sent_is_answered_408_within_the_body_limit(monkeypatch):
    """A chunked body whose chunk header declares 2**80 bytes and sends three held the
    connection past 20 s (issue 47's fuzzing): the body's limit (BODY_SECONDS, under the
    10 s a request may hang) answers it 408."""
    import time

    from capsim.serve import app as serve_app

    assert serve_app.BODY_SECONDS <= 10
    monkeypatch.setattr(serve_app, "BODY_SECONDS", 0.5)
    with connected_to(serve_app.create_app(live_deployment(1000.0), ["m"])) as client:
        started = time.monotonic()
        client.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"ffffffffffffffffffff\r\nabc\r\n0\r\n\r\n"
        )
        answer = b""
        while chunk := client.recv(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert time.monotonic() - started < 8
