"""The fifth hostile-input round of issue 47: what round 4 left open (booleans in data
files, the Python API's efficiency overrides that no model reads) and the surfaces tried
less before. Each bad input is exit 2 (or a CapsimUserError in the Python API) with a line
naming the flag, file or field."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

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
