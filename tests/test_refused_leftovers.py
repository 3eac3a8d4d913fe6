"""What the first two fuzzing rounds of issue 47 left open is refused with a clear error
(exit 2, a line naming the file, field or flag and the allowed range), never taken
silently: catalog overlays whose figures contradict each other, imported results whose
aggregates contradict their requests, probe records out of order, absurd kernel rows,
measurement datasets whose percentiles are out of order, a CPU offload above the weights,
and calibration profiles of NaN."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from capsim.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
DB = ROOT / "hardware_db"
runner = CliRunner()
PREDICT = ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "-c", "1", "--requests", "4"]


def refused(args: list[str], *says: str) -> str:
    """Run ``args``: exit 2, no traceback, each of ``says`` in the message; returns the
    message on one line."""
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    flat = " ".join(r.output.split())
    for words in says:
        assert words in flat, r.output
    return flat


def overlay(tmp_path: Path, section: str, name: str, old: str, new: str) -> Path:
    """A --db folder holding the built-in entry ``section/name.yaml`` with ``old`` made
    ``new``."""
    text = (DB / section / f"{name}.yaml").read_text()
    assert old in text
    (tmp_path / section).mkdir()
    (tmp_path / section / f"{name}.yaml").write_text(text.replace(old, new, 1))
    return tmp_path


@pytest.mark.parametrize(
    "section, name, old, new, says",
    [
        (
            "gpus",
            "h100-sxm",
            "memory_gb: 80\n",
            "memory_gb: 80\nusable_memory_gb: 200\n",
            ["usable_memory_gb (200 GB) is above memory_gb (80 GB)", "at most memory_gb"],
        ),
        (
            "models",
            "llama-3.1-8b",
            "max_position_embeddings: 131072",
            "max_position_embeddings: 8",
            ["max_position_embeddings", "greater than or equal to 16"],
        ),
        (
            "models",
            "llama-3.1-8b",
            "total_b: 8.0",
            "total_b: 1e300",
            [
                "llama-3.1-8b.yaml:61: invalid entry: published.total_b: 1e+300 billion is not "
                "within a factor of 2 of the 8.03 billion parameters",
                "(4.02 to 16.1 billion)",
            ],
        ),
        (
            "quant_formats",
            "awq-int4",
            "weight_bits: 4",
            "weight_bits: 1e-300",
            ["awq-int4.yaml:", "weight_bits", "greater than or equal to 1"],
        ),
    ],
)
def test_a_catalog_overlay_that_contradicts_itself_is_refused(
    tmp_path, section, name, old, new, says
):
    """Each was taken: a GPU using more memory than it has, a model of an 8-token context
    that 'did not fit' any GPU, a published total 1e300 times the computed one, weights of
    1e-300 bits that weighed nothing (issue 47, the third round)."""
    db = overlay(tmp_path, section, name, old, new)
    refused([*PREDICT, "--quant", "awq-int4", "--db", str(db)], f"{name}.yaml", *says)


def test_leading_dense_layers_beyond_the_layers_are_refused(tmp_path):
    db = overlay(
        tmp_path, "models", "deepseek-r1", "first_dense_layers: 3", "first_dense_layers: 99"
    )
    refused(
        ["models", "--db", str(db)], "moe.first_dense_layers (99) must be below num_layers (61)"
    )


def test_an_overlays_published_count_is_checked_through_the_api_too(tmp_path):
    import capsim

    db = overlay(tmp_path, "models", "llama-3.1-8b", "total_b: 8.0", "total_b: 1e300")
    with pytest.raises(capsim.CapsimUserError, match=r"published\.total_b: 1e\+300 billion"):
        capsim.load_catalog([db])


def test_every_shipped_entry_passes_the_new_checks():
    """Read with no cache, every built-in entry passes the schemas' new checks (their
    published counts: tests/test_parameters.py, to 2%)."""
    import os
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "capsim", "models", "--all"],
        capture_output=True,
        text=True,
        env={**os.environ, "CAPSIM_NO_CACHE": "1"},
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "change, says",
    [
        (
            {"output_throughput": 1e9},
            "output_throughput is 1e+09 tok/s, but total_output_tokens / duration (800 / 10 s)",
        ),
        ({"mean_ttft_ms": 1e6}, "mean_ttft_ms is 1e+06 ms, but the mean of the successful"),
        ({"duration": 1e-9}, "total_output_tokens / duration (800 / 1e-09 s) gives 8e+11"),
        ({"request_throughput": 40}, "request_throughput is 40 req/s, but completed / duration"),
        ({"total_output_tokens": 8000, "output_throughput": 800}, "total_token_throughput"),
        ({"mean_e2el_ms": 100}, "mean_e2el_ms is 100 ms"),
        (
            # every rate agrees with the duration, yet each request took 4.9 s of it
            {
                "duration": 1.0,
                "request_throughput": 4,
                "output_throughput": 800,
                "total_token_throughput": 4896,
            },
            "duration is 1 s, yet a request took 4.926 s",
        ),
    ],
)
def test_a_bench_result_whose_aggregates_contradict_its_requests_is_refused(tmp_path, change, says):
    """vllm bench computes each aggregate from the requests it lists and its duration;
    these were imported as measured (issue 47, the third round)."""
    from tests.test_importers import VLLM_BENCH

    path = tmp_path / "result.json"
    path.write_text(json.dumps({**VLLM_BENCH, **change}))
    out = tmp_path / "run.json"
    refused(["import", "vllm-bench", str(path), "--out", str(out)], "result.json", says)
    assert not out.exists()


def test_an_imported_mean_ttft_above_the_mean_latency_is_refused(tmp_path):
    from tests.test_importers import AIPERF

    records = {**AIPERF["records"], "time_to_first_token": {"unit": "s", "avg": 95.0}}
    path = tmp_path / "profile_export_aiperf.json"
    path.write_text(json.dumps({**AIPERF, "records": records}))
    refused(
        ["import", "aiperf", str(path), "--out", str(tmp_path / "run.json")],
        "the mean TTFT (95000 ms) is above the mean E2E latency (2900 ms)",
    )


RUN_LOG = ROOT / "calibration" / "runs" / "cpu-vllm-tiny-qwen3.jsonl"


@pytest.mark.parametrize(
    "change, says",
    [
        (
            lambda r: r.update(first_scheduled=r["finish"] + 1),
            "first_scheduled (1.56846) comes after first_token",
        ),
        (
            lambda r: r.update(first_scheduled=r["send"] - 1),
            "first_scheduled (-0.761766) comes before send",
        ),
        (
            lambda r: r["chunk_times"].__setitem__(-1, r["finish"] + 5),
            "the last chunk (5.56846) comes after finish (0.568462)",
        ),
        (
            lambda r: r.update(cached_tokens=600),
            "cached_tokens (600) is above input_tokens (512)",
        ),
    ],
)
def test_a_run_log_record_out_of_order_is_refused_naming_its_line(tmp_path, change, says):
    """Each was summarized as measured: a request scheduled after it finished (a queueing
    time longer than the request), chunks after the end, more cached prompt tokens than
    the prompt had."""
    lines = RUN_LOG.read_text().splitlines()
    record = json.loads(lines[1])
    change(record)
    lines[1] = json.dumps(record)
    log = tmp_path / "run.jsonl"
    log.write_text("\n".join(lines) + "\n")
    refused(["probe", "summarize", str(log)], "run.jsonl', line 2: request 'r0-c1-0'", says)


KERNELS = ROOT / "calibration" / "kernels" / "h100-sxm-decode-layers.json"


@pytest.mark.parametrize(
    "change, says",
    [
        (
            {"achieved_gb_s": 1e12},
            "rows.3: achieved_gb_s is 1e+12 GB/s, yet (weight_bytes_per_layer + "
            "kv_bytes_per_layer) / us_per_layer gives 2170.52 GB/s",
        ),
        ({"achieved_gb_s": 0}, "rows.3.achieved_gb_s: Input should be greater than 0"),
        ({"achieved_gb_s": -5}, "rows.3.achieved_gb_s: Input should be greater than 0"),
        (
            {"us_per_layer": 1e-3, "achieved_gb_s": None},
            "rows.3.us_per_layer: the row moves 5.03349e+08 GB/s",
        ),
    ],
)
def test_a_kernel_row_beyond_its_bytes_or_its_gpu_is_refused(tmp_path, change, says):
    """An achieved bandwidth of 1e12 GB/s, 0 or below, or a layer time that moves its bytes
    at 150,000 times the H100's 3,350 GB/s was fitted without a word."""
    data = json.loads(KERNELS.read_text())
    data["rows"][3].update(change)
    path = tmp_path / "kernels.json"
    path.write_text(json.dumps(data))
    refused(["calibrate-kernels", str(path)], "kernels.json", says)


