"""Issue 47, round 9: engine references that name no engine ('@0.24', ':vulkan') or a
release of thousands of digits; vLLM's --data-parallel-size with --enable-expert-parallel
refused for a head count only a tensor-parallel group must divide; file outputs named with
a space at either end; MoE config.json files missing or zeroing their expert fields, which
imported as dense, top-1 or dense-width models; the import's hint of a YAML never written.
Each is exit 2 with a message naming the flag, file or field; the valid neighbours run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from capsim.cli.main import app
from tests.test_refused_leftovers import refused
from tests.test_refused_round8 import PREDICT, PROBE

runner = CliRunner()


@pytest.mark.parametrize(
    "engine, says",
    [
        ("@0.24", "engine '@0.24' names no engine before '@'"),
        (" @0.24", "names no engine before '@'"),
        (":vulkan", "engine ':vulkan' names no engine before ':'"),
        (":vulkan@b6918", "names no engine before ':'"),
        ("@", "engine '@' names no engine before '@'"),
    ],
)
def test_an_engine_reference_without_an_engine_says_so(engine, says):
    """'--engine @0.24' said "unknown engine ''": the name it found empty, not the part
    missing."""
    flat = refused([*PREDICT, "--engine", engine], says, "write ENGINE", "capsim engines")
    assert "unknown engine ''" not in flat


def test_a_release_of_thousands_of_digits_is_not_a_release_number():
    """'vllm@999...9' (5,000 digits) answered Python's own words, "Exceeds the limit (4300
    digits) for integer string conversion ... use sys.set_int_max_str_digits()"."""
    flat = refused([*PREDICT, "--engine", "vllm@" + "9" * 5000], "is not a release number")
    assert "set_int_max_str_digits" not in flat and "4300" not in flat


def test_parse_engine_version_takes_long_releases_it_can_read():
    from capsim.catalog.engine_schema import parse_engine_version

    assert parse_engine_version("0." + "9" * 5000) is None
    assert parse_engine_version("9" * 4000) is not None  # within int()'s limit
    assert str(parse_engine_version("0.24.0.post1")) == "0.24.0.post1"
    assert str(parse_engine_version("b6918 (2f68ce7cf)")) == "6918"


@pytest.mark.parametrize("engine", ["vllm@0.23.0", "vllm@v0.24.0", "llama.cpp:vulkan@b6918"])
def test_the_neighbours_of_those_references_run(engine):
    r = runner.invoke(app, [*PREDICT, "--engine", engine])
    assert r.exit_code == 0, r.output


MOE = ["--model", "qwen1.5-moe-a2.7b", "--enable-expert-parallel"]


@pytest.mark.parametrize(
    "command",
    [
        ["predict", "--gpu", "h100-sxm", "-c", "4", "--requests", "8", "--output-tokens", "8"],
        ["fit", "--gpu", "h100-sxm"],
        ["explain", "--gpu", "h100-sxm"],
    ],
)
def test_vllm_data_parallel_experts_split_no_attention_heads(command):
    """vLLM's '--dp 3 --enable-expert-parallel' runs each rank's attention whole on its
    GPU (TP 1); the 16 heads of Qwen1.5-MoE need not divide by 3. It was refused as
    'tensor parallel size 3 does not divide ... 16 attention heads', a size nobody typed."""
    r = runner.invoke(app, [*command, *MOE, "--dp", "3"])
    assert r.exit_code == 0, r.output


def test_a_tensor_parallel_split_of_the_heads_is_still_refused():
    base = ["predict", "--gpu", "h100-sxm", "-c", "1", "--requests", "2", "--output-tokens", "8"]
    refused([*base, *MOE, "--tp", "3"], "tensor parallel size 3 does not divide", "16 attention")
    refused([*base, *MOE, "--dp", "2", "--tp", "3"], "tensor parallel size 3 does not divide")
    flat = refused([*base, *MOE, "--dp", "7"], "expert parallelism over 7 GPUs", "--dp")
    assert "1, 2, 4" in flat


@pytest.mark.parametrize(
    "command, flag, name, bare",
    [
        (PREDICT, "--plot", "x.png ", "x.png"),
        (PREDICT, "--plot", " x.png", "x.png"),
        (PREDICT, "--plot", "out/x.png\u00a0", "out/x.png"),
        (PROBE, "--out", "run.json ", "run.json"),
        (["calibrate"], "--out", " p.yaml", "p.yaml"),
        (["validate"], "--write-bands", "b.yaml ", "b.yaml"),
    ],
)
def test_a_file_name_beginning_or_ending_with_a_space_is_refused(
    command, flag, name, bare, tmp_path, monkeypatch
):
    """'--plot "x.png "' wrote 'x.png .png' (the suffix '.png ' read as no type) and
    ' x.png' a file listed as x.png: a space a quote kept."""
    monkeypatch.chdir(tmp_path)
    refused([*command, flag, name], "begins or ends with a space", f"(e.g. {flag} {bare})")
    assert list(tmp_path.iterdir()) == []


