"""The probe refuses what it cannot do within bounded memory and says why (issue 47):
--requests, --input-tokens and --runs have ceilings, a level's prompts (made before its
clock starts) are bounded in tokens, a named API-key variable must be set, and a server
whose /tokenize refuses a prompt is an error naming its answer, not a KeyError."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from typer.testing import CliRunner

from capsim.cli.main import app
from capsim.errors import CapsimUserError
from capsim.probe.prompts import PromptFactory
from capsim.probe.runner import MAX_PROBE_LEVEL_TOKENS

runner = CliRunner()
PROBE = ["probe", "--url", "http://127.0.0.1:9", "--model", "m", "-c", "1", "--no-warmup"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--requests", "99999999999"], "--requests: input should be less than or equal to"),
        (["--input-tokens", "99999999999"], "--input-tokens: input should be less than"),
        (["--runs", "100000"], "--runs: input should be less than or equal to 1000"),
        (["--requests", "100000", "--input-tokens", "1000"], "100,000,000 tokens, above"),
        (["--api-key-env", "CAPSIM_TEST_SURELY_UNSET"], "environment variable is not set"),
    ],
)
def test_a_probe_beyond_its_bounds_is_refused_before_it_starts(tmp_path, args, words):
    out = tmp_path / "run.json"
    r = runner.invoke(app, [*PROBE, "--out", str(out), *args])
    assert r.exit_code == 2 and words in r.output, r.output
    assert not out.exists() and not out.with_suffix(".jsonl").exists()


def test_the_level_bound_is_the_product_of_requests_and_prompt_tokens(tmp_path):
    """Right at the bound the configuration is accepted (the run then fails to connect)."""
    per = MAX_PROBE_LEVEL_TOKENS // 16
    r = runner.invoke(
        app,
        [*PROBE, "--out", str(tmp_path / "r.json"), "--requests", "16", "--input-tokens", str(per)],
    )
    assert "above the" not in r.output and "cannot reach" in r.output, r.output


def test_a_tokenize_answer_without_tokens_is_an_error_naming_it():
    """vLLM answers a prompt beyond the context with 400 and an error object: the probe
    names it (and the cure) instead of a KeyError on 'tokens'."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "maximum context length is 4096"}})

    factory = PromptFactory("http://server", "m", "completions")
    factory.exact = True

    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            await factory.prompt(client, "k", 200_000)

    with pytest.raises(CapsimUserError) as err:
        asyncio.run(main())
    assert "HTTP 400" in str(err.value) and "maximum context length" in str(err.value)
    assert "--input-tokens" in err.value.hint


def test_a_probe_refused_before_it_measured_leaves_no_run_file(tmp_path):
    """A server whose /tokenize refuses the prompts: the probe stops before sending a
    measured request, and leaves no header-only run file that the next try would need
    --force to replace."""
    from tests.fault_server import FaultServer

    out = tmp_path / "run.json"
    with FaultServer(context=2048) as server:
        args = server.probe_args("--requests", "2", "--input-tokens", "4096", "--out", str(out))
        r = runner.invoke(app, args)
    assert r.exit_code == 2 and "maximum context length is 2048" in r.output, r.output
    assert not out.exists() and not out.with_suffix(".jsonl").exists()


@pytest.mark.parametrize(
    "flag", ["max-num-seqs=abc", "max_model_len=0", "max-num-batched-tokens=1e3"]
)
def test_an_engine_flag_calibration_reads_must_be_a_count(tmp_path, flag):
    """The run recorded 'max-num-seqs: abc', and validate or calibrate then failed on it."""
    r = runner.invoke(app, [*PROBE, "--out", str(tmp_path / "r.json"), "--engine-flag", flag])
    assert r.exit_code == 2 and "takes a whole number of 1 or more" in r.output, r.output
