"""The seventh hostile-input round of issue 47: what round 6 left open (plan's --top and
--budget without a ceiling, sizes of 1e-320 taken as given, profile names that read as
numbers) and a hunt across serve's and probe's own flags, the catalog commands, importers
of odd files and odd --db overlays. Each bad input is exit 2 with a line naming the flag,
file or field, never a traceback; the valid neighbours still run."""

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
HICACHE = [*PREDICT, "--engine", "sglang", "--enable-hierarchical-cache"]
PLAN = ["plan", "--model", "llama-3.1-8b", "--agents", "1", "--gpus", "h100-sxm"]


@pytest.mark.parametrize(
    "flag, says",
    [
        (["--top", str(2**64)], "less than or equal to 100000"),
        (["--top", "100001"], "less than or equal to 100000"),
        (["--budget", "1e30"], "--budget 1e+30: at most 1e+12 USD"),
    ],
)
def test_plan_top_and_budget_have_a_ceiling(flag, says):
    """--top 2**64 and --budget 1e30 were taken: a budget no deployment reaches limits
    nothing, and no search holds more than 100,000 rows to show."""
    refused([*PLAN, *flag], "--" + flag[0].lstrip("-"), says)


def test_python_api_plan_budget_has_the_same_ceiling():
    import capsim
    from capsim.planner.search import PlanRequest

    with pytest.raises(capsim.CapsimUserError, match="--budget 1e\\+13: at most 1e\\+12 USD"):
        PlanRequest(models=("llama-3.1-8b",), agents=1, budget_usd=1e13)
    PlanRequest(models=("llama-3.1-8b",), agents=1, budget_usd=1e12)


@pytest.mark.parametrize(
    "command, flag, value, more",
    [
        (PREDICT, "--cpu-offload-gb", "1e-300", ["--host-link-bandwidth", "10"]),
        (PREDICT, "--cpu-offload-gb", "0.0009", []),
        (PREDICT, "--kv-offloading-size", "0.0005", []),
        (
            [*PREDICT, "--engine", "sglang"],
            "--hicache-size",
            "1e-300",
            ["--enable-hierarchical-cache"],
        ),
        (["fit", *ONE], "--cpu-offload-gb", "0.0001", []),
    ],
)
def test_a_size_in_ram_of_almost_nothing_is_refused(command, flag, value, more):
    """--cpu-offload-gb 1e-320 passed 'at least 0' as an offload: it let
    --host-link-bandwidth through (which applies only to an offload) and printed
    '+9.99989e-321 GiB weights in RAM'."""
    refused([*command, flag, value, *more], f"{flag} {value}:", "at least 0.001 GiB")


def test_an_error_of_a_config_field_names_the_flag_typed():
    """--kv-offloading-size's error named '--kv-offloading-gb', a flag no command has."""
    from typer.main import get_command

    from capsim.cli.common import flag_of
    from capsim.engine.config import PredictConfig

    commands = get_command(app).commands
    flags = {o for c in ("predict", "serve") for p in commands[c].params for o in p.opts}
    for field in PredictConfig.model_fields:
        if field in ("router_latency_s", "fast_forward", "skip_periods", "kv_capacity_tokens"):
            continue  # the Python API's, or a flag in another unit (--router-latency-ms)
        if field == "efficiency_overrides":
            continue  # --set
        assert flag_of(field).split()[0] in flags, field


@pytest.mark.parametrize("value", ["0", "0.001", "2"])
def test_a_real_offload_is_taken(value):
    r = runner.invoke(app, [*PREDICT, "--cpu-offload-gb", value])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    "name, says, close",
    [
        ("NaN", "reads as a number", "profile-NaN"),
        ("-inf", "reads as a number", "profile-inf"),
        ("1e309", "reads as a number", "profile-1e309"),
        ("-x", "does not begin with a letter", "profile-x"),
        ("true", "reads as a boolean or null", "profile-true"),
        ("Null", "reads as a boolean or null", "profile-Null"),
        ("8..1", "reads as a range", "profile-8-1"),
        ("a..b", "reads as a range", "profile-a-b"),
        ("AUTO", "is --profile's own word 'auto' but for case", "profile-AUTO"),
    ],
)
def test_calibrate_name_that_reads_as_a_number_a_boolean_or_a_range_is_refused(
    tmp_path, name, says, close
):
    """calibrate --name NaN, 1e309, true and 8..1 were taken: a result's reader (JSON, YAML,
    a spreadsheet) takes such a name for a number or a boolean. Refused before any dataset
    is read, with a name that would do."""
    out = refused(["calibrate", "--name", name, "--out", str(tmp_path)], f"--name '{name}'", says)
    assert f"did you mean: {close}?" in out and "begins with a letter" in out
    assert not any(tmp_path.iterdir())


