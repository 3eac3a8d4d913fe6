"""The hostile files kept in tests/data/hostile/ (issue 47), fed to every command that reads
a file: each answers exit 2 with an error naming the file, never a traceback, a hang, a
file written, or code run from the data (python-tag.yaml and pickle.pkl would create
'capsim-pwned' if anything executed them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from capsim.cli.main import app

HOSTILE = Path(__file__).resolve().parent / "data" / "hostile"
FILES = sorted(p for p in HOSTILE.iterdir() if p.suffix != ".py")
PREDICT = ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--concurrency", "1"]

READERS = {
    "validate": lambda f, out: ["validate", str(f)],
    "calibrate": lambda f, out: ["calibrate", str(f), "--out", str(out / "p.yaml")],
    "predict --profile": lambda f, out: [*PREDICT, "--profile", str(f)],
    "predict --output-tokens file:": lambda f, out: [*PREDICT, "--output-tokens", f"file:{f}"],
    "predict --input-tokens file:": lambda f, out: [*PREDICT, "--input-tokens", f"file:{f}"],
    "predict --trace": lambda f, out: [*PREDICT[:5], "--workload", "trace", "--trace", str(f)],
    "import vllm-bench": lambda f, out: ["import", "vllm-bench", str(f), "--out", str(out / "r")],
    "import guidellm": lambda f, out: ["import", "guidellm", str(f), "--out", str(out / "r")],
    "import aiperf": lambda f, out: ["import", "aiperf", str(f), "--out", str(out / "r")],
    "models import-hf": lambda f, out: [
        *["models", "import-hf", str(f), "--name", "x", "--out", str(out)]
    ],
    "calibrate-kernels": lambda f, out: ["calibrate-kernels", str(f)],
    "probe summarize": lambda f, out: ["probe", "summarize", str(f)],
    "--db overlay": lambda f, out: ["--db", str(overlay(f, out.parent)), "gpus"],
}
"""Every command that reads a file the user names, by the flag or argument that names it."""


def overlay(path: Path, folder: Path) -> Path:
    """A catalog overlay folder holding ``path`` as one GPU entry (gpus/NAME.yaml)."""
    db = folder / "db" / path.name
    (db / "gpus").mkdir(parents=True, exist_ok=True)
    (db / "gpus" / f"{path.name}.yaml").write_bytes(path.read_bytes())
    return db


def test_the_corpus_is_there():
    assert len(FILES) >= 25, FILES


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_hostile_file_is_exit_2_naming_it(reader, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    failures = []
    for path in FILES:
        result = CliRunner().invoke(app, READERS[reader](path, out))
        first = result.stderr.strip().splitlines()[0] if result.stderr.strip() else ""
        problem = (
            "a traceback"
            if "Traceback" in result.output or not isinstance(result.exception, SystemExit | None)
            else f"exit {result.exit_code}"
            if result.exit_code != 2
            else "no error line"
            if not first.startswith("error:")
            else "the file is not named"
            if path.name not in first
            else None
        )
        if problem:
            failures.append(f"{path.name}: {problem}: {result.output[-300:]!r}")
    assert not failures, "\n".join(failures)
    assert not (tmp_path / "capsim-pwned").exists(), "code from a data file ran"
    assert not any(out.iterdir()), f"written from hostile input: {list(out.iterdir())}"
