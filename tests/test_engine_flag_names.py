"""The engines' own flag names are accepted beside capsim's (a user pastes what they pass
to vllm serve): --tensor-parallel-size, --data-parallel-size, --kv-cache-dtype,
--quantization, --max-running-requests (SGLang), and vLLM's --speculative-config JSON."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from capsim.cli.main import app
from capsim.physics.speculative import parse_spec

runner = CliRunner()
BASE = ["predict", "--gpu", "h100-sxm", "--model", "qwen3-30b-a3b", "-c", "2", "--json"]


def predicted(*args: str) -> dict:
    r = runner.invoke(app, [*BASE, *args])
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)["results"][0]
    return {k: result[k] for k in ("tp", "replicas", "quant", "kv_dtype", "points")}


def test_vllm_flag_names_predict_what_capsims_do():
    ours = predicted("--tp", "2", "--dp", "2", "--kv-dtype", "fp8", "--quant", "fp8")
    theirs = predicted(
        "--tensor-parallel-size",
        "2",
        "--data-parallel-size",
        "2",
        "--kv-cache-dtype",
        "fp8",
        "--quantization",
        "fp8",
    )
    assert theirs == ours
    assert predicted("--max-running-requests", "4") == predicted("--max-num-seqs", "4")


def test_sglang_flag_names_predict_what_capsims_do():
    """SGLang's --chunked-prefill-size, --context-length and --mem-fraction-static are
    capsim's --max-num-batched-tokens, --max-model-len and --gpu-memory-utilization, as
    is its --pp-size --pipeline-parallel-size."""
    sglang = ("--engine", "sglang")
    assert predicted(*sglang, "--chunked-prefill-size", "4096") == predicted(
        *sglang, "--max-num-batched-tokens", "4096"
    )
    assert predicted(*sglang, "--context-length", "8192") == predicted(
        *sglang, "--max-model-len", "8192"
    )
    assert predicted(*sglang, "--mem-fraction-static", "0.8") == predicted(
        *sglang, "--gpu-memory-utilization", "0.8"
    )


def test_speculative_config_json_is_the_spec_it_names():
    assert parse_spec('{"method": "deepseek_mtp", "num_speculative_tokens": 2}') == parse_spec(
        "mtp:2"
    )
    assert parse_spec('{"method": "eagle3", "num_speculative_tokens": 3}') == parse_spec("eagle:3")
    assert parse_spec(
        '{"method": "draft_model", "model": "qwen3-0.6b", "num_speculative_tokens": 4}'
    ) == parse_spec("draft:qwen3-0.6b:4")


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ('{"method": "medusa", "num_speculative_tokens": 2}', "not one capsim models"),
        ('{"method": "mtp", "num_speculative_tokens": 0}', "positive integer"),
        ('{"method": "mtp"', "not valid JSON"),
        ('["mtp", 2]', "JSON object"),
        ('{"method": "draft_model", "num_speculative_tokens": 2}', "needs a"),
        # a method that is not a string (a list or an object cannot be looked up)
        ('{"method": ["mtp"], "num_speculative_tokens": 2}', "not one capsim models"),
        ('{"method": {}, "num_speculative_tokens": 2}', "not one capsim models"),
    ],
)
def test_a_bad_speculative_config_is_exit_2(config, words):
    r = runner.invoke(
        app,
        [
            "predict",
            "--gpu",
            "h100-sxm",
            "--model",
            "qwen3-30b-a3b",
            "--speculative-config",
            config,
        ],
    )
    assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"method": "ngram", "num_speculative_tokens": 2, "bogus": 1}, "does not take: 'bogus'"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": -1}, "at least 1"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1.5}, "whole"),
    ],
)
def test_a_speculative_config_vllm_would_refuse_is_refused(config, words):
    """vLLM's SpeculativeConfig takes its own fields only, its windows at least 1: an unknown
    key and a window of -1 were dropped without a word (issue 47's fourth audit)."""
    from capsim.errors import CapsimUserError

    with pytest.raises(CapsimUserError, match=words):
        parse_spec(json.dumps(config))


def test_an_eagle_head_named_in_the_config_is_said_not_to_be_looked_up():
    from capsim.notices import take_notices

    take_notices()
    spec = parse_spec(json.dumps({"method": "eagle", "model": "x/y", "num_speculative_tokens": 3}))
    assert spec.method == "eagle" and spec.num_tokens == 3
    assert any("not looked up" in n for n in take_notices())
    ok = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}
    assert parse_spec(json.dumps(ok)).num_tokens == 4
