"""The fifth hostile-input round of issue 47: what round 4 left open (booleans in data
files, the Python API's efficiency overrides that no model reads) and the surfaces tried
less before. Each bad input is exit 2 (or a CapsimUserError in the Python API) with a line
naming the flag, file or field."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from capsim.cli.main import app
from tests.test_refused_leftovers import refused

ROOT = Path(__file__).resolve().parent.parent
DB = ROOT / "hardware_db"
runner = CliRunner()


@pytest.mark.parametrize(
    "model, overrides, says",
    [
        ("llama-3.1-8b", {"moe_compute_efficiency": 0.5}, "moe_compute_efficiency applies to"),
        ("llama-3.1-8b", {"moe_gemm_half_width": 100.0}, "moe_gemm_half_width applies to"),
        ("llama-3.1-8b", {"mla_layer_overhead_us": 5.0}, "multi-head latent attention"),
        ("llama-3.1-8b", {"drafter_layer_cost": 0.1}, "read only with --spec"),
    ],
)
def test_python_api_overrides_no_model_reads_are_refused(model, overrides, says):
    """The CLI's --set refused an MoE parameter for a dense model (it changes nothing);
    predict(efficiency_overrides=) and capacity() took it without a word."""
    import capsim

    for call in (
        lambda: capsim.predict(
            gpu="h100-sxm", model=model, concurrency=[1], efficiency_overrides=overrides
        ),
        lambda: capsim.capacity(
            gpu="h100-sxm", model=model, min_agent_tok_s=30, efficiency_overrides=overrides
        ),
    ):
        with pytest.raises(capsim.CapsimUserError, match=r"^efficiency_overrides: ") as info:
            call()
        assert says in str(info.value)


def test_python_api_overrides_of_a_model_that_reads_them_are_taken():
    import capsim

    result = capsim.predict(
        gpu="h100-sxm",
        model="mixtral-8x7b",
        concurrency=[1],
        requests=4,
        efficiency_overrides={"moe_gemm_half_width": 100.0},
    )
    assert result.levels


def test_python_api_validate_overrides_no_scenario_reads_are_refused():
    """validate --set refused it for datasets of dense models; validate(overrides=) ran."""
    import capsim

    dense = ROOT / "calibration" / "published" / "corpus-accelmark-llama31-8b-sharegpt-c8-a100.yaml"
    with pytest.raises(capsim.CapsimUserError, match=r"^overrides: moe_gemm_half_width applies"):
        capsim.validate([dense], overrides={"moe_gemm_half_width": 100.0})


@pytest.mark.parametrize(
    "section, name, old, new, says",
    [
        (
            "engines",
            "sglang",
            "holds_until_finish: true",
            'holds_until_finish: "true"',
            "admission_reserve.holds_until_finish: true or false, not the text 'true'",
        ),
        (
            "engines",
            "sglang",
            "holds_until_finish: true",
            "holds_until_finish: 1",
            "admission_reserve.holds_until_finish: true or false, not 1",
        ),
        (
            "engines",
            "sglang",
            "holds_until_finish: true",
            "holds_until_finish: 'on'",
            "true or false, not the text 'on'",
        ),
        (
            "models",
            "llama-3.1-8b",
            "tie_word_embeddings: false",
            "tie_word_embeddings: 0",
            "tie_word_embeddings: true or false, not 0",
        ),
        (
            "models",
            "llama-3.1-8b",
            "tie_word_embeddings: false",
            'tie_word_embeddings: "no"',
            "tie_word_embeddings: true or false, not the text 'no'",
        ),
    ],
)
def test_a_number_or_text_for_true_or_false_in_a_catalog_file_is_refused(
    tmp_path, section, name, old, new, says
):
    """pydantic reads 1, 1.0, "yes", "on" and "true" as true and 0 or "no" as false: a
    catalog overlay's quoted 'false' was taken as false, its 'on' (quoted) as true."""
    from tests.test_refused_leftovers import overlay

    db = overlay(tmp_path, section, name, old, new)
    refused(
        ["--db", str(db), "explain", "--gpu", "h100-sxm", "--model", "llama-3.1-8b"],
        f"{name}.yaml",
        says,
    )