def test_a_kernel_row_faster_than_twice_its_gpu_is_refused_with_the_range(tmp_path):
    data = json.loads(KERNELS.read_text())
    row = data["rows"][3]
    row["us_per_layer"] /= 10  # 21,705 GB/s, stated consistently
    row["achieved_gb_s"] *= 10
    path = tmp_path / "kernels.json"
    path.write_text(json.dumps(data))
    refused(
        ["calibrate-kernels", str(path)],
        "rows.3.achieved_gb_s: the row moves 21705.2 GB/s",
        "above 2 x h100-sxm's 3350 GB/s (at most 6700 GB/s)",
    )


ACCELMARK = ROOT / "calibration/published/corpus-accelmark-mixtral-8x7b-tp8-sharegpt.yaml"
E2E_POINT = """  - concurrency: 1
    metric: e2e_s
    statistic: median
    value: 0.01
    quote: 'made up'
  - concurrency: 8
    metric: output_tok_s
    value: 591.5
"""


@pytest.mark.parametrize(
    "old, new, says",
    [
        (
            "value: 0.00756",
            "value: 0.001",
            "scenario 'h200-mixtral-8x7b-bf16-vllm-tp8', concurrency 1: tpot_s p99 (0.001) "
            "is below its median (0.00663): percentiles run median <= p90 <= p99",
        ),
        (
            "  - concurrency: 8\n    metric: output_tok_s\n    value: 591.5\n",
            E2E_POINT,
            "concurrency 1: ttft_s median (0.05326 s) is above e2e_s median (0.01 s)",
        ),
    ],
)
def test_a_dataset_whose_latencies_are_out_of_order_is_refused(tmp_path, old, new, says):
    """Both were compared with predictions as measured (issue 47, the third round)."""
    text = ACCELMARK.read_text()
    assert text.count(old) == 1
    path = tmp_path / "dataset.yaml"
    path.write_text(text.replace(old, new))
    refused(["validate", str(path)], "dataset.yaml:", says)