def test_a_space_inside_a_file_name_is_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, [*PREDICT, "--plot", "my plot.png"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "my plot.png").is_file()


CONFIGS = Path(__file__).resolve().parent / "data" / "hf_configs_catalog"


def edited_config(tmp_path: Path, folder: str, **changes) -> Path:
    """The stored config.json of ``folder`` with ``changes`` (None: the key removed)."""
    config = json.loads((CONFIGS / folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


OLMOE = "allenai--OLMoE-1B-7B-0924-Instruct"
QWEN_MOE = "Qwen--Qwen1.5-MoE-A2.7B-Chat"
DEEPSEEK = "deepseek-ai--DeepSeek-V2-Lite-Chat"


@pytest.mark.parametrize(
    "folder, changes, says",
    [
        # a dense model of 0.58 B parameters
        (OLMOE, {"num_experts": None}, "lacks 'num_experts'"),
        (QWEN_MOE, {"num_experts": None}, "lacks 'num_experts'"),
        # routed top-1
        (OLMOE, {"num_experts_per_tok": None}, "lacks 'num_experts_per_tok'"),
        (DEEPSEEK, {"num_experts_per_tok": None}, "lacks 'num_experts_per_tok'"),
        (OLMOE, {"num_experts_per_tok": 0}, "num_experts_per_tok is 0 with 64 routed experts"),
        # the dense MLP's width taken for each expert's (116 B parameters)
        (DEEPSEEK, {"moe_intermediate_size": 0}, "moe_intermediate_size is 0 with 64"),
        (QWEN_MOE, {"moe_intermediate_size": None}, "lacks 'moe_intermediate_size'"),
        (OLMOE, {"intermediate_size": 0}, "intermediate_size is 0 with 64 routed experts"),
    ],
)
def test_an_moe_config_missing_or_zeroing_its_expert_fields_is_refused(
    folder, changes, says, tmp_path
):
    """These imported, with a guess no engine makes: a missing or zero field of the experts
    read as no experts, one routed a token, or the dense width."""
    config = edited_config(tmp_path, folder, **changes)
    out = str(tmp_path / "db")
    refused(["models", "import-hf", str(config), "--name", "m", "--out", out], says)
    assert not (tmp_path / "db").exists()


@pytest.mark.parametrize(
    "folder, changes",
    [
        (OLMOE, {}),
        (QWEN_MOE, {}),
        (DEEPSEEK, {}),
        (DEEPSEEK, {"n_routed_experts": None}),  # dense in transformers' DeepseekV2 too
    ],
)
def test_the_published_moe_configs_still_import(folder, changes, tmp_path):
    config = edited_config(tmp_path, folder, **changes)
    r = runner.invoke(
        app, ["models", "import-hf", str(config), "--name", "m", "--out", str(tmp_path / "db")]
    )
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("window", [-1, -4096])
def test_a_negative_sliding_window_says_nothing_was_written(window, tmp_path):
    """The hint said 'edit the written YAML by hand' of a file never written."""
    config = edited_config(tmp_path, "microsoft--Phi-3-mini-4k-instruct", sliding_window=window)
    out = str(tmp_path / "db")
    flat = refused(
        ["models", "import-hf", str(config), "--name", "m", "--out", out],
        "sliding_window: Input should be greater than or equal to 1",
        "nothing was written",
    )
    assert "edit the written" not in flat
    assert not (tmp_path / "db").exists()


@pytest.mark.parametrize("window", [None, 0, 2047, 4096, 100000])
def test_phi3_windows_that_vllm_reads_import(window, tmp_path):
    """null and 0 are no window, 2047 Phi-3's own, 4096 and beyond no shorter than the
    context, so no window either."""
    config = edited_config(tmp_path, "microsoft--Phi-3-mini-4k-instruct", sliding_window=window)
    if window is None:
        data = json.loads(config.read_text())
        data["sliding_window"] = None
        config.write_text(json.dumps(data))
    r = runner.invoke(
        app, ["models", "import-hf", str(config), "--name", "m", "--out", str(tmp_path / "db")]
    )
    assert r.exit_code == 0, r.output
