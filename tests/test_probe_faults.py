"""Every fault a server can throw is recorded as what it is (issue 22), against the
fault-injection server in tests/fault_server.py and httpx mock transports."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from capsim.cli.main import app
from capsim.metrics import OUTCOMES, RequestRecord
from capsim.probe.client import Clock, RequestSpec, Timeouts, stream_one
from capsim.probe.runfile import level_outcomes, load_run, summarize_log
from capsim.probe.runner import ProbeConfig, run_probe
from tests.fault_server import BROKEN_AFTER, FAULTS, FaultServer

OUT = 8  # output tokens per request in the per-fault runs

# fault: (outcome, words its reason must hold, tokens measured before it, ProbeConfig limits)
EXPECTED = {
    "http_500": ("http_error", "http 500: {", 0, {}),
    "http_429": ("http_error", "http 429: Retry-After 2", 0, {}),
    # the limits leave a healthy request of this host's busiest moments a wide margin (a
    # 0.4 s total failed a healthy request once beside the full suite); the faults'
    # delays (2 s of silence, 0.4 s a token: FaultServer below) still pass them
    "slow_headers": ("timeout", "timeout (first byte)", 0, {"first_byte_timeout_s": 1.0}),
    "stall": ("timeout", "timeout (between chunks)", BROKEN_AFTER, {"chunk_timeout_s": 1.0}),
    "slow": ("timeout", "timeout (total)", None, {"timeout_s": 1.5}),
    "malformed": ("malformed_stream", 'data: {"object": "chunk"', BROKEN_AFTER, {}),
    "no_done": ("incomplete", "without [DONE] after 8 tokens", OUT, {}),
    "truncated": ("incomplete", "and without a finish_reason", BROKEN_AFTER, {}),
    "short": ("incomplete", "4 of 8 tokens with ignore_eos", BROKEN_AFTER + 1, {}),
    "abort": ("incomplete", "aborted", BROKEN_AFTER + 1, {}),
    "reset": ("connection_error", "connection: ", BROKEN_AFTER, {}),
    "error_event": ("server_error_event", "server error: engine died", BROKEN_AFTER, {}),
    "usage_mismatch": ("malformed_stream", "usage says 13", OUT, {}),
    "not_sse": ("malformed_stream", "text/event-stream", 0, {}),
    # issue 47: a line that never ends and a stream that never stops are bounded by the
    # request's share of characters and by max_tokens; a usage past 32 bits is malformed
    "huge_line": ("malformed_stream", "the stream passed 81,920 characters", BROKEN_AFTER, {}),
    "endless": ("malformed_stream", "more tokens than max_tokens 8", OUT + 1, {}),
    "usage_huge": ("malformed_stream", "token count 1000000000000000000000000000000 is not", 3, {}),
}


def test_every_fault_has_an_expectation():
    assert set(EXPECTED) == set(FAULTS)
    covered = {outcome for outcome, *_ in EXPECTED.values()} | {"ok"}
    assert covered >= set(OUTCOMES) - {"interrupted", "failed"}


def records_of(path) -> list[dict]:
    _, events = load_run(path)
    return [e for e in events if e["type"] == "request"]


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_is_recorded_as_what_it_is(fault, tmp_path):
    outcome, words, measured, limits = EXPECTED[fault]
    with FaultServer(at={2: fault}, slow_token_s=0.4) as server:
        summary = run_probe(
            ProbeConfig(
                url=server.url,
                model="fault-model",
                concurrency=[1, 2],
                requests=4,
                input_tokens=16,
                output_tokens=OUT,
                warmup=False,
                **limits,
            ),
            tmp_path / "run.json",
        )
    assert summary.complete
    records = records_of(tmp_path / "run.json")
    assert len(records) == 8
    (broken,) = [r for r in records if r["outcome"] != "ok"]
    assert broken["outcome"] == outcome, broken["error"]
    assert words in broken["error"]
    assert broken["max_tokens"] == OUT
    if measured is not None:  # the chunks before the fault are kept
        assert sum(broken["chunk_tokens"] or []) == measured
        assert len(broken["chunk_times"] or []) == measured
    for r in records:
        if r is not broken:
            assert r["error"] is None and r["finish_reason"] == "length"
            assert r["output_tokens"] == OUT and sum(r["chunk_tokens"]) == OUT
    first, second = summary.levels
    assert first.outcomes == {"ok": 3, outcome: 1}
    assert first.errors == {broken["error"].split(":")[0]: 1}
    m = first.metrics
    assert (m.requests, m.completed, m.failed) == (4, 3, 1)
    assert m.output_tokens == 3 * OUT and m.itl_ms.count == 3 * (OUT - 1)
    assert m.ttft_ms.count == 3 and m.e2e_s.count == 3
    # the fault touched nothing else: the other level is what a clean server gives
    assert second.outcomes == {"ok": 4} and second.errors == {}
    assert second.metrics.output_tokens == 4 * OUT and second.metrics.failed == 0


def test_the_faulty_server_of_issue_22(tmp_path):
    """The issue's server (every 5th request HTTP 500, every 7th stalls, every 11th a
    malformed line after 3 tokens, every 13th no [DONE], garbage /metrics, no /tokenize)
    through the CLI: no broken or short stream is ok, throughput counts ok requests only."""
    faults = {5: "http_500", 7: "stall", 11: "malformed", 13: "no_done"}
    out = tmp_path / "faulty.json"
    with FaultServer(every=faults, metrics="garbage", tokenize=False, stall_s=2) as server:
        r = CliRunner().invoke(
            app,
            [
                "probe",
                "--url",
                server.url,
                "--model",
                "fault-model",
                "-c",
                "1,4",
                "--input-tokens",
                "64",
                "--output-tokens",
                "32",
                "--requests",
                "40",
                "--timeout",
                "5",
                "--chunk-timeout",
                "1.0",
                "--out",
                str(out),
            ],
        )
        # a prompt starts "[nonce key]": the probe's nonce, then the request id
        served = {s.prompt.split("]")[0].split()[-1]: s.fault for s in server.served if s.prompt}
    assert r.exit_code == 0, r.output
    records = records_of(out)
    assert len(records) == 80
    expected = {None: "ok", "http_500": "http_error", "stall": "timeout"}
    expected |= {"malformed": "malformed_stream", "no_done": "incomplete"}
    for rec in records:
        fault = served[rec["request_id"]]
        assert rec["outcome"] == expected[fault], (fault, rec["error"])
        if rec["outcome"] == "ok":
            assert rec["output_tokens"] == 32 and sum(rec["chunk_tokens"]) == 32
    summary, _ = load_run(out)
    for lv in summary.levels:
        ok = [
            x
            for x in records
            if x["outcome"] == "ok" and x["request_id"].startswith(f"r0-c{lv.concurrency}-")
        ]
        m = lv.metrics
        assert m.completed == len(ok) and m.output_tokens == 32 * len(ok)
        assert m.output_tok_s == pytest.approx(32 * len(ok) / m.wall_s)
        assert m.failed == 40 - len(ok) > 0
        assert lv.metrics_note and "unparseable lines skipped" in lv.metrics_note
    # the table: failures in their rows, counts per outcome, no nan for server tokens
    assert "nan" not in r.stdout
    assert "—¹" in r.stdout and "¹ no server token count (C=1 run 0): /metrics: " in r.stdout
    assert "outcomes: ok " in r.stdout and "http_error" in r.stdout
    assert r.stderr.count("warning:") == 1 and "not Prometheus text" in r.stderr


def test_metrics_with_some_garbage_keep_the_good_lines(tmp_path):
    with FaultServer(metrics="mixed") as server:
        summary = run_probe(
            ProbeConfig(
                url=server.url,
                model="fault-model",
                concurrency=[1],
                requests=3,
                input_tokens=8,
                output_tokens=5,
                warmup=False,
            ),
            tmp_path / "mixed.json",
        )
    (lv,) = summary.levels
    assert lv.server_deltas["vllm:generation_tokens_total"] == 15
    assert "unparseable lines skipped" in lv.metrics_note


def test_missing_metrics_are_noted_not_nan(tmp_path):
    out = tmp_path / "nometrics.json"
    with FaultServer(metrics="missing") as server:
        args = ["probe", "--url", server.url, "--model", "fault-model", "-c", "1"]
        args += ["--requests", "2", "--output-tokens", "4", "--input-tokens", "8"]
        r = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "nan" not in r.stdout and "HTTP 404" in r.stdout and "—¹" in r.stdout
    assert r.stderr.count("warning:") == 1


# the client on its own, with httpx mock transports ----------------------------------


def sse(*events: str) -> bytes:
    return "".join(f"data: {e}\n\n" for e in events).encode()


def chunk(text: str | None, completion: int | None, reason: str | None = None) -> str:
    obj: dict = {"choices": [{"index": 0, "text": text, "finish_reason": reason}]}
    if completion is not None:
        obj["usage"] = {"prompt_tokens": 4, "completion_tokens": completion}
    return json.dumps(obj)


def stream(body_or_handler, max_tokens=3, ignore_eos=True, timeouts=None) -> RequestRecord:
    def handler(request: httpx.Request) -> httpx.Response:
        if callable(body_or_handler):
            return body_or_handler(request)
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, content=body_or_handler, headers=headers)

    async def go() -> RequestRecord:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            spec = RequestSpec("x", "hello", max_tokens, ignore_eos)
            return await stream_one(
                client, "http://server", "m", "completions", spec, Clock(), None, timeouts
            )

    return asyncio.run(go())


def test_a_clean_stream_is_ok():
    r = stream(sse(chunk("a", 1), chunk("b", 2), chunk("c", 3, "length"), "[DONE]"))
    assert (r.outcome, r.error, r.output_tokens, r.chunk_tokens) == ("ok", None, 3, [1, 1, 1])
    assert r.ok and r.finish_reason == "length"


def test_without_usage_one_token_per_chunk_is_ok():
    r = stream(sse(chunk("a", None), chunk("b", None), chunk("c", None, "length"), "[DONE]"))
    assert r.outcome == "ok" and r.output_tokens == 3


def test_usage_only_on_the_last_choice_is_not_counted_twice():
    """llama.cpp-style: no usage per chunk, the total on a last chunk that has a choice."""
    last = json.dumps(
        {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 3},
        }
    )
    r = stream(sse(chunk("a", None), chunk("b", None), chunk("c", None), last, "[DONE]"))
    assert (r.outcome, r.output_tokens, r.chunk_tokens) == ("ok", 3, [1, 1, 1])
    body = sse(chunk("a", None), chunk("b", None), chunk("c", 3, "length"), "[DONE]")
    assert stream(body).chunk_tokens == [1, 1, 1] and stream(body).ok
    final = json.dumps({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}})
    body = sse(chunk("a", None), chunk("b", None), chunk("c", None, "length"), final, "[DONE]")
    r = stream(body)  # the usage counts fewer tokens than chunks of text streamed
    assert r.outcome == "malformed_stream" and "usage says 2" in r.error


def test_a_natural_stop_may_be_short():
    body = sse(chunk("a", 1), chunk("b", 2, "stop"), "[DONE]")
    assert stream(body, ignore_eos=False).outcome == "ok"
    assert stream(body, ignore_eos=True).outcome == "incomplete"


@pytest.mark.parametrize(
    ("body", "outcome", "words"),
    [
        (sse("[1, 2]"), "malformed_stream", "not a JSON object"),
        (sse('{"choices": 5}'), "malformed_stream", "'choices' is int"),
        (sse(chunk("a", 2), chunk("b", 1)), "malformed_stream", "usage fell from 2 to 1"),
        (sse(chunk("a", 1), chunk("b", 2), chunk("c", 3), "[DONE]"), "incomplete", "no finish"),
        (sse(chunk("a", 1), chunk("b", 2, "error"), "[DONE]"), "server_error_event", "'error'"),
        (sse(chunk("a", 1), '{"error": "boom"}'), "server_error_event", "boom"),
        (b"event: error\ndata: overloaded\n\n", "server_error_event", "overloaded"),
        (sse(chunk(None, None, "length"), "[DONE]"), "incomplete", "no tokens"),
    ],
)
def test_stream_faults(body, outcome, words):
    r = stream(body)
    assert r.outcome == outcome and words in r.error and not r.ok


def test_connect_failures():
    def timeout(request):
        raise httpx.ConnectTimeout("slow", request=request)

    def refused(request):
        raise httpx.ConnectError("refused", request=request)

    r = stream(timeout)
    assert (r.outcome, r.error) == ("timeout", "timeout (connect): ConnectTimeout")
    r = stream(refused)
    assert r.outcome == "connection_error" and r.error.startswith("connection: ConnectError")


def test_timeouts_default_within_the_total():
    cfg = ProbeConfig(url="http://u", model="m", concurrency=[1], timeout_s=5)
    assert cfg.timeouts() == Timeouts(connect=5, first_byte=5, chunk=5, total=5)
    cfg = ProbeConfig(url="http://u", model="m", concurrency=[1], chunk_timeout_s=2)
    assert cfg.timeouts() == Timeouts(connect=10, first_byte=300, chunk=2, total=600)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--chunk-timeout", "0"], "--chunk-timeout needs a positive number"),
        (["--first-byte-timeout", "nan"], "--first-byte-timeout needs a positive number"),
        (["--timeout", "-3"], "--timeout needs a positive number"),
        (["--timeout", "5", "--chunk-timeout", "9"], "chunk timeout (9 s) is longer than"),
        (["--requests", "0"], "--requests: input should be greater than or equal to 1"),
    ],
)
def test_bad_timeout_flags_exit_2(flags, words):
    r = CliRunner().invoke(app, ["probe", "--url", "http://127.0.0.1:9", "--model", "x", *flags])
    assert r.exit_code == 2 and words in r.stderr, r.output


# run files written before outcomes -------------------------------------------------


def test_records_without_an_outcome_read_as_before(tmp_path):
    log = tmp_path / "old.jsonl"
    lines = [
        {"type": "header", "url": "http://x", "model": "m"},
        {"type": "request", "concurrency": 1, "run": 0, "request_id": "a", "send": 0.0,
         "first_token": 0.1, "finish": 1.0, "output_tokens": 10, "error": None},
        {"type": "request", "concurrency": 1, "run": 0, "request_id": "b", "send": 0.0,
         "finish": 0.2, "error": "http 500: boom"},
        {"type": "request", "concurrency": 1, "run": 0, "request_id": "c", "send": 0.0,
         "finish": 0.2, "error": "something odd"},
    ]  # fmt: skip
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (lv,) = summarize_log(log).levels
    assert lv.outcomes == {"ok": 1, "http_error": 1, "failed": 1}
    assert lv.errors == {"http 500": 1, "something odd": 1}
    assert lv.metrics.completed == 1 and lv.metrics.output_tokens == 10


def test_an_old_summary_still_loads():
    summary, _ = load_run(Path("calibration/runs/cpu-vllm-tiny-qwen3.json"))
    assert all(lv.outcomes == {} for lv in summary.levels)  # written before outcomes
    assert level_outcomes(summary.levels[0]) == {"ok": summary.levels[0].metrics.completed}


# calibration and validate refuse levels with too many failures ---------------------


def run_with_failures(tmp_path, failed: int, requests: int = 20) -> Path:
    """The recorded CPU run with its first level rewritten to ``failed`` timeouts."""
    src = Path("calibration/runs/cpu-vllm-tiny-qwen3.json")
    summary, _ = load_run(src)
    lv = summary.levels[0]
    lv.metrics.requests, lv.metrics.failed = requests, failed
    lv.outcomes = {"ok": lv.metrics.completed, "timeout": failed}
    lv.errors = {"timeout (between chunks)": failed}
    out = tmp_path / "failing.json"
    out.write_text(summary.model_dump_json())
    out.with_suffix(".jsonl").write_text(src.with_suffix(".jsonl").read_text())
    return out


def test_calibration_refuses_a_level_with_too_many_failures(tmp_path):
    from capsim.calibration.published import dataset_from_run
    from capsim.errors import CapsimUserError

    clean = dataset_from_run(run_with_failures(tmp_path, failed=1))  # 5%: allowed
    path = run_with_failures(tmp_path, failed=2)  # 10%: refused
    with pytest.raises(CapsimUserError) as exc:
        dataset_from_run(path)
    assert "more than 5% of requests failed: C=1 run 0: 2 of 20 failed (2 timeout)" in str(
        exc.value
    )
    assert "--accept-failures" in exc.value.hint
    accepted = dataset_from_run(path, accept_failures=True)
    assert accepted.scenarios[0].points == clean.scenarios[0].points


@pytest.mark.parametrize("command", ["validate", "calibrate"])
def test_validate_and_calibrate_need_accept_failures(command, tmp_path):
    path = run_with_failures(tmp_path, failed=3)
    args = [command, str(path)]
    if command == "calibrate":
        args += ["--out", str(tmp_path / "profile.yaml")]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and "3 of 20 failed" in r.stderr and "Traceback" not in r.output
    if command == "validate":
        r = CliRunner().invoke(app, [*args, "--accept-failures"])
        assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    ("models", "words"),
    [
        ("garbage", "did not answer an OpenAI model list"),
        ("list", "did not answer an OpenAI model list"),
        ("ids_not_str", "did not answer an OpenAI model list"),
        ("data_null", "did not answer an OpenAI model list"),
        ("huge", "/v1/models answered more than 16,777,216 bytes"),
        ("drip", "no whole answer from /v1/models within 1 s"),
    ],
)
def test_a_model_list_the_probe_cannot_read_is_exit_2(models, words, tmp_path, monkeypatch):
    """/v1/models answering garbage, a bare list or entries without string ids was a
    traceback (issue 47); one that drips a byte at a time held the probe forever, and one
    of hundreds of MB was read whole. Nothing is left on disk."""
    from capsim.probe import runner

    # the drip is cut at a second; the others keep the default, which a busy host needs to
    # stream the 16 MB the huge answer sends before the probe stops reading it
    if models == "drip":
        monkeypatch.setattr(runner, "INFO_SECONDS", 1.0)
    out = tmp_path / "run.json"
    with FaultServer(models=models) as server:
        r = CliRunner().invoke(app, server.probe_args("--requests", "2", "--out", str(out)))
    assert r.exit_code == 2, r.output
    assert words in r.stderr and "Traceback" not in r.output, r.stderr
    assert not out.exists() and not out.with_suffix(".jsonl").exists()


def test_a_tokenize_that_does_not_count_the_prompt_is_exit_2(tmp_path):
    """A /tokenize that answers the same three tokens for any prompt kept the probe
    doubling its prompt until memory ran out (1.3 GB at 20 s, issue 47)."""
    out = tmp_path / "run.json"
    with FaultServer(tokenize_constant=True) as server:
        args = server.probe_args("--requests", "2", "--input-tokens", "64", "--out", str(out))
        r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "it does not tokenise the prompt it is sent" in r.stderr, r.stderr


def test_a_huge_metrics_page_is_not_read(tmp_path):
    """/metrics past 8 MB is a failed scrape, warned about, not 442 MB and 20 s a scrape."""
    out = tmp_path / "run.json"
    with FaultServer(metrics="huge") as server:
        r = CliRunner().invoke(app, server.probe_args("--requests", "2", "--out", str(out)))
    assert r.exit_code == 0, r.output
    assert "the page has more than 8,388,608 bytes" in " ".join(r.stderr.split()), r.stderr


def test_a_server_that_stops_answering_is_exit_2_keeping_what_it_measured(tmp_path):
    """Every stream reset: the probe stops the run and says why, exit 2 (it was exit 1
    with no reason); the requests it sent are in the log."""
    out = tmp_path / "run.json"
    with FaultServer(every={1: "reset"}) as server:
        r = CliRunner().invoke(app, server.probe_args("--requests", "8", "--out", str(out)))
    assert r.exit_code == 2, r.output
    assert "the server stopped answering (connection: " in r.stderr, r.stderr
    assert records_of(out)


def test_a_run_whose_every_request_failed_is_exit_2_and_kept(tmp_path):
    """Every request answered HTTP 500: nothing was measured, so the probe says so and
    exits 2 (it exited 0 over a table of failures); the failures stay in the run file."""
    out = tmp_path / "all-failed.json"
    with FaultServer(every={1: "http_500"}, tokenize=False) as server:
        r = CliRunner().invoke(app, server.probe_args("--requests", "4", "--out", str(out)))
    assert r.exit_code == 2, r.output
    assert "every one of the 4 requests failed (most: http 500)" in r.stderr, r.stderr
    assert len(records_of(out)) == 4


def test_ctrl_c_stops_a_probe_with_exit_130_keeping_what_it_measured(tmp_path):
    """Ctrl-C (or SIGTERM) in a probe ended in exit 1, as a run the server cut short; it
    says what it kept and exits 130, its log on disk."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "stopped.json"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with FaultServer(token_delay_s=0.05, tokenize=False) as server:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "capsim",
                *server.probe_args("--requests", "20", "--output-tokens", "40", "--out", str(out)),
            ],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
            out.with_suffix(".jsonl").exists()
            and '"request"' in out.with_suffix(".jsonl").read_text()
        ):
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert b"interrupted: what was measured is in" in err and b"Traceback" not in err
    assert records_of(out)
