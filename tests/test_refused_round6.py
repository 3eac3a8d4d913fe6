"""The sixth hostile-input round of issue 47: what round 5 left open (another engine's
flag typed at its default value, a seed past 64 bits) and what a hunt of new hostile values
across every command found. Each bad input is exit 2 with a line naming the flag, file or
field, never a traceback; the valid neighbours still run."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from capsim.cli.main import app
from tests.test_refused_leftovers import refused

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
ONE = ["--gpu", "h100-sxm", "--model", "llama-3.1-8b"]
PREDICT = ["predict", *ONE, "-c", "1", "--requests", "4", "--output-tokens", "16"]


@pytest.mark.parametrize(
    "command, engine, flag, says",
    [
        (PREDICT, "vllm", ["--flash-attn", "auto"], "--flash-attn auto is llama.cpp's flag"),
        (PREDICT, "sglang", ["--n-cpu-moe", "0"], "--n-cpu-moe 0 is llama.cpp's flag"),
        (PREDICT, "llama.cpp", ["--cpu-offload-gb", "0"], "is vLLM's and SGLang's flag"),
        (PREDICT, "llama.cpp:vulkan", ["--cpu-offload-gb", "0"], "llama.cpp has none such"),
        (PREDICT, "sglang", ["--kv-offloading-size", "0"], "--kv-offloading-size 0 is vLLM's"),
        (PREDICT, "vllm", ["--scheduler-recv-interval", "1"], "is SGLang's flag; vLLM"),
        (["capacity", *ONE, "--min-agent-tok-s", "30"], "llama.cpp", ["--cpu-offload-gb", "0"], ""),
        (["fit", *ONE], "vllm", ["--n-cpu-moe", "0"], "--n-cpu-moe 0 is llama.cpp's flag"),
        (["explain", *ONE], "sglang", ["--flash-attn", "auto"], "SGLang has none such"),
        (["serve", *ONE], "vllm", ["--n-cpu-moe", "0"], "--n-cpu-moe 0 is llama.cpp's flag"),
    ],
)
def test_another_engines_flag_at_its_default_value_is_refused(command, engine, flag, says):
    """The deployment's checks refuse another engine's flag by its value: typed at the
    value that means 'not given' ('--engine llama.cpp --cpu-offload-gb 0', '--flash-attn
    auto' with vLLM) it passed them and ran without a word."""
    refused([*command, "--engine", engine, *flag], says, "would change nothing", "leave")


@pytest.mark.parametrize(
    "engine, flag",
    [
        ("sglang", ["--scheduler-recv-interval", "1"]),
        ("vllm", ["--cpu-offload-gb", "0"]),
        ("vllm", ["--kv-offloading-size", "0"]),
        ("llama.cpp", ["--n-cpu-moe", "0"]),
        ("llama.cpp", ["--flash-attn", "auto"]),
    ],
)
def test_an_engines_own_flag_at_its_default_value_is_taken(engine, flag):
    r = runner.invoke(app, [*PREDICT, "--engine", engine, *flag])
    assert r.exit_code == 0, r.output


def test_another_engines_flag_at_another_value_keeps_its_own_message():
    """Values the deployment's checks see keep their words: what the engine does instead."""
    refused(
        [*PREDICT, "--engine", "llama.cpp", "--gpu-memory-utilization", "0.5"],
        "--gpu-memory-utilization is not llama.cpp's; llama.cpp sizes its KV cache",
    )


@pytest.mark.parametrize("seed", [str(2**64), "1" + "0" * 300])
def test_a_seed_past_64_bits_is_refused_with_its_range(seed):
    """--seed 10**300 ran and wrote a 301-digit seed back into the results."""
    refused([*PREDICT, "--seed", seed], "--seed", "18446744073709551615")


def test_the_largest_seed_is_taken():
    r = runner.invoke(app, [*PREDICT, "--seed", str(2**64 - 1), "--json"])
    assert r.exit_code == 0, r.output


def test_a_probe_seed_past_64_bits_is_refused_before_any_request():
    r = runner.invoke(
        app, ["probe", "--url", "http://127.0.0.1:9", "--model", "m", "--seed", str(2**64)]
    )
    assert r.exit_code == 2 and "--seed" in r.output, r.output
    assert "less than or equal to 18446744073709551615" in r.output


def test_python_api_seed_past_64_bits_is_a_user_error():
    import capsim

    with pytest.raises(capsim.CapsimUserError, match="seed"):
        capsim.predict(gpu="h100-sxm", model="llama-3.1-8b", concurrency=[1], seed=2**64)


@pytest.mark.parametrize(
    "args, says",
    [
        ([*PREDICT, "--seed", "9" * 5000], "5,000 digits, is out of range (at most 1844674407"),
        (["fit", *ONE, "--max-num-seqs", "-" + "9" * 50], "out of range (1 to 2147483648)"),
    ],
)
def test_a_whole_number_of_thousands_of_digits_is_out_of_range(args, says):
    """Python reads no more than 4,300 digits: the error said only 'Unable to parse input
    string as an integer, exceeded maximum size', without the flag's range."""
    refused(args, says)


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("use_beam_search", [], "use_beam_search must be a boolean"),
        ("use_beam_search", "x", "use_beam_search must be a boolean"),
        ("request_id", True, "request_id must be a string"),
        ("request_id", 5, "request_id must be a string"),
        ("cache_salt", "", "'cache_salt' must be a non-empty string"),
        ("cache_salt", [], "'cache_salt' must be a non-empty string"),
        ("kv_transfer_params", True, "kv_transfer_params must be an object"),
        ("vllm_xargs", [1], "vllm_xargs must be an object of strings"),
        ("vllm_xargs", {"k": None}, "vllm_xargs must be an object of strings"),
        ("vllm_xargs", {"k": [None]}, "vllm_xargs must be an object of strings"),
    ],
)
@pytest.mark.parametrize("chat", [False, True])
def test_serve_types_the_fields_vllm_passes_on(field, value, says, chat):
    """vLLM's request models type these fields (a 400 for a client's mistake); capsim serve
    answered 200 to any value of them."""
    from capsim.serve.extra_fields import check_extra_fields
    from capsim.serve.requests import ApiError

    with pytest.raises(ApiError) as info:
        check_extra_fields({field: value}, chat, vocab_size=1000, max_model_len=4096)
    assert info.value.status == 400 and says in str(info.value)


