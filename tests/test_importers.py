"""Importers: other tools' result files become capsim run files."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from capsim.cli.main import app
from capsim.errors import CapsimUserError
from capsim.probe.importers import import_results
from capsim.probe.runfile import load_run

runner = CliRunner()
VLLM_BENCH = {
    "date": "20261120-101500",
    "backend": "vllm",
    "model_id": "Qwen/Qwen3-8B",
    "num_prompts": 4,
    "request_rate": "inf",
    "max_concurrency": 2,
    "duration": 10.0,
    "completed": 4,
    "total_input_tokens": 4096,
    "total_output_tokens": 800,
    "request_throughput": 0.4,
    "output_throughput": 80.0,
    "total_token_throughput": 489.6,
    "mean_ttft_ms": 120.0,
    "median_ttft_ms": 110.0,
    "p99_ttft_ms": 200.0,
    "mean_tpot_ms": 24.0,
    "median_tpot_ms": 23.0,
    "p99_tpot_ms": 30.0,
    "mean_itl_ms": 24.0,
    "median_itl_ms": 22.0,
    "p99_itl_ms": 40.0,
    "mean_e2el_ms": 4900.0,
    "median_e2el_ms": 4800.0,
    "p99_e2el_ms": 5200.0,
    "input_lens": [1024] * 4,
    "output_lens": [200] * 4,
    "ttfts": [0.1, 0.12, 0.11, 0.15],
    "itls": [[0.024] * 199] * 4,
    "errors": ["", "", "", ""],
}
GUIDELLM = {
    "benchmarks": [
        {
            "type_": "generative_benchmark",
            "start_time": 100.0,
            "end_time": 130.0,
            "args": {"strategy": {"type_": "concurrent", "streams": 4}, "model": "m"},
            "metrics": {
                "request_totals": {"successful": 40, "errored": 1, "incomplete": 0},
                "requests_per_second": {"successful": {"mean": 1.3}},
                "output_tokens_per_second": {"successful": {"mean": 260.0}},
                "tokens_per_second": {"successful": {"mean": 900.0}},
                "time_to_first_token_ms": {
                    "successful": {
                        "mean": 90.0,
                        "median": 85.0,
                        "percentiles": {"p90": 120.0, "p99": 150.0},
                    }
                },
                "inter_token_latency_ms": {"successful": {"mean": 14.0, "median": 13.5}},
                "request_latency": {"successful": {"mean": 3.0, "median": 2.9}},
            },
        }
    ]
}
AIPERF = {
    "records": {
        "request_count": {"unit": "requests", "avg": 64},
        "benchmark_duration": {"unit": "sec", "avg": 32.0},
        "time_to_first_token": {"unit": "ms", "avg": 95.0, "p50": 90.0, "p90": 130.0, "p99": 170.0},
        "inter_token_latency": {"unit": "ms", "avg": 11.0, "p50": 10.5, "p90": 12.0, "p99": 15.0},
        "request_latency": {"unit": "ms", "avg": 2900.0, "p50": 2800.0},
        "output_token_throughput": {"unit": "tokens/sec", "avg": 1500.0},
        "request_throughput": {"unit": "requests/sec", "avg": 2.0},
    },
    "input_config": {
        "loadgen": {"concurrency": 8},
        "endpoint": {"model_names": ["Qwen/Qwen3-8B"], "url": "http://x:8000"},
    },
}


def test_vllm_bench_import(tmp_path):
    src = tmp_path / "bench.json"
    src.write_text(json.dumps(VLLM_BENCH))
    summary = import_results("vllm-bench", src, tmp_path / "run.json")
    (level,) = summary.levels
    m = level.metrics
    assert level.concurrency == 2 and m.workload == "closed"
    assert m.output_tok_s == 80.0 and m.ttft_ms.p50 == 110.0 and m.e2e_s.mean == 4.9
    assert m.per_request_output_tok_s.mean == pytest.approx(200 / (0.1 + 199 * 0.024), rel=0.05)
    loaded, events = load_run(tmp_path / "run.json")
    assert loaded.header.source == "vllm-bench"
    assert sum(e["type"] == "request" for e in events) == 4


def test_guidellm_and_aiperf_imports(tmp_path):
    g = tmp_path / "benchmarks.json"
    g.write_text(json.dumps(GUIDELLM))
    (level,) = import_results("guidellm", g, tmp_path / "g.json").levels
    assert level.concurrency == 4 and level.metrics.output_tok_s == 260.0
    assert level.metrics.tpot_ms.mean == 14.0 and level.metrics.wall_s == 30.0
    a = tmp_path / "profile_export_aiperf.json"
    a.write_text(json.dumps(AIPERF))
    (level,) = import_results("aiperf", a, tmp_path / "a.json").levels
    assert level.concurrency == 8 and level.metrics.output_tok_s == 1500.0
    assert level.metrics.e2e_s.mean == pytest.approx(2.9)


def test_import_errors(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"hello": 1}))
    for kind in ("vllm-bench", "guidellm", "aiperf"):
        with pytest.raises(CapsimUserError):
            import_results(kind, bad, tmp_path / "o.json")
    r = CliRunner().invoke(app, ["import", "vllm-bench", str(tmp_path / "missing.json")])
    assert r.exit_code == 2 and "does not exist" in r.stderr
    r = CliRunner().invoke(app, ["import", "aiperf", str(bad), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "time_to_first_token" in r.stderr


def test_a_result_with_too_many_requests_keeps_its_aggregates(tmp_path, monkeypatch):
    """Issue 47: a 51 MB vllm bench result of 1.5 million requests took 150 s to import;
    past MAX_IMPORTED_REQUESTS the level's aggregates are imported, no per-request records,
    and a note says so."""
    import capsim.probe.importers as importers
    from capsim.notices import take_notices
    from capsim.probe.runfile import read_events

    monkeypatch.setattr(importers, "MAX_IMPORTED_REQUESTS", 3)
    src = tmp_path / "vllm.json"
    src.write_text(json.dumps(VLLM_BENCH))
    take_notices()
    summary = import_results("vllm-bench", src, tmp_path / "run.json")
    assert summary.levels[0].metrics.output_tok_s == VLLM_BENCH["output_throughput"]
    events = read_events(tmp_path / "run.jsonl")
    assert not [e for e in events if e.get("type") == "request"]
    assert any("4 requests, more than the 3" in n for n in take_notices())


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"max_concurrency": 0}, "max_concurrency must be null or a whole number of 1 or more"),
        ({"input_lens": [5, 5]}, "per-request lists must be lists of one length"),
        ({"model_id": 5}, "model_id must be a string"),
    ],
)
def test_a_vllm_bench_result_of_nonsense_fields_is_refused(tmp_path, change, words):
    """Each was imported: a level at C=0, records with input lengths of 0, a model '5'."""
    path = tmp_path / "vb.json"
    path.write_text(json.dumps(VLLM_BENCH | change))
    out = tmp_path / "run.json"
    r = runner.invoke(app, ["import", "vllm-bench", str(path), "--out", str(out)])
    assert r.exit_code == 2 and words in r.output, r.output
    assert not out.exists()
    path.write_text(json.dumps(VLLM_BENCH))
    assert runner.invoke(app, ["import", "vllm-bench", str(path), "--out", str(out)]).exit_code == 0


def test_import_out_naming_a_folder_is_refused(tmp_path):
    """'--out impout/' wrote impout.json and impout.jsonl beside the folder."""
    result = tmp_path / "vb.json"
    result.write_text(json.dumps(VLLM_BENCH))
    (tmp_path / "impout").mkdir()
    r = runner.invoke(app, ["import", "vllm-bench", str(result), "--out", str(tmp_path / "impout")])
    assert r.exit_code == 2 and "is a folder" in r.output, r.output
    assert not (tmp_path / "impout.json").exists()


def _changed(base: dict, path: tuple, value) -> dict:
    """``base`` (deep-copied) with the field at ``path`` set to ``value``."""
    import copy

    data = copy.deepcopy(base)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


@pytest.mark.parametrize(
    ("kind", "base", "path", "value", "words"),
    [
        ("aiperf", AIPERF, ("records", "request_count", "avg"), -64, "request_count must be"),
        ("aiperf", AIPERF, ("input_config", "loadgen", "concurrency"), 8.9, "a whole number"),
        ("aiperf", AIPERF, ("records", "benchmark_duration", "avg"), -1, "benchmark_duration"),
        ("aiperf", AIPERF, ("records", "request_count", "avg"), 0, "holds no completed request"),
        ("guidellm", GUIDELLM, ("benchmarks", 0, "end_time"), 50.0, "wall_s is -50.0"),
        (
            "guidellm",
            GUIDELLM,
            ("benchmarks", 0, "args", "strategy", "streams"),
            -4,
            "streams must be",
        ),
        (
            "guidellm",
            GUIDELLM,
            ("benchmarks", 0, "metrics", "request_totals", "successful"),
            -40,
            "successful must be",
        ),
        (
            "guidellm",
            GUIDELLM,
            ("benchmarks", 0, "metrics", "output_tokens_per_second", "successful", "mean"),
            1e300,
            "must be a finite number from 0 to 1,000,000,000, not 1e+300",
        ),
        ("vllm-bench", VLLM_BENCH, ("duration",), 0, "duration is 0 for 4 completed requests"),
        ("vllm-bench", VLLM_BENCH, ("completed",), True, "completed must be a number"),
        ("vllm-bench", VLLM_BENCH, ("p99_ttft_ms",), 1.0, "ttft_ms's percentiles are out of"),
    ],
)
def test_a_result_of_nonsense_is_not_imported(tmp_path, kind, base, path, value, words):
    """Issue 47: negative counts and durations, an end before the start, a fractional
    concurrency, a p99 below its p50 or zero requests were written as runs, exit 0."""
    src = tmp_path / "result.json"
    src.write_text(json.dumps(_changed(base, path, value)))
    out = tmp_path / "run.json"
    r = runner.invoke(app, ["import", kind, str(src), "--out", str(out)])
    assert r.exit_code == 2 and words in " ".join(r.output.split()), r.output
    assert not out.exists() and not out.with_suffix(".jsonl").exists()


def test_a_name_with_control_characters_is_shown_escaped(tmp_path):
    """A result's model named with terminal escapes recoloured the terminal."""
    src = tmp_path / "vb.json"
    src.write_text(json.dumps(VLLM_BENCH | {"model_id": "\x1b[31mred\x1b[0m"}))
    r = runner.invoke(app, ["import", "vllm-bench", str(src), "--out", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\\x1b[31mred" in r.output