@pytest.mark.parametrize("value", ['"yes"', "1"])
def test_a_number_or_text_for_true_or_false_in_a_profile_is_refused(tmp_path, value):
    profile = ROOT / "calibration" / "profiles" / "consumer-ampere-vllm.yaml"
    text = profile.read_text()
    assert "identifiable: true" in text
    path = tmp_path / "p.yaml"
    path.write_text(text.replace("identifiable: true", f"identifiable: {value}", 1))
    refused(
        ["predict", "--gpu", "rtx3090", "--model", "llama-3.1-8b", "--profile", str(path)],
        "p.yaml:12: invalid entry",
        "identifiable: Input should be a valid boolean",
    )


def test_a_number_for_true_or_false_in_a_run_log_is_refused(tmp_path):
    from tests.test_cli_output import hand_made_run

    log = hand_made_run(tmp_path / "run.json")
    lines = log.read_text().splitlines(keepends=True)
    assert '"ignore_eos":true' in lines[0]
    lines[0] = lines[0].replace('"ignore_eos":true', '"ignore_eos":1')
    log.write_text("".join(lines))
    refused(["probe", "summarize", str(log)], "ignore_eos: Input should be a valid boolean")


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"enforce_eager": "yes"}, "enforce_eager: Input should be a valid boolean (got str"),
        ({"prefix_caching": 0}, "prefix_caching: Input should be a valid boolean (got int 0)"),
        ({"offline": 1.0}, "offline: Input should be a valid boolean"),
    ],
)
def test_python_api_true_or_false_arguments_take_booleans(fields, says):
    """PlanRequest refused 'yes' for pessimistic; PredictConfig took 'false' as False and 1
    as True."""
    import capsim

    with pytest.raises(capsim.CapsimUserError) as info:
        capsim.predict(gpu="h100-sxm", model="llama-3.1-8b", concurrency=[1], **fields)
    assert says in str(info.value)


@pytest.mark.parametrize(
    "flag, values", [("--nodes", range(1, 1025)), ("--max-num-seqs", range(1, 5001))]
)
def test_a_plan_of_more_configurations_than_it_can_simulate_is_refused_at_once(flag, values):
    """Each value multiplies the search: --nodes 1,2,...,1024 held 131,072 configurations,
    whose enumeration alone took 10 s before a run of hours."""
    import time

    started = time.perf_counter()
    refused(
        ["plan", "--model", "llama-3.1-8b", "--agents", "4", flag, ",".join(map(str, values))],
        "the search holds more than 100,000 configurations",
        "fewer values in --gpus, --counts, --nodes, --max-num-seqs or --power-limits",
    )
    assert time.perf_counter() - started < 5


def test_python_api_plan_of_too_many_configurations_is_a_user_error():
    import capsim

    with pytest.raises(capsim.CapsimUserError, match="more than 100,000 configurations"):
        capsim.plan(models=["llama-3.1-8b"], agents=4, nodes=tuple(range(1, 1025)))


def test_the_default_plan_of_every_shipped_model_is_within_the_limit():
    """The limit leaves room for every model's default search (at most 27,216 for
    qwen3.5-397b-a17b) and for several at once."""
    from capsim.catalog.loader import load_catalog
    from capsim.planner.search import MAX_PLAN_CONFIGURATIONS, PlanRequest, search_grids

    cat = load_catalog()
    for name in ("qwen3.5-397b-a17b", "deepseek-r1", "llama-3.1-8b"):
        rows = search_grids(PlanRequest(models=(name,), agents=4), cat)
        size = sum(math.prod(map(len, axes)) for *_, axes in rows)
        assert 0 < size <= MAX_PLAN_CONFIGURATIONS / 3, (name, size)