def test_serve_takes_the_fields_vllm_passes_on_well_formed():
    from capsim.serve.extra_fields import check_extra_fields

    well_formed = {
        "use_beam_search": False,
        "request_id": "r-1",
        "cache_salt": "s",
        "kv_transfer_params": {"do_remote_decode": True},
        "vllm_xargs": {"a": "b", "n": 2, "x": 0.5},
    }
    for chat in (False, True):
        check_extra_fields(well_formed, chat, vocab_size=1000, max_model_len=4096)
    # vLLM 0.24.0's chat request types a value as a scalar or a list of them
    # (dict[str, str | int | float | list[str | int | float]]); its completion request not
    lists = {"vllm_xargs": {"ids": [1, "a", 0.5]}}
    check_extra_fields(lists, True, vocab_size=1000, max_model_len=4096)
    from capsim.serve.requests import ApiError

    with pytest.raises(ApiError, match="object of strings and numbers"):
        check_extra_fields(lists, False, vocab_size=1000, max_model_len=4096)


def test_a_dotted_run_name_keeps_its_dots(tmp_path):
    """'--out llama-3.1-8b' wrote llama-3.json and llama-3.jsonl (Path's suffix '.1-8b'
    replaced), and '--out llama-3.2-1b' then found that file in its way."""
    import json

    from tests.test_importers import VLLM_BENCH

    src = tmp_path / "result.json"
    src.write_text(json.dumps(VLLM_BENCH))
    for name in ("llama-3.1-8b", "llama-3.2-1b", "run.yaml"):
        r = runner.invoke(app, ["import", "vllm-bench", str(src), "--out", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
    written = sorted(p.name for p in tmp_path.iterdir() if p.name != "result.json")
    assert written == [
        "llama-3.1-8b.json",
        "llama-3.1-8b.jsonl",
        "llama-3.2-1b.json",
        "llama-3.2-1b.jsonl",
        "run.json",  # a file type (letters) is replaced, as --help says
        "run.jsonl",
    ]
