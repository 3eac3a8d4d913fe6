"""A wheel carries the catalog: installed from a wheel, capsim finds hardware_db."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"building the wheel failed:\n{proc.stdout}\n{proc.stderr}")
    (path,) = out.glob("capsim-*.whl")
    return path


def test_wheel_contains_every_catalog_and_calibration_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for yaml_file in (ROOT / "hardware_db").rglob("*.yaml"):
        rel = yaml_file.relative_to(ROOT / "hardware_db")
        assert f"capsim/hardware_db/{rel.as_posix()}" in names, rel
    for data_file in (ROOT / "calibration").rglob("*.yaml"):
        rel = data_file.relative_to(ROOT / "calibration")
        assert f"capsim/calibration_data/{rel.as_posix()}" in names, rel
    assert "capsim/engine/simulate.py" in names


def test_installed_wheel_loads_its_own_catalog(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    code = (
        "import capsim.cli.main; "  # the CLI imports every layer (probe and planner too)
        "import capsim, capsim.catalog.loader as l, capsim.calibration.published as p; "
        "print(l.builtin_db_dir()); print(len(capsim.load_catalog().gpus)); "
        "print(p.published_dir())"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("CAPSIM_DB", None)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
    )
    db_dir, count, published = out.stdout.split()
    assert Path(db_dir).is_relative_to(target)
    assert int(count) >= 15
    assert Path(published).is_relative_to(target) and any(Path(published).glob("*.yaml"))


def test_every_subpackage_is_in_the_wheel():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "capsim").rglob("__init__.py")
    }
    missing = sorted(found - listed)
    assert not missing, f"add {missing} to [tool.setuptools] packages in pyproject.toml"