def test_a_long_plan_says_how_long_in_a_pipe_too(monkeypatch):
    """plan showed a bar on a terminal and nothing in a pipe or a log: the default search
    at 64 agents ran 100 s without a word."""
    import io
    import time

    from rich.console import Console

    import capsim.cli.common as common

    clock = {"now": 0.0}
    monkeypatch.setattr(time, "perf_counter", lambda: clock["now"])
    out = io.StringIO()
    monkeypatch.setattr(common, "err_console", Console(file=out, width=300))

    def work():
        for i in range(100):
            clock["now"] += 1.0  # a configuration a second: 100 s in all
            yield i

    done, stopped = common.finished_before_ctrl_c(
        work(), 100, "configurations simulated", "the plan covers those", shorter="fewer x"
    )
    assert len(done) == 100 and stopped is None
    assert out.getvalue().count("note: at the pace so far") == 1
    assert "fewer x" in out.getvalue()


def test_n_cpu_moe_above_the_moe_layers_is_taken_with_a_note():
    """llama.cpp keeps the experts of every layer in system RAM when N passes the layers
    (its --cpu-moe); capsim took --n-cpu-moe 9999 as that without a word, where
    --cpu-offload-gb above the weights says so."""
    fit = ["fit", "--gpu", "h100-sxm", "--model", "qwen3-coder-30b-a3b", "--engine", "llama.cpp"]
    r = runner.invoke(app, [*fit, "--n-cpu-moe", "9999"])
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "--n-cpu-moe 9,999 is more than qwen3-coder-30b-a3b's 48 MoE layers" in flat
    r = runner.invoke(app, [*fit, "--n-cpu-moe", "48"])
    assert r.exit_code == 0 and "is more than" not in r.output


def test_a_run_file_is_never_written_through_a_file_at_its_temporary_name(tmp_path):
    """The summary went through NAME.json.tmp, a fixed name: a link there had the summary
    written into the file it pointed to (outside the folder named) and a file there was
    taken, without --force. Now a new file of its own (O_EXCL) is renamed over NAME.json."""
    from tests.test_cli_output import hand_made_run

    victim = tmp_path / "elsewhere" / "precious.txt"
    victim.parent.mkdir()
    victim.write_text("precious")
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "a.json.tmp").symlink_to(victim)
    (runs / "b.json.tmp").write_text("mine")
    hand_made_run(runs / "a.json")
    hand_made_run(runs / "b.json")
    assert victim.read_text() == "precious"
    assert (runs / "b.json.tmp").read_text() == "mine"
    assert (runs / "a.json.tmp").is_symlink()
    assert not list(runs.glob(".*.tmp"))  # no temporary file left behind


def test_a_replaced_run_log_link_is_replaced_not_written_through(tmp_path):
    """With --force a run's NAME.jsonl is replaced: a link there had the log written into
    the file it pointed to."""
    from tests.test_cli_output import hand_made_run

    victim = tmp_path / "precious.txt"
    victim.write_text("precious")
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "a.jsonl").symlink_to(victim)
    log = hand_made_run(runs / "a.json")
    assert victim.read_text() == "precious"
    assert not log.is_symlink() and log.read_text().startswith('{"type":"header"')


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda d: d["ttfts"].__setitem__(0, True), "ttfts must be a number, not True"),
        (lambda d: d["ttfts"].__setitem__(0, None), "ttfts must be a number, not None"),
        (lambda d: d["ttfts"].__setitem__(0, "0.1"), "ttfts must be a number, not '0.1'"),
        (lambda d: d["input_lens"].__setitem__(0, True), "input_lens must be a number"),
        (lambda d: d["input_lens"].__setitem__(0, 10.5), "input_lens holds 10.5, not a whole"),
        (lambda d: d["itls"].__setitem__(0, [True] * 199), "itls must be a number, not True"),
        (lambda d: d["itls"].__setitem__(0, ""), "itls holds '', not a list of one request"),
        (lambda d: d.update(ttfts=False), "ttfts must be a list, one entry a request"),
        (lambda d: d.update(itls="x"), "itls not a list"),
    ],
)
def test_a_vllm_bench_result_of_non_numbers_per_request_is_refused(tmp_path, change, says):
    """A per-request TTFT, gap or input length of true was imported as 1 (s or tokens), an
    empty text for a request's gaps as none; the totals were checked, the lists were not."""
    import copy
    import json

    from tests.test_importers import VLLM_BENCH

    data = copy.deepcopy(VLLM_BENCH)
    change(data)
    src = tmp_path / "bench.json"
    src.write_text(json.dumps(data))
    out = tmp_path / "run.json"
    refused(["import", "vllm-bench", str(src), "--out", str(out)], says)
    assert not out.exists() and not out.with_suffix(".jsonl").exists()


