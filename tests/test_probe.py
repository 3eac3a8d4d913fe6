"""The probe against a local mock OpenAI-compatible server (no GPU, no vLLM needed)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest
from typer.testing import CliRunner

from capsim.cli.main import app
from capsim.probe.mock_server import free_port, spawn
from capsim.probe.prometheus import (
    acceptance_per_position,
    counter_deltas,
    parse_exposition,
    parse_metrics,
)
from capsim.probe.runfile import load_run, summarize_log
from capsim.probe.runner import ProbeConfig, run_probe
from tests.request_order import in_flight_at_sends
from tests.wall_clock import Check, cpu_share, judge_on_the_wall_clock


def start_mock(port: int, delay: float = 0.002) -> subprocess.Popen:
    return spawn(port, token_delay_s=delay)


@pytest.fixture(scope="module")
def mock_url():
    port = free_port()
    proc = start_mock(port)
    yield f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("workload", ["closed", "batch"])
def test_probe_levels_and_token_accounting(mock_url, tmp_path, workload, monkeypatch):
    monkeypatch.setenv("CAPSIM_TEST_KEY", "secret-key-do-not-store")
    cfg = ProbeConfig(
        url=mock_url,
        model="mock-model",
        concurrency=[1, 2, 4],
        workload=workload,
        requests=8,
        input_tokens=40,
        output_tokens=20,
        api_key_env="CAPSIM_TEST_KEY",
    )
    summary = run_probe(cfg, tmp_path / "run.json")
    assert summary.complete
    assert [lv.concurrency for lv in summary.levels] == [1, 2, 4]
    for lv in summary.levels:
        m = lv.metrics
        assert m.completed == 8 and m.failed == 0
        assert m.input_tokens == 8 * 40  # exact lengths through /tokenize
        assert m.output_tokens == 8 * 20
        assert lv.server_deltas["vllm:generation_tokens_total"] == 8 * 20
        assert m.itl_ms.count == 8 * 19
    text = (tmp_path / "run.json").read_text() + (tmp_path / "run.jsonl").read_text()
    assert "secret-key-do-not-store" not in text
    lines = (tmp_path / "run.jsonl").read_text().splitlines()
    assert sum(json.loads(line)["type"] == "request" for line in lines) == 24
    loaded, events = load_run(tmp_path / "run.json")
    assert loaded.header.workload == workload and len(events) == len(lines)


@pytest.mark.parametrize("workload", ["closed", "batch"])
def test_probe_keeps_c_in_flight_or_runs_rounds(mock_url, tmp_path, workload):
    """The order of sends and finishes, not their speed (which is the host's): a closed
    loop never has more than C in flight and sends the next while the others still run; a
    batch sends C at once and the next round only when the last of them has finished."""
    c = 3
    cfg = ProbeConfig(
        url=mock_url,
        model="mock-model",
        concurrency=[c],
        workload=workload,
        requests=12,
        input_tokens=16,
        output_tokens="uniform:5,60",
        seed=3,
    )
    run_probe(cfg, tmp_path / "run.json")
    _, events = load_run(tmp_path / "run.json")
    requests = [e for e in events if e["type"] == "request"]
    assert len(requests) == 12 and all(r["outcome"] == "ok" for r in requests)
    in_flight = in_flight_at_sends(requests)
    assert max(in_flight) == c, in_flight
    ordered = sorted(requests, key=lambda r: r["send"])
    rounds = [ordered[i : i + c] for i in range(0, len(ordered), c)]
    overlapping = [
        min(r["send"] for r in later) < max(r["finish"] for r in earlier)
        for earlier, later in pairwise(rounds)
    ]
    if workload == "batch":
        assert not any(overlapping), "a round was sent before the last one finished"
    else:  # lengths from 5 to 60 tokens: the next goes out while the others still run
        assert all(overlapping) and in_flight[c:].count(c) >= len(requests) // 2, in_flight


def test_killed_server_leaves_a_valid_partial_run(tmp_path):
    port = free_port()
    proc = start_mock(port, delay=0.02)
    cfg = ProbeConfig(
        url=f"http://127.0.0.1:{port}",
        model="mock-model",
        concurrency=[2, 4],
        requests=40,
        input_tokens=20,
        output_tokens=30,
        warmup=False,
        timeout_s=10,
    )
    out = tmp_path / "partial.json"
    runner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, json; from pathlib import Path; "
            "from capsim.probe.runner import ProbeConfig, run_probe; "
            f"run_probe(ProbeConfig.model_validate_json({cfg.model_dump_json()!r}), "
            f"Path({str(out)!r}))",
        ],
    )
    deadline = time.time() + 20
    while time.time() < deadline:
        if (
            out.with_suffix(".jsonl").exists()
            and out.with_suffix(".jsonl").read_text().count('"type":"request"') >= 5
        ):
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    runner.wait(timeout=60)
    summary, events = load_run(out)
    assert not summary.complete
    requests = [e for e in events if e["type"] == "request"]
    assert len(requests) >= 5
    failed = [e for e in requests if e.get("error")]
    assert failed, "requests cut off by the dead server must be recorded with a reason"
    rebuilt = summarize_log(out.with_suffix(".jsonl"))
    assert sum(lv.metrics.requests for lv in rebuilt.levels) == len(requests)


def test_torn_last_line_is_skipped(tmp_path, mock_url):
    cfg = ProbeConfig(
        url=mock_url,
        model="mock-model",
        concurrency=[1],
        requests=2,
        input_tokens=10,
        output_tokens=5,
    )
    run_probe(cfg, tmp_path / "r.json")
    log = tmp_path / "r.jsonl"
    log.write_text(log.read_text() + '{"type": "request", "truncat')
    summary = summarize_log(log)
    assert summary.levels[0].metrics.completed == 2


def test_summarize_keeps_server_counters_and_refuses_bad_records(tmp_path, mock_url):
    cfg = ProbeConfig(
        url=mock_url, model="mock-model", concurrency=[1, 2], requests=2, output_tokens=5
    )
    summary = run_probe(cfg, tmp_path / "s.json")
    rebuilt = summarize_log(tmp_path / "s.jsonl")
    for got, want in zip(rebuilt.levels, summary.levels, strict=True):
        assert got.server_deltas == want.server_deltas
        assert got.server_deltas["vllm:generation_tokens_total"] == 10
        assert got.outcomes == want.outcomes == {"ok": 2}
    log = tmp_path / "s.jsonl"
    bad = '{"type":"request","concurrency":1,"run":0,"request_id":"z","send":0,"outcome":"meh"}'
    log.write_text(log.read_text() + bad + "\n")
    r = CliRunner().invoke(app, ["probe", "summarize", str(log)])
    assert r.exit_code == 2 and "request 'z' is not a capsim record" in r.stderr


def test_prometheus_parsing_and_deltas():
    before = parse_metrics(
        'vllm:generation_tokens_total{model_name="m"} 10\n'
        'vllm:spec_decode_num_drafts_total{model_name="m"} 100\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 80\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 50\n'
        '# HELP x\nvllm:num_requests_running{engine="0"} 3\n'
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1\n'
    )
    after = parse_metrics(
        'vllm:generation_tokens_total{model_name="m"} 110\n'
        'vllm:spec_decode_num_drafts_total{model_name="m"} 200\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 160\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 90\n'
    )
    assert before["cache_config"]["num_gpu_blocks"] == "100"
    assert before["vllm:num_requests_running"] == 3
    deltas = counter_deltas(before, after)
    assert deltas["vllm:generation_tokens_total"] == 100
    assert acceptance_per_position(deltas) == pytest.approx([0.8, 0.4])


def test_parse_exposition_skips_and_counts_garbage():
    text = (
        "# HELP vllm:generation_tokens_total tokens\n"
        'vllm:generation_tokens_total{model_name="m"} 10\n'
        "<html>\n"
        'vllm:num_requests_running{model_name="m"} abc\n'
        "\n"
        'vllm:num_requests_running{model_name="m"} 2\n'
    )
    parsed = parse_exposition(text)
    assert parsed.values == {
        "vllm:generation_tokens_total": 10.0,
        "vllm:num_requests_running": 2.0,
    }
    assert parsed.skipped == 2 and parsed.first_skipped == "<html>"


def test_probe_cli_errors(mock_url):
    runner = CliRunner()
    r = runner.invoke(
        app, ["probe", "--url", mock_url, "--model", "mock-modl", "--concurrency", "1"]
    )
    assert r.exit_code == 2 and "did you mean: mock-model" in r.stderr
    r = runner.invoke(app, ["probe", "--url", "http://127.0.0.1:9", "--model", "x"])
    assert r.exit_code == 2 and "cannot reach" in r.stderr
    r = runner.invoke(
        app, ["probe", "--url", mock_url, "--model", "mock-model", "--engine-flag", "oops"]
    )
    assert r.exit_code == 2 and "KEY=VALUE" in r.stderr
    r = runner.invoke(app, ["probe", "--url", mock_url, "--model", "mock-model", "--spec", "mtp"])
    assert r.exit_code == 2 and "cannot read --spec" in r.stderr


def test_probe_cli_writes_run_and_json(mock_url, tmp_path):
    out = tmp_path / "cli.json"
    r = CliRunner().invoke(
        app,
        [
            "probe",
            "--url",
            mock_url,
            "--model",
            "mock-model",
            "--concurrency",
            "1,2",
            "--requests",
            "4",
            "--input-tokens",
            "10",
            "--output-tokens",
            "5",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["complete"] and [lv["concurrency"] for lv in data["levels"]] == [1, 2]
    r = CliRunner().invoke(app, ["probe", "summarize", str(out.with_suffix(".jsonl")), "--json"])
    assert r.exit_code == 0 and len(json.loads(r.stdout)["levels"]) == 2


def test_simulator_on_probed_step_times_reproduces_batch_vs_closed(tmp_path):
    """Issue 8's loop on the mock server: probe closed levels, build a step-time table,
    then probe and simulate C=6 in both workloads with the same length draws."""
    from capsim.calibration.step_table import step_table_from_run
    from capsim.engine.lengths import parse_length
    from capsim.engine.levels import simulate_level
    from capsim.engine.setup import measured_setup
    from capsim.engine.workloads import Workload

    def simulate(table) -> dict:
        setup = measured_setup(table, kv_capacity_tokens=1 << 20, max_model_len=4096)
        return {
            kind: simulate_level(
                setup,
                Workload(
                    kind=kind,
                    concurrency=6,
                    requests=24,
                    input=parse_length("32"),
                    output=parse_length("uniform:10,120"),
                ),
                seed=5,
            ).metrics
            for kind in ("closed", "batch")
        }

    def attempt(i: int) -> list[Check]:
        sweep = run_probe(
            ProbeConfig(
                url=url,
                model="mock-model",
                concurrency=[1, 2, 4, 6],
                requests=12,
                input_tokens=32,
                output_tokens=60,
            ),
            tmp_path / f"sweep-{i}.json",
        )
        simulated = simulate(step_table_from_run(sweep))
        # each workload twice, interleaved, keeping its faster run: other processes only
        # ever slow a wall-clock run down, so the faster one is the less disturbed
        measured, shares = {}, [cpu_share()]
        for repeat in range(2):
            for kind in ("closed", "batch"):
                run = run_probe(
                    ProbeConfig(
                        url=url,
                        model="mock-model",
                        concurrency=[6],
                        workload=kind,
                        requests=24,
                        input_tokens=32,
                        output_tokens="uniform:10,120",
                        seed=5,
                    ),
                    tmp_path / f"{kind}-{i}-{repeat}.json",
                )
                metrics = run.levels[0].metrics
                if kind not in measured or metrics.output_tok_s > measured[kind].output_tok_s:
                    measured[kind] = metrics
                shares.append(cpu_share())
        assert measured["batch"].output_tokens == simulated["batch"].output_tokens
        measured_ratio = measured["batch"].output_tok_s / measured["closed"].output_tok_s
        simulated_ratio = simulated["batch"].output_tok_s / simulated["closed"].output_tok_s
        assert simulated_ratio < 0.95  # the batch tail costs throughput
        label = f"batch/closed tok/s, measured vs simulated (cpu share {min(shares):.2f})"
        return [Check(label, measured_ratio, simulated_ratio, 0.12, relative=False)]

    port = free_port()
    proc = start_mock(port, delay=0.004)
    url = f"http://127.0.0.1:{port}"
    try:
        # Quiet runs measure 0.79 against 0.825 simulated; a busy host once measured 1.85
        # tolerances off. A probe whose batch workload did not leave the tail to drain alone
        # (ratio about 1.0, 1.46 tolerances) is caught by the order of its sends and
        # finishes, whatever the host's speed (test_probe_keeps_c_in_flight_or_runs_rounds),
        # so the band here is the host's: beyond 3 tolerances (0.36 in the ratio) the
        # simulator and the probe disagree by more than any host has shown.
        judge_on_the_wall_clock(attempt, noise_band=3.0)
    finally:
        proc.kill()


def test_a_rebuilt_summary_is_complete_only_when_every_planned_level_finished(tmp_path):
    from capsim.probe.runfile import summarize_log

    run = Path(__file__).resolve().parent.parent / "calibration" / "runs" / "cpu-vllm-tiny-qwen3"
    lines = run.with_suffix(".jsonl").read_text().splitlines()
    whole = tmp_path / "whole.jsonl"
    whole.write_text("\n".join(lines) + "\n")
    assert summarize_log(whole.with_suffix(".json")).complete  # 4 levels x 2 runs finished
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:100]) + "\n")
    assert not summarize_log(cut.with_suffix(".json")).complete


def test_a_log_with_records_at_a_level_its_header_does_not_plan_is_refused(tmp_path):
    """A record at concurrency 1,000,000 under a header of 1..16 was summarised as a level
    of that name holding the C=16 metrics (issue 47's fourth audit)."""
    import json

    from capsim.errors import CapsimUserError
    from capsim.probe.runfile import summarize_log

    run = Path(__file__).resolve().parent.parent / "calibration" / "runs" / "cpu-vllm-tiny-qwen3"
    lines = run.with_suffix(".jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    first = next(i for i, e in enumerate(events) if e.get("type") == "request")
    events[first]["concurrency"] = 1_000_000
    log = tmp_path / "moved.jsonl"
    log.write_text("\n".join(json.dumps(e) for e in events) + "\n")
    with pytest.raises(CapsimUserError, match="does not plan"):
        summarize_log(log)
