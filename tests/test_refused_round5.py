"""The fifth hostile-input round of issue 47: what round 4 left open (booleans in data
files, the Python API's efficiency overrides that no model reads) and the surfaces tried
less before. Each bad input is exit 2 (or a CapsimUserError in the Python API) with a line
naming the flag, file or field."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

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