HF_LLAMA = ROOT / "tests" / "data" / "hf_configs_catalog" / "meta-llama--Llama-3.1-8B-Instruct"


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("tie_word_embeddings", "false", "tie_word_embeddings is 'false'; it must be true or"),
        ("tie_word_embeddings", 0, "tie_word_embeddings is 0; it must be true or false"),
        ("attention_bias", [], "attention_bias is []; it must be true or false"),
        ("num_key_value_heads", [], "num_key_value_heads is []; it counts num key value"),
        ("max_position_embeddings", {}, "max_position_embeddings is {}; it counts"),
    ],
)
def test_a_config_json_of_the_wrong_kind_for_a_flag_or_a_count_is_refused(
    tmp_path, key, value, says
):
    """bool("false") is True: a config.json's "tie_word_embeddings": "false" counted the
    weights with the embedding tied; [] and {} for a count were read as not given (as many
    KV heads as heads, the default context)."""
    import json

    data = json.loads((HF_LLAMA / "config.json").read_text())
    data[key] = value
    (tmp_path / "config.json").write_text(json.dumps(data))
    refused(["fit", "--gpu", "h200", "--model", str(tmp_path / "config.json")], says)


def test_every_stored_config_json_passes_the_kind_checks():
    from capsim.catalog.hf_import import read_config

    configs = sorted((ROOT / "tests" / "data").glob("hf_configs*/*/config.json"))
    assert len(configs) > 30
    for path in configs:
        read_config(path)


RUN_HEADER = '{"type": "header", "url": "u", "model": "m", "concurrency": [1]}'


@pytest.mark.parametrize(
    "lines, says",
    [
        (["[1, 2]"], "line 1: list '[1, 2]' is not a JSON object, so not a capsim run log"),
        (['"x"'], "line 1: str 'x' is not a JSON object"),
        (
            [
                '{"type": "header", "url": "u", "model": "m", "concurrency": [1]}',
                '{"type": "request"}',
            ],
            "line 2: a 'request' event needs a whole number 'concurrency' (and 'run'), and this "
            "one has none",
        ),
        ([RUN_HEADER], ""),
    ],
)
def test_a_run_log_line_of_another_shape_is_refused_naming_the_line(tmp_path, lines, says):
    """A line that is a JSON list ended in "AttributeError: 'list' object has no attribute
    'get'", a request without its level in "KeyError: 'concurrency'"."""
    log = tmp_path / "run.jsonl"
    log.write_text("\n".join(lines) + "\n")
    r = runner.invoke(app, ["probe", "summarize", str(log)])
    if not says:  # a header alone is a run with no level yet
        assert r.exit_code == 0, r.output
        return
    flat = refused(["probe", "summarize", str(log)], says)
    assert "Error:" not in flat.replace("error:", "")


@pytest.mark.parametrize(
    "extra",
    [
        ["--hicache-ratio", "2"],
        ["--hicache-size", "0"],
        ["--engine", "sglang", "--hicache-ratio", "2"],
    ],
)
def test_a_hicache_size_at_sglangs_default_without_the_cache_is_refused(extra):
    """--hicache-ratio 3 without --enable-hierarchical-cache was refused and --hicache-ratio
    2 (SGLang's default) taken without a word: the check compared the value with the
    default."""
    predict = ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "-c", "1"]
    refused([*predict, *extra], "--enable-hierarchical-cache is not given")
    capacity = ["capacity", "--gpu", "h100-sxm", "--model", "llama-3.1-8b"]
    refused([*capacity, "--min-agent-tok-s", "30", *extra], "is not given")


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf")])
def test_python_api_power_limit_out_of_range_is_a_user_error(value):
    """predict(power_limit_w=0) ended in a pydantic ValidationError of Deployment, from
    inside the simulation (a fuzz of every PredictConfig field with 14 values, 882 cases)."""
    import capsim

    with pytest.raises(capsim.CapsimUserError, match=r"^power_limit_w: Input should be"):
        capsim.predict(gpu="h100-sxm", model="llama-3.1-8b", concurrency=[1], power_limit_w=value)


