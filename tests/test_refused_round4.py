"""The fourth hostile-input round of issue 47, on what came in on 2026-12-02: engine
releases (``--engine sglang@X``) and their generations' batch tiers, the engine fields
``weight_only_formats`` and ``admission_reserve.holds_until_finish``, the fused-MoE
efficiency parameters and ``calibrate-kernels`` fused-MoE datasets. Each bad input is exit 2
(or a CapsimUserError in the Python API) with a line naming the flag, file or field."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from capsim.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
DB = ROOT / "hardware_db"
runner = CliRunner()
EXPLAIN = ["explain", "--gpu", "h100-sxm", "--model", "llama-3.1-8b"]


def refused(args: list[str], *says: str) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    flat = " ".join(r.output.split())
    for words in says:
        assert words in flat, r.output
    return flat


@pytest.mark.parametrize("engine", ["sglang@1!0.4", "vllm@1!0.7", "llama.cpp@1!b6918"])
def test_a_release_of_another_epoch_is_no_release(engine):
    """'1!0.4' is a PEP 440 version above every release: it was predicted as the newest
    release without a note (no generation holds it, and its minor number is not above the
    newest's)."""
    refused([*EXPLAIN, "--engine", engine], "is not a release number of")


@pytest.mark.parametrize(
    "engine, example", [("sglang@", "sglang@0.5.19"), ("llama.cpp@", "llama.cpp@b9174")]
)
def test_no_release_after_the_at_sign_names_one_of_the_engines_own(engine, example):
    """The hint's example was vLLM's 0.7.3 for every engine: 'llama.cpp@0.7.3' is refused."""
    from capsim.catalog.loader import load_catalog

    newest = load_catalog().engine(engine[:-1]).releases.newest
    assert example.endswith(newest)
    refused([*EXPLAIN, "--engine", engine], "names no release", f"e.g. {example}")


@pytest.mark.parametrize(
    "gpu, graphs", [("h20", 160), ("rtx-pro-6000", 160), ("gh200", 160), ("h200", 256)]
)
def test_sglang_04_captures_256_only_above_96_gib(gpu, graphs):
    """SGLang 0.4.6's capture list runs to 256 on gpu_mem > 96 * 1024 MiB; a card sold as
    96 GB reports less (the H20 97,871 MiB) and stays at 160 (the row at 96 GB gave 256)."""
    from capsim.catalog.loader import load_catalog

    cat = load_catalog()
    row = cat.engine("sglang@0.4.6").batch_limits(gpu, cat.gpu(gpu).memory_gb)
    assert row.cuda_graph_max_batch == graphs
