"""The seventh hostile-input round of issue 47: what round 6 left open (plan's --top and
--budget without a ceiling, sizes of 1e-320 taken as given, profile names that read as
numbers) and a hunt across serve's and probe's own flags, the catalog commands, importers
of odd files and odd --db overlays. Each bad input is exit 2 with a line naming the flag,
file or field, never a traceback; the valid neighbours still run."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.test_refused_leftovers import refused

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
ONE = ["--gpu", "h100-sxm", "--model", "llama-3.1-8b"]
PREDICT = ["predict", *ONE, "-c", "1", "--requests", "4", "--output-tokens", "16"]
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