@pytest.mark.parametrize(
    "option, value, says",
    [
        ("max_num_seqs", "x", "max_num_seqs: takes a whole number, or None, got str 'x'"),
        ("max_model_len", float("nan"), "max_model_len: takes a whole number"),
        ("gpu_memory_utilization", None, "gpu_memory_utilization: takes a number in (0, 1]"),
        ("reserve", None, "reserve: takes a RuntimeReserve, got None"),
        ("default_limits", (1,), "default_limits: takes None or (max_num_batched_tokens"),
        ("drafter", "eagle", "drafter: takes None or a Drafter"),
        ("sliding_window_pool", 0, "sliding_window_pool: takes None or an engine's"),
        ("enforce_eager", "yes", "enforce_eager: takes True or False"),
    ],
)
def test_python_api_memory_fit_options_of_the_wrong_kind_are_a_user_error(option, value, says):
    """memory_fit(max_num_seqs="x") was a TypeError, reserve=None an AttributeError and
    default_limits=(1,) a ValueError from inside the fit (a fuzz of its keyword arguments)."""
    import capsim

    cat = capsim.load_catalog()
    gpu, model, fmt = cat.gpu("h100-sxm"), cat.model("llama-3.1-8b"), cat.quant("bf16")
    with pytest.raises(capsim.CapsimUserError) as info:
        capsim.memory_fit(gpu, model, fmt, **{option: value})
    assert says in str(info.value)


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("min_agent_tok_s", 1e308, "--min-agent-tok-s 1e+308: input should be less than or"),
        ("max_ttft_p90_s", 1e308, "--max-ttft-p90-s 1e+308: input should be less than or"),
        ("requests", 2**70, "a whole number from 1 to 10,000,000"),
    ],
)
def test_python_api_plan_objectives_past_their_bounds_are_a_user_error(field, value, says):
    """plan(min_agent_tok_s=1e308) and plan(requests=2**70) were pydantic ValidationErrors of
    Objectives and PredictConfig from inside the search."""
    import capsim

    with pytest.raises(capsim.CapsimUserError) as info:
        capsim.plan(models=["llama-3.1-8b"], agents=2, gpus=["h100-sxm"], **{field: value})
    assert says in str(info.value)


@pytest.mark.parametrize("name", ["LLAMA_3.1_8B", "llama3.1-8b"])
def test_models_import_hf_refuses_a_name_the_catalog_could_not_tell_apart(tmp_path, name):
    """'LLAMA_3.1_8B' (or the alias 'llama3.1-8b') was written with a note that it replaces
    the built-in llama-3.1-8b; the catalog refuses such a file, so every command given
    that --db then exited 2."""
    out = tmp_path / "db"
    refused(
        ["models", "import-hf", str(HF_LLAMA / "config.json"), "--name", name, "--out", str(out)],
        f"--name '{name}' is the model 'llama-3.1-8b' but for case and separators",
    )
    assert not (out / "models").exists() or not list((out / "models").iterdir())


def test_models_import_hf_refuses_a_second_file_of_one_model_in_the_folder(tmp_path):
    out = tmp_path / "db"
    cmd = ["models", "import-hf", str(HF_LLAMA / "config.json"), "--out", str(out)]
    r = runner.invoke(app, [*cmd, "--name", "my-model"])
    assert r.exit_code == 0, r.output
    refused([*cmd, "--name", "My_Model"], "but for case and separators")
    assert [p.name for p in (out / "models").iterdir()] == ["my-model.yaml"]
    r = runner.invoke(app, ["--db", str(out), "models", "show", "my-model"])
    assert r.exit_code == 0, r.output
