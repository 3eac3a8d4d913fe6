"""The catalog: every entry validates, carries sources, and the schemas reject bad data."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from capsim.catalog.gpu_schema import GPU
from capsim.catalog.loader import builtin_db_dir, load_catalog
from capsim.catalog.model_schema import Model, QuantFormat
from capsim.errors import CatalogError, UnknownNameError

REQUIRED_GPUS = {
    "rtx3090",
    "rtx3090ti",
    "rtx4090",
    "rtx5090",
    "rtx-a4000",
    "rtx-pro-6000",
    "l40s",
    "a100-80g",
    "h100-sxm",
    "h100-pcie",
    "h200",
    "b200",
    "mi300x",
    "intel-arc-pro-b70",
    "ryzen-ai-max-395",
}
REQUIRED_MODELS = {
    "qwen3-coder-30b-a3b",
    "qwen2.5-coder-32b",
    "qwen3.5-27b",
    "qwen3.5-122b-a10b",
    "qwen3-30b-a3b",
    "qwen3-32b",
    "qwen3-8b",
    "llama-3.1-8b",
    "llama-3.3-70b",
    "gpt-oss-20b",
    "gpt-oss-120b",
    "deepseek-v3",
    "glm-4.5-air",
}
REQUIRED_FORMATS = {
    "bf16",
    "fp16",
    "fp8",
    "int8",
    "awq-int4",
    "gptq-int4",
    "mxfp4",
    "nvfp4",
    "gguf-q4_k_m",
    "gguf-q8_0",
}


def test_required_entries_present(cat):
    assert set(cat.gpus.names()) >= REQUIRED_GPUS
    assert set(cat.models.names()) >= REQUIRED_MODELS
    assert set(cat.quant_formats.names()) >= REQUIRED_FORMATS


def test_file_name_matches_entry_name(cat):
    for section in (cat.gpus, cat.models, cat.quant_formats):
        for name, path in section.origin.items():
            assert path.stem == name, f"{path} holds '{name}'"


def test_every_entry_has_sources(cat):
    for entry in [*cat.gpus, *cat.models, *cat.quant_formats]:
        assert entry.sources, entry.name
        for s in entry.sources:
            assert s.title.strip()
            assert s.url or s.quote or s.note, f"{entry.name}: source '{s.title}' says nothing"


def test_gpu_figures_are_dense_and_consistent(cat):
    for g in cat.gpus:
        tf = g.tensor_tflops
        # dtypes listed as native have a figure or are explicitly unknown; listed figures
        # for non-native dtypes would be emulation, which the catalog does not record
        for dtype in ("fp8", "fp4"):
            if getattr(tf, dtype) is not None:
                assert dtype in g.native_formats, f"{g.name}: {dtype} figure but not native"
        if tf.bf16 and tf.fp8:
            assert tf.fp8 == pytest.approx(2 * tf.bf16, rel=0.05), g.name
        if g.price is not None:
            assert g.price.source.title


def test_hand_checked_gpu_figures(cat):
    g = cat.gpu("rtx3090")
    assert (g.memory_gb, g.memory_bandwidth_gb_s, g.l2_cache_mb) == (24, 936, 6)
    assert g.tensor_tflops.fp8 is None and "fp8" not in g.native_formats
    assert g.interconnect("nvlink").bandwidth_gb_s_per_direction == 56.25
    assert cat.gpu("h100-sxm").tensor_tflops.bf16 == 989.5  # dense, not the 1,979 sparse
    assert cat.gpu("b70").name == "intel-arc-pro-b70"
    assert cat.gpu("strix-halo").serving_memory_gb == 96


def test_lookup_ignores_case_and_separators(cat):
    assert cat.gpu("RTX 3090").name == "rtx3090"
    assert cat.gpu("Rtx-4090").name == "rtx4090"
    assert cat.model("Qwen3-Coder").name == "qwen3-coder-30b-a3b"
    assert cat.quant("AWQ").name == "awq-int4"


def test_unknown_name_suggests_close_matches(cat):
    with pytest.raises(UnknownNameError) as exc:
        cat.gpu("rtx309")
    assert "rtx3090" in exc.value.suggestions
    with pytest.raises(UnknownNameError) as exc:
        cat.model("qwen3-codr-30b-a3b")
    assert exc.value.suggestions[0] == "qwen3-coder-30b-a3b"


def _gpu_data(cat) -> dict:
    return cat.gpu("rtx3090").model_dump(mode="json")


def test_gpu_schema_rejects_bad_values(cat):
    data = _gpu_data(cat)
    GPU.model_validate(data)
    for field, bad in [
        ("memory_bandwidth_gb_s", -1),
        ("memory_gb", 0),
        ("native_formats", ["fp9"]),
        ("sources", []),
        ("vendor", "acme"),
    ]:
        with pytest.raises(ValidationError):
            GPU.model_validate({**data, field: bad})
    with pytest.raises(ValidationError):
        GPU.model_validate({**data, "memory_bandwith_gb_s": 1})  # typo: unknown field


def test_model_schema_rejects_inconsistent_layers(cat):
    data = cat.model("qwen3.5-27b").model_dump(mode="json")
    Model.model_validate(data)
    with pytest.raises(ValidationError, match="linear_attention"):
        Model.model_validate({**data, "linear_attention": None})
    gpt = cat.model("gpt-oss-20b").model_dump(mode="json")
    with pytest.raises(ValidationError, match="sliding_window"):
        Model.model_validate({**gpt, "sliding_window": None})
    moe = cat.model("qwen3-30b-a3b").model_dump(mode="json")
    bad_moe = {**moe["moe"], "experts_per_token": 129}
    with pytest.raises(ValidationError, match="experts_per_token"):
        Model.model_validate({**moe, "moe": bad_moe})
    dense = cat.model("qwen3-8b").model_dump(mode="json")
    with pytest.raises(ValidationError, match="intermediate_size"):
        Model.model_validate({**dense, "intermediate_size": None})


def test_quant_format_bits(cat):
    assert cat.quant("bf16").bits_per_weight == 16
    assert cat.quant("awq-int4").bits_per_weight == pytest.approx(4 + 20 / 128)
    assert cat.quant("mxfp4").bits_per_weight == pytest.approx(4.25)
    assert cat.quant("nvfp4").bits_per_weight == pytest.approx(4.5)
    assert cat.quant("gguf-q8_0").bits_per_weight == pytest.approx(8.5)
    data = cat.quant("awq-int4").model_dump(mode="json")
    with pytest.raises(ValidationError):
        QuantFormat.model_validate({**data, "quantized_tensors": ["everything"]})


def write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def test_user_overlay_adds_and_replaces(cat, tmp_path, monkeypatch):
    gpu = _gpu_data(cat)
    write(tmp_path / "gpus" / "my-gpu.yaml", {**gpu, "name": "my-gpu", "aliases": []})
    write(tmp_path / "gpus" / "rtx3090.yaml", {**gpu, "memory_bandwidth_gb_s": 900})
    overlaid = load_catalog([tmp_path])
    assert overlaid.gpu("my-gpu").memory_gb == 24
    assert overlaid.gpu("rtx3090").memory_bandwidth_gb_s == 900
    assert len(overlaid.gpus) == len(cat.gpus) + 1
    monkeypatch.setenv("CAPSIM_DB", str(tmp_path))
    assert load_catalog().gpu("my-gpu").name == "my-gpu"


def test_bad_user_file_names_file_and_field(cat, tmp_path):
    gpu = _gpu_data(cat)
    path = write(tmp_path / "gpus" / "broken.yaml", {**gpu, "name": "broken", "tdp_w": -5})
    with pytest.raises(CatalogError) as exc:
        load_catalog([tmp_path])
    assert str(path) in exc.value.message and "tdp_w" in exc.value.message
    (tmp_path / "gpus" / "broken.yaml").write_text("name: [unclosed")
    with pytest.raises(CatalogError, match="not valid YAML"):
        load_catalog([tmp_path])


def test_missing_user_dir_is_a_clear_error(tmp_path):
    with pytest.raises(CatalogError, match="does not exist"):
        load_catalog([tmp_path / "nope"])


def test_builtin_dir_has_the_three_sections():
    root = builtin_db_dir()
    for sub in ("gpus", "models", "quant_formats"):
        assert any((root / sub).glob("*.yaml"))


def test_cached_catalog_equals_the_parsed_one_and_follows_every_edit(cat, tmp_path, monkeypatch):
    """The parsed catalog is kept in the cache folder under a key of every file's path,
    size and modification time: reading it back gives the same entries, and an edited,
    added or removed file, or a damaged cache file, is never served stale."""
    import os

    cache = tmp_path / "cache"
    monkeypatch.setenv("CAPSIM_CACHE_DIR", str(cache))
    overlay = tmp_path / "db"
    gpu = {**_gpu_data(cat), "name": "my-gpu", "aliases": []}
    path = write(overlay / "gpus" / "my-gpu.yaml", gpu)
    first = load_catalog([overlay])
    # the built-in catalog and the one with the overlay laid over it, each under its key
    # (an overlay's catalog parses only the overlay's files over the built-in one)
    assert len(list(cache.glob("catalog-*.json"))) == 2
    again = load_catalog([overlay])  # read back from the cache
    assert again is not first
    for section in ("gpus", "models", "quant_formats", "efficiency", "engines"):
        assert getattr(again, section).entries == getattr(first, section).entries
        assert getattr(again, section).origin == getattr(first, section).origin
    monkeypatch.setenv("CAPSIM_NO_CACHE", "1")
    assert load_catalog([overlay]).gpus.entries == again.gpus.entries
    monkeypatch.delenv("CAPSIM_NO_CACHE")

    def edit(data: dict) -> None:
        stamp = path.stat().st_mtime_ns
        write(path, data)
        # an edit made in the same clock tick would keep the stamp; a person's is later
        os.utime(path, ns=(stamp + 10**9, stamp + 10**9))

    edit({**gpu, "memory_gb": 48})  # same size as before: only the time tells
    assert load_catalog([overlay]).gpu("my-gpu").memory_gb == 48
    write(overlay / "gpus" / "other.yaml", {**gpu, "name": "other-gpu"})
    assert load_catalog([overlay]).gpu("other-gpu").name == "other-gpu"
    (overlay / "gpus" / "other.yaml").unlink()
    with pytest.raises(UnknownNameError):
        load_catalog([overlay]).gpu("other-gpu")
    for cached in cache.glob("catalog-*.json"):
        cached.write_bytes(b"not a pickle")
    assert load_catalog([overlay]).gpu("my-gpu").memory_gb == 48
    assert len(list(cache.glob("catalog-*.json"))) <= 4  # older ones are pruned


def test_gpu_measured_efficiency_names_real_parameters_with_a_measurement_source():
    """A GPU's own ``efficiency`` (laid over its class's) names EfficiencyParams fields with
    valid values, and the GPU cites a capsim measurement (calibration/kernels/) for them."""
    from capsim.physics.efficiency import EfficiencyParams

    carrying = [g for g in load_catalog().gpus if g.efficiency]
    assert carrying, "no GPU carries measured efficiency parameters"
    for g in carrying:
        EfficiencyParams().with_overrides(g.efficiency)  # raises on an unknown name or value
        assert any(str(s.url).startswith("calibration/kernels/") for s in g.sources), g.name


def test_a_file_planted_in_the_cache_folder_never_runs_code(cat, tmp_path, monkeypatch):
    """Issue 47: the cache keeps JSON read back through the schemas, never a pickle. A
    pickle that would run code, planted under every name the cache uses, is ignored and
    replaced by the parsed catalog; so are a file past MAX_CACHED_BYTES and a directory
    where an entry goes."""
    import pickle

    from capsim.catalog.cache import MAX_CACHED_BYTES

    cache = tmp_path / "cache"
    monkeypatch.setenv("CAPSIM_CACHE_DIR", str(cache))
    load_catalog()
    names = [p.name for p in cache.glob("catalog-*.json")]
    assert names
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    bomb = pickle.dumps(Payload())
    for name in names:
        (cache / name).write_bytes(bomb)
        (cache / name.replace(".json", ".pickle")).write_bytes(bomb)
    again = load_catalog()
    assert not marker.exists()
    assert again.gpus.entries == cat.gpus.entries
    for name in names:  # the planted file was replaced by a valid entry
        assert (cache / name).read_bytes().startswith(b"{")
        with (cache / name).open("r+b") as f:  # sparse: no disk is written
            f.truncate(MAX_CACHED_BYTES + 1)
    assert load_catalog().gpus.entries == cat.gpus.entries
    for name in names:
        assert (cache / name).stat().st_size < MAX_CACHED_BYTES  # replaced, not read
        (cache / name).unlink()
        (cache / name).mkdir()
    assert load_catalog().gpus.entries == cat.gpus.entries


def test_an_overlay_is_parsed_over_the_cached_built_in_catalog(cat, tmp_path, monkeypatch):
    """With an overlay (--db, the models imported from config.json files) only the overlay's
    files are parsed, over the built-in catalog read from the cache: the same entries, in
    the same order, with the same origins as parsing every file, and an overlay entry named
    as a built-in one replaces it."""
    from capsim.catalog import loader

    monkeypatch.setenv("CAPSIM_CACHE_DIR", str(tmp_path / "cache"))
    overlay = tmp_path / "db"
    gpu = {**_gpu_data(cat), "name": "my-gpu", "aliases": []}
    write(overlay / "gpus" / "my-gpu.yaml", gpu)
    replaced = cat.gpus.names()[0]
    write(
        overlay / "gpus" / f"{replaced}.yaml", {**_gpu_data(cat), "name": replaced, "aliases": []}
    )
    load_catalog()  # the built-in catalog, now in the cache
    parsed: list[Path] = []
    real = loader.load_entry
    monkeypatch.setattr(loader, "load_entry", lambda p, k: parsed.append(p) or real(p, k))
    laid = load_catalog([overlay])
    assert sorted(p.name for p in parsed) == sorted(["my-gpu.yaml", f"{replaced}.yaml"])
    dirs = tuple(laid.directories)
    whole = loader._parse(dirs, loader._catalog_files(dirs))
    for section in loader.SECTIONS:
        assert list(getattr(laid, section).entries) == list(getattr(whole, section).entries)
        assert getattr(laid, section).entries == getattr(whole, section).entries
        assert getattr(laid, section).origin == getattr(whole, section).origin
    assert laid.gpus.origin[replaced].parent == overlay / "gpus"
