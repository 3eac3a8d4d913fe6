"""A release outside those an engine's entry was read from is predicted as the nearest,
and capsim says so (issue 47: nothing runs silently on a version it knows nothing of)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from capsim.catalog.engine_schema import EngineReleases, parse_engine_version
from capsim.catalog.loader import load_catalog
from capsim.notices import take_notices


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


def notes_for(cat, reference: str) -> list[str]:
    take_notices()
    cat.engine(reference)
    return take_notices()


def test_a_newer_release_is_predicted_as_the_newest_read_with_a_note(cat):
    (note,) = notes_for(cat, "vllm@0.99")
    assert "vllm@0.99 is newer than 0.24.0" in note
    assert "predicted as that release" in note
    # the same engine as the newest release's entry
    assert cat.engine("vllm@0.99").async_scheduling == cat.engine("vllm").async_scheduling
    (note,) = notes_for(cat, "llama.cpp@b99999")
    assert "newer than b9174" in note
    (note,) = notes_for(cat, "sglang@0.6.0")
    assert "newer than 0.5.19" in note


def test_an_older_release_than_described_is_named(cat):
    (note,) = notes_for(cat, "vllm@0.5.4")
    assert "older than 0.6.0" in note and "oldest generation" in note
    assert cat.engine("vllm@0.5.4").generation == (
        "V0 engine + gpu_memory_utilization 0.9 + GGUF checkpoints loadable"
    )


@pytest.mark.parametrize(
    "release, utilization, gguf",
    [
        ("vllm", 0.92, False),
        ("vllm@0.24.0", 0.92, False),
        ("vllm@0.23.0", 0.92, True),
        ("vllm@0.20.0", 0.92, True),
        ("vllm@0.19.1", 0.9, True),
        ("vllm@0.7.3", 0.9, True),
    ],
)
def test_vllm_releases_default_memory_share_and_gguf(cat, release, utilization, gguf):
    """--gpu-memory-utilization defaults to 0.92 from 0.20.0 (0.9 before); the 0.24.0 wheel
    has no GGUF loader, which 0.23.0 had: the releases read (hardware_db/engines/vllm.yaml's
    generations "<0.20" and "<0.24")."""
    eng = cat.engine(release)
    assert eng.memory_utilization == utilization
    assert eng.loads("gguf-q4_k_m") is gguf
    assert eng.loads("awq-int4")


@pytest.mark.parametrize(
    "reference",
    ["vllm@0.24.0", "vllm@0.24.3", "vllm@0.7.3", "vllm@0.6.0", "sglang@0.5.19", "llama.cpp@b6918"],
)
def test_releases_read_pass_without_a_note(cat, reference):
    assert notes_for(cat, reference) == []


def test_an_engine_without_a_version_has_no_note(cat):
    assert notes_for(cat, "vllm") == []


@given(minor=st.integers(0, 24), patch=st.integers(0, 30))
def test_every_vllm_release_from_0_6_to_0_24_is_read(minor, patch):
    releases = EngineReleases(oldest="0.6.0", newest="0.24.0", rationale="test")
    version = parse_engine_version(f"0.{minor}.{patch}")
    note = releases.outside(f"vllm@0.{minor}.{patch}", version)
    assert (note is None) == (minor >= 6)


def test_bounds_must_be_release_numbers():
    with pytest.raises(ValidationError, match="not a release number"):
        EngineReleases(newest="main", rationale="test")
    with pytest.raises(ValidationError, match="not a release number"):
        EngineReleases(oldest="latest", newest="0.24.0", rationale="test")


def test_a_format_the_newest_vllm_no_longer_loads_names_who_does(cat):
    """vLLM 0.24 has no GGUF loader: predict refuses a GGUF checkpoint and names the engines
    that load it and the older vLLM releases that did; an older release takes it."""
    from typer.testing import CliRunner

    from capsim.cli.main import app

    line = ["predict", "--gpu", "rtx3090", "--model", "qwen3-8b", "--quant", "gguf-q4_k_m"]
    r = CliRunner().invoke(app, [*line, "-c", "1", "--requests", "2"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    flat = " ".join(r.output.split())
    assert "vllm does not load gguf-q4_k_m checkpoints" in flat
    assert "--engine llama.cpp or sglang (or --engine vllm@VERSION of a release <0.24)" in flat
    older = CliRunner().invoke(
        app, [*line, "--engine", "vllm@0.23.0", "-c", "1", "--requests", "2"]
    )
    assert older.exit_code == 0, older.output
    r = CliRunner().invoke(app, [*line[:-1], "awq-int4", "--engine", "llama.cpp", "-c", "1"])
    assert r.exit_code == 2 and "or --engine sglang or vllm for awq-int4" in " ".join(
        r.output.split()
    )
    assert "VERSION" not in r.output  # no llama.cpp build loaded AWQ
