"""Issue 47's fifth audit (topology, offload and router flags): what predict refuses, fit
and explain refuse alike, and a dataset field that would change nothing is refused as
the flag it stands for is."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from capsim.cli.main import app

PUBLISHED = Path(__file__).resolve().parents[1] / "calibration" / "published"


@pytest.mark.parametrize(
    "line, says",
    [
        (
            "explain --gpu h200 --model llama-3.1-8b --prefill-replicas 1 --prefill-tp 3",
            "the prefill instances (TP 3)",
        ),
        (
            "explain --gpu h200 --model llama-3.1-8b --host-link-bandwidth 50",
            "--host-link-bandwidth applies to",
        ),
        (
            "explain --gpu h200 --model llama-3.1-8b --host-memory-bandwidth 50",
            "--host-memory-bandwidth applies to --n-cpu-moe",
        ),
        (
            "fit --gpu rtx3090 --model llama-3.1-8b --engine llama.cpp --cpu-offload-gb 4",
            "--cpu-offload-gb is vLLM's and SGLang's",
        ),
        (
            "fit --gpu rtx3090 --model llama-3.1-8b --engine llama.cpp --pp 2",
            "--pipeline-parallel-size",
        ),
        (
            "fit --gpu apple-m3-ultra --model llama-3.1-8b --pp 2",
            "lists no link between GPUs",
        ),
        (
            "predict --gpu apple-m3-ultra --model llama-3.1-8b --pp 2 -c 1",
            "lists no link between GPUs",
        ),
    ],
)
def test_fit_and_explain_refuse_what_predict_refuses(line, says):
    r = CliRunner().invoke(app, line.split(), env={"COLUMNS": "200"})
    assert r.exit_code == 2, r.output
    assert says in " ".join(r.output.split()), r.output


def test_dataset_fields_that_change_nothing_are_refused(tmp_path):
    base = yaml.safe_load(
        (PUBLISHED / "corpus-recipes-mi300x-qwen3guard-8b-vllm-1k1k-c32.yaml").read_text()
    )
    cases = {
        "gamma_cv applies to arrival: gamma": lambda d: d["workload"].update(gamma_cv=2.0),
        "describes an open workload's arrivals": lambda d: d["workload"].update(arrival="gamma"),
        "needs replicas": lambda d: d["scenarios"][0].update(router="random"),
    }
    for says, change in cases.items():
        data = yaml.safe_load(yaml.safe_dump(base))
        change(data)
        path = tmp_path / "d.yaml"
        path.write_text(yaml.safe_dump(data))
        r = CliRunner().invoke(app, ["validate", str(path)])
        assert r.exit_code == 2 and says in " ".join(r.output.split()), r.output


@pytest.mark.parametrize(
    "extra",
    [
        ["--tp", "4", "--pp", "2", "--pp-size", "4"],
        ["--tp", "2", "--tp", "4"],
        ["--tp", "4", "--context-length", "4096", "--max-model-len", "8192"],
    ],
)
def test_an_option_given_twice_is_refused_not_overwritten(extra):
    """'--pp 2 --pp-size 4' ran with the last value without a word (issue 47's fifth
    audit); options that take several values (--set) still repeat."""
    base = ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-70b", "-c", "1"]
    r = CliRunner().invoke(app, [*base, *extra], env={"COLUMNS": "200"})
    assert r.exit_code == 2 and "is given more than once" in r.output, r.output
    sets = ["--set", "step_overhead_us=300", "--set", "per_sequence_overhead_us=10"]
    r = CliRunner().invoke(app, [*base[:4], "llama-3.1-8b", "-c", "1", "--requests", "2", *sets])
    assert r.exit_code == 0, r.output