def test_calibrate_name_of_letters_digits_and_dots_passes_the_check():
    from capsim.cli.calibrate import refuse_odd_profile_name

    for name in ("my.profile-1", "consumer-ampere-vllm", "apple-silicon-llama.cpp", "Nano"):
        refuse_odd_profile_name(name, "--name")


PROBE = ["probe", "--url", "http://127.0.0.1:9", "--model", "m"]


@pytest.mark.parametrize(
    "flag, value, says",
    [
        ("--timeout", "1e308", "--timeout 1e+308: seconds from 0.001 to 10,000,000"),
        ("--connect-timeout", "1e-300", "--connect-timeout 1e-300: seconds from 0.001"),
        ("--first-byte-timeout", "1e-9", "--first-byte-timeout 1e-09: seconds from 0.001"),
        ("--chunk-timeout", "0.0009", "--chunk-timeout 0.0009: seconds from 0.001"),
        ("--gpus", "65536", "less than or equal to 16384"),
        ("--tp", "1024", "less than or equal to 72"),
    ],
)
def test_probe_timeouts_and_stated_deployment_have_predicts_ranges(flag, value, says):
    """A hunt of every probe flag against a closed port: --timeout 1e308 and a
    --first-byte-timeout of 1e-320 s (every request timed out) were taken, and a stated
    --gpus 65536 or --tp 1024 that no prediction takes (predict's ceilings are 16,384 GPUs
    and TP 72), which the run file then carried into validate and calibrate."""
    r = runner.invoke(app, [*PROBE, flag, value])
    assert r.exit_code == 2 and says in " ".join(r.output.split()), r.output
    assert "cannot reach" not in r.output  # refused before any request


def test_python_api_probe_timeouts_have_the_same_range():
    from pydantic import ValidationError

    from capsim.probe.runner import ProbeConfig

    with pytest.raises(ValidationError, match=r"greater than or equal to 0\.001"):
        ProbeConfig(
            url="http://127.0.0.1:9", model="m", concurrency=[1], first_byte_timeout_s=1e-320
        )
    ProbeConfig(url="http://127.0.0.1:9", model="m", concurrency=[1], timeout_s=0.001)


@pytest.mark.parametrize(
    "host, url",
    [
        ("0", "http://127.0.0.1:8000"),
        ("0.0.0.0", "http://127.0.0.1:8000"),
        ("::0", "http://[::1]:8000"),
        ("127.0.0.1", "http://127.0.0.1:8000"),
        ("::1", "http://[::1]:8000"),
    ],
)
def test_serve_shows_a_wildcard_address_by_its_address_not_its_spelling(host, url):
    """'serve --host 0' (0.0.0.0) said 'serving ... at http://0:8000/v1'."""
    from capsim.cli.serve import base_url

    assert base_url(host, 8000) == url


@pytest.mark.parametrize(
    "written, says",
    [
        ("0120", "'0120' is an octal number (80) to YAML 1.1 and 120 to YAML 1.2"),
        ("1:20", "'1:20' is a base-60 number (80) to YAML 1.1"),
        ("8_0", "'8_0' is a number with '_' (80)"),
        ("0b1010000", "'0b1010000' is a binary number (80) to YAML 1.1 only"),
        ("1_0.5", "'1_0.5' is a number with '_' (10.5)"),
    ],
)
def test_a_number_yaml_11_and_12_read_otherwise_is_refused(tmp_path, written, says):
    """'memory_gb: 0120' in a --db overlay was read as 80 GB (YAML 1.1's octal; YAML 1.2
    reads 120), '1:20' as 80 (base 60) and '8_0' as 80, without a word: the file, the line
    and both readings instead."""
    from tests.test_refused_leftovers import overlay

    db = overlay(tmp_path, "gpus", "h100-sxm", "memory_gb: 80\n", f"memory_gb: {written}\n")
    refused(["gpus", "show", "h100-sxm", "--db", str(db)], "h100-sxm.yaml", "line 7", says)