@pytest.mark.parametrize(
    "command",
    [
        ["fit", "--gpu", "rtx3090", "--model", "qwen3-0.6b"],
        ["capacity", "--gpu", "rtx3090", "--model", "qwen3-0.6b", "--min-agent-tok-s", "1"],
    ],
)
def test_cpu_offload_past_the_weights_is_said_by_every_command(command):
    """vLLM takes a --cpu-offload-gb above the weights (it offloads parameters until the
    size is reached or none are left), so capsim does too; predict said so, fit and
    capacity kept all the weights in system RAM without a word."""
    r = runner.invoke(app, [*command, "--cpu-offload-gb", "100"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "--cpu-offload-gb 100 is more than a GPU's 1.11 GiB of weights" in text, r.output
    assert "(0 to 1.11 keeps a part on the GPU)" in text
    r = runner.invoke(app, [*command, "--cpu-offload-gb", "1"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "is more than a GPU's" not in " ".join(r.output.split())


PROFILE = ROOT / "calibration" / "profiles" / "consumer-ampere-vllm.yaml"


@pytest.mark.parametrize(
    "old, new, says",
    [
        (
            "  error: -0.016688114687333222",
            "  error: .nan",
            "residuals.0.error: Input should be a finite",
        ),
        ("  measured: 167.0", "  measured: .nan", "residuals.0.measured: Input should be a finite"),
        ("  predicted: 164.21308484721536", "  predicted: .inf", "residuals.0.predicted"),
        (
            "  concurrency: 1\n",
            "  concurrency: -3\n",
            "residuals.0.concurrency: Input should be greater",
        ),
        (
            "  async_host_overlap: 0.0",
            "  async_host_overlap: .nan",
            "held.async_host_overlap: Input",
        ),
        (
            "    value: 0.8533317031418048",
            "    value: .nan",
            "parameters.bandwidth_efficiency.value",
        ),
    ],
)
def test_a_profile_of_non_finite_numbers_is_refused_naming_the_field(tmp_path, old, new, says):
    """A NaN residual (measured, predicted or error) or a level of -3 was read as fitted;
    a NaN held parameter was refused without naming its field."""
    text = PROFILE.read_text()
    assert old in text
    path = tmp_path / "consumer-ampere-vllm.yaml"
    path.write_text(text.replace(old, new, 1))
    args = ["predict", "--gpu", "rtx3090", "--model", "qwen3-0.6b", "-c", "1", "--requests", "4"]
    refused([*args, "--profile", str(path)], "consumer-ampere-vllm.yaml:", says)
