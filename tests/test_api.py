"""The public Python API (capsim/api.py): what the CLI calls, the layers it keeps apart,
and where calibration profiles are read and written."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import capsim
from capsim.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
LAYER_ORDER = ["catalog", "physics", "engine", "probe", "calibration", "planner", "serve"]
"""Lower layers first: a module may import its own layer and those before it."""


def imported_capsim_layers(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "capsim" and len(parts) > 1 and parts[1] in LAYER_ORDER:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("layer", LAYER_ORDER)
def test_no_layer_imports_one_above_it(layer):
    allowed = set(LAYER_ORDER[: LAYER_ORDER.index(layer) + 1])
    if layer == "calibration":
        allowed.add("probe")  # run files are calibration data
    for path in (ROOT / "capsim" / layer).glob("*.py"):
        above = imported_capsim_layers(path) - allowed
        assert not above, f"{path.relative_to(ROOT)} imports {sorted(above)}"


def test_the_api_predicts_with_the_profile_and_bands_the_cli_shows():
    result = capsim.predict(
        gpu="rtx3090", model="qwen3-coder-30b-a3b", concurrency=[1, 4], requests=32
    )
    assert result.profile == "consumer-ampere-vllm"
    assert Path(result.profile_path).name == "consumer-ampere-vllm.yaml"
    assert all(level.band_80 and "ttft_p50_ms" in level.band_80 for level in result.levels)
    cli = CliRunner().invoke(
        app,
        [
            "predict",
            "--gpu",
            "rtx3090",
            "--model",
            "qwen3-coder-30b-a3b",
            "--concurrency",
            "1,4",
            "--requests",
            "32",
            "--json",
        ],
    )
    points = json.loads(cli.stdout)["results"][0]["points"]
    assert [p["output_tok_s"] for p in points] == [
        level.metrics.output_tok_s for level in result.levels
    ]
    uncalibrated = capsim.predict(result.config, profile="none")
    assert uncalibrated.profile is None
    assert uncalibrated.levels[0].metrics.output_tok_s != result.levels[0].metrics.output_tok_s


def test_the_api_names_a_bad_field():
    with pytest.raises(capsim.CapsimUserError, match="concurrency"):
        capsim.predict(gpu="rtx3090", model="qwen3-8b", concurrency=[0])


def test_probe_is_the_package_and_the_function():
    from capsim import probe

    assert callable(probe) and callable(capsim.probe)
    with pytest.raises(capsim.CapsimUserError):
        probe(out=Path("x.json"), url="http://127.0.0.1:9", model="m", concurrency=[])


def test_the_documented_api_example_runs(tmp_path):
    section = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(code)
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=False, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip()


def test_calibrate_writes_the_users_folder_and_predict_applies_it(tmp_path, monkeypatch):
    import yaml

    from tests.test_calibration import synthetic

    folder = tmp_path / "profiles"
    monkeypatch.setenv("CAPSIM_PROFILE_DIR", str(folder))
    # a small dataset and one parameter: where the profile goes and that predict picks it
    # up is the point here (a probe run fitted whole took 30-42 s of the suite)
    data = tmp_path / "synthetic.yaml"
    data.write_text(yaml.safe_dump(synthetic({"step_overhead_us": 900.0}).model_dump(mode="json")))
    args = ["calibrate", str(data), "--fit", "step_overhead_us", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (written,) = json.loads(result.stdout)
    assert Path(written["path"]).parent == folder
    shipped = ROOT / "calibration" / "profiles" / Path(written["path"]).name
    assert not shipped.exists() or shipped.stat().st_mtime < os.path.getmtime(written["path"])
    cls = written["hardware_class"]
    gpu = next(g.name for g in capsim.load_catalog().gpus if g.hardware_class == cls)
    out = capsim.predict(gpu=gpu, model="qwen3-0.6b", concurrency=[1], requests=8)
    assert out.profile == written["name"]
    assert out.profile_path == written["path"]
    # a profile serves one engine, any of its releases, named after both
    assert (written["engine"], written["name"]) == ("vllm", f"{cls}-vllm")
    release = dict(concurrency=[1], requests=8, engine="vllm@0.7.3")
    assert capsim.predict(gpu=gpu, model="qwen3-0.6b", **release).profile == written["name"]
    with pytest.raises(capsim.CapsimUserError, match=r"fitted under vllm, not llama\.cpp"):
        capsim.predict(
            gpu=gpu, model="qwen3-0.6b", concurrency=[1], engine="llama.cpp", profile=cls + "-vllm"
        )


def test_the_command_starts_without_its_heavy_dependencies():
    # start-up is instant: building the command (what --help needs) imports no numeric,
    # validation or simulation library; each command imports what it uses
    code = (
        "import sys, capsim, capsim.cli.main; "
        "print(sorted(m for m in ('numpy', 'scipy', 'simpy', 'pydantic', 'yaml', 'httpx') "
        "if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


def test_dir_shows_the_public_api_and_defaults_match_the_cli():
    """Issue 48: dir(capsim) lists what the API offers, not its lazy-loading machinery; the
    Python API's defaults are the command line's (--gamma-cv was 1.0 against 2.0)."""
    import typer

    import capsim
    from capsim.cli.main import app
    from capsim.engine.config import PredictConfig

    shown = dir(capsim)
    assert {"predict", "capacity", "plan", "load_catalog", "__version__"} <= set(shown)
    assert not {"TYPE_CHECKING", "annotations", "lazy", "lazy_exports", "_EXPORTS"} & set(shown)
    predict_cmd = typer.main.get_command(app).commands["predict"]
    cli = {p.name: p.default for p in predict_cmd.params}
    config = PredictConfig(gpu="h100-sxm", model="llama-3.1-8b")
    for name in ("gamma_cv", "turns", "arrival", "input_tokens", "output_tokens"):
        assert getattr(config, name) == cli[name], name