@pytest.mark.parametrize(
    "text, value",
    [("80", 80), ("0x50", 80), ("07", 7), ("-0", 0), ("1.0e+3", 1000.0), ("1e3", "1e3")],
)
def test_a_number_both_yamls_read_alike_is_taken(text, value):
    from capsim.catalog.loader import load_yaml_text

    assert load_yaml_text(f"x: {text}") == {"x": value}


def test_a_cached_file_is_parsed_again_when_the_yaml_reader_changes(tmp_path, monkeypatch):
    """Profiles and band tables were cached by their own module's version only: a file
    cached before loader.py's checks changed kept the old reading."""
    from capsim.catalog import cache

    code = tmp_path / "code"
    code.mkdir()
    (code / "cache.py").write_text("")
    (code / "loader.py").write_text("")
    monkeypatch.setattr(cache, "__file__", str(code / "cache.py"))
    data = tmp_path / "x.yaml"
    data.write_text("x: 1\n")
    before = cache.files_key([data])
    (code / "loader.py").write_text("# changed\n")
    assert cache.files_key([data]) != before


@pytest.mark.parametrize(
    "name, says, close",
    [
        ("NaN", "reads as a number", "model-NaN"),
        ("1e309", "reads as a number", "model-1e309"),
        ("8", "reads as a number", "model-8"),
        ("true", "reads as a boolean or null", "model-true"),
        ("8..1", "reads as a range", "model-8-1"),
    ],
)
def test_models_import_hf_name_that_reads_as_a_value_is_refused(tmp_path, name, says, close):
    """models import-hf --name NaN, 1e309, true and 8..1 were written, and plan's winner
    then read 'vllm serve NaN'; the same check as calibrate --name (files.name_read_as_value)."""
    config = ROOT / "tests" / "data" / "hf_configs" / "gemma-4-31b-it" / "config.json"
    out = refused(
        ["models", "import-hf", str(config), "--name", name, "--out", str(tmp_path)],
        f"--name '{name}' {says}",
        f"did you mean: {close}?",
    )
    assert "Traceback" not in out and not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "command, flag, value",
    [
        (PREDICT, "--cpu-offload-gb", "1e-320"),
        (PREDICT, "--cpu-offload-gb", "1e-400"),
        (PREDICT, "--gpu-memory-utilization", "5e-324"),
        (PREDICT, "--kv-offloading-size", "-1e-320"),
        (["calibrate"], "--prior-weight", "1e-320"),
        (PROBE, "--first-byte-timeout", "1e-320"),
        (["fit", *ONE, "--engine", "llama.cpp"], "--host-memory-bandwidth", "1e-330"),
    ],
)
def test_a_number_too_small_to_read_is_refused_by_every_float_flag(command, flag, value):
    """One check for every number flag (cli/main.py's coerce): 1e-320 lost its digits
    ('--prior-weight 1e-320' printed 'weight 9.99989e-321', '--cpu-offload-gb 1e-320' was an
    offload of that) and 1e-400 was read as 0."""
    refused([*command, flag, value], f"'{value}' is too small to be read as a number")


@pytest.mark.parametrize("value", ["0", "-0", "0.0e-400", "2.3e-308"])
def test_zero_and_the_smallest_normal_number_are_read(value):
    r = runner.invoke(app, [*PREDICT, "--router-latency-ms", value])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    "args",
    [
        [*PREDICT, "--set", "kv_transfer_latency_ms=1e-320"],
        ["predict", *ONE, "-c", "1", "--requests", "4", "--output-tokens", "normal:16,1e-320"],
        ["predict", *ONE, "--requests", "4", "--workload", "open", "--rate", "1e-400"],
    ],
)
def test_a_number_too_small_to_read_is_refused_inside_text_flags(args):
    """The numbers a text flag holds (--set, a length distribution, --rate) go through one
    reader (errors.plain_float), which refuses them as the number flags do."""
    refused(args, "is too small to be read as a number")


@pytest.mark.parametrize(
    "config, says",
    [
        ('{"repetition_penalty": -1}', "repetition_penalty must be positive, got -1"),
        ('{"top_p": 0}', "top_p must be in (0, 1], got 0"),
        ('{"top_k": -5}', "top_k must be -1 (disable), 0 or at least 1, got -5"),
        ('{"min_p": 2}', "min_p must be in [0, 1], got 2"),
        ('{"temperature": -0.5}', "temperature must be non-negative"),
    ],
)
def test_serve_generation_config_takes_the_ranges_of_a_request(config, says):
    """A hunt of every serve flag: --override-generation-config '{"repetition_penalty": -1}'
    started the server, though vLLM refuses such a request value (its defaults meet the same
    checks in every request); the request's own checks (serve/requests.py) now apply."""
    from capsim.cli.serve import max_new_tokens_of
    from capsim.errors import CapsimUserError

    with pytest.raises(CapsimUserError, match="--override-generation-config") as info:
        max_new_tokens_of(config)
    assert says in info.value.message
    ok = '{"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0, "max_new_tokens": 8}'
    assert max_new_tokens_of(ok) == 8


@pytest.mark.parametrize("value", ["0", "-0"])
def test_validate_prior_weight_at_its_default_without_calibrated_is_refused(value):
    """--prior-weight 5 without --calibrated was refused, --prior-weight 0 (its default,
    typed) taken without a word: it applies to fits only, at any value."""
    dataset = ROOT / "calibration/published/corpus-accelmark-llama31-8b-sharegpt-c8-a100.yaml"
    refused(["validate", str(dataset), "--prior-weight", value], "--prior-weight applies to fits")


@pytest.mark.parametrize("out", [".", "/", ".."])
@pytest.mark.parametrize("kind", ["vllm-bench", "guidellm", "aiperf"])
def test_import_out_that_names_no_file_is_refused(tmp_path, out, kind):
    """'capsim import vllm-bench r.json --out .' (or '/') ended in a ValueError traceback
    from pathlib ('PosixPath('.') has an empty name'), exit 1; probe said '--out '.' names
    no file' already."""
    src = tmp_path / "r.json"
    src.write_text("{}")
    refused(["import", kind, str(src), "--out", out], f"--out '{out}' names no file")


@pytest.mark.parametrize(
    "args, says",
    [
        (
            [*PREDICT, "--spec", "ngram:3", "--spec-acceptance", "0_1"],
            "'0_1' is not a number (an '_' in it)",
        ),
        ([*PLAN, "--counts", "1", "--power-limits", "0_1"], "'0_1' is not a number"),
        ([*PLAN, "--counts", "1", "--power-limits", "1,0.8e-400"], "too small to be read"),
        (["predict", *ONE, "-c", "1", "--gpus", "2", "--tp", "0_2"], "malformed --tp '0_2'"),
        ([*PLAN, "--counts", "0_1"], "malformed --counts '0_1' ('0_1' is not a whole number"),
        ([*PLAN, "--counts", "1", "--nodes", "1_0"], "malformed --nodes '1_0'"),
        ([*PLAN, "--counts", "1", "--max-num-seqs", "1_024"], "malformed --max-num-seqs"),
    ],
)
def test_lists_of_numbers_read_their_numbers_as_every_number_flag(args, says):
    """--spec-acceptance and plan's --power-limits read their numbers with float(), plan's
    --counts, --nodes and --max-num-seqs with int(): '0_1' was 1.0 (an acceptance of 1, a
    power limit of 100% of TDP, one GPU), '1_0' ten nodes; number flags refused them."""
    refused(args, says)


@pytest.mark.parametrize(
    "spec, says",
    [
        ("ngram:1_0", "'1_0' is not a whole number (an '_' in it)"),
        ("ngram:3:topk=0_2", "'0_2' is not a whole number"),
        ("ngram:3:verify=x", "'x' is not a whole number"),
    ],
)
def test_spec_counts_are_read_as_whole_number_flags_read_them(spec, says):
    """--spec read its counts with int(): 'ngram:1_0' drafted 10 tokens, 'topk=0_2' was 2."""
    refused([*PREDICT, "--spec", spec], f"cannot read --spec '{spec}'", says)
