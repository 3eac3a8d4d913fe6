"""Real config.json files of recent architectures import with the parameter counts their
publishers state (within 2%) and the weight format their files state
(tests/data/hf_configs/published.yaml names each file's source and each figure's quote),
and the new architectural terms cost what a hand count says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capsim.catalog.hf_import import model_from_hf_config, quant_file_beside, read_config
from capsim.physics.kv_layout import kv_layout
from capsim.physics.parameters import parameter_breakdown

DATA = Path(__file__).parent / "data" / "hf_configs"
PUBLISHED = yaml.safe_load((DATA / "published.yaml").read_text())


def _import(folder: str):
    path = DATA / folder / "config.json"
    return model_from_hf_config(
        read_config(path),
        folder,
        hf_id=PUBLISHED[folder]["hf_id"],
        source=str(path),
        quant_file=quant_file_beside(path),
    )


def test_every_kept_config_is_listed_with_its_source():
    folders = {p.name for p in DATA.iterdir() if p.is_dir()}
    assert folders == set(PUBLISHED)
    for entry in PUBLISHED.values():
        assert entry["config_source"] and entry["published"]["quote"]


@pytest.mark.parametrize("folder", sorted(PUBLISHED))
def test_total_matches_the_published_count_within_2_percent(folder):
    published = PUBLISHED[folder]["published"]
    p = parameter_breakdown(_import(folder))
    total = p.total + published.get("encoders_b", 0) * 1e9
    total += p.mtp if published.get("includes_mtp") else 0
    assert total / 1e9 == pytest.approx(published["total_b"], rel=0.02)


@pytest.mark.parametrize(
    "folder", sorted(f for f, e in PUBLISHED.items() if e["published"].get("active_b"))
)
def test_active_matches_the_published_count_within_2_percent(folder):
    published = PUBLISHED[folder]["published"]
    p = parameter_breakdown(_import(folder))
    active = p.active_by_convention(published["active_convention"])
    if published.get("active_includes_encoders"):
        active += published["encoders_b"] * 1e9
    assert active / 1e9 == pytest.approx(published["active_b"], rel=0.02)


@pytest.mark.parametrize("folder", sorted(PUBLISHED))
def test_the_weight_format_is_read_from_the_checkpoints_files(folder):
    assert _import(folder).dtype == PUBLISHED[folder]["format"]


def test_gemma4_full_layers_have_their_own_head_shape_and_no_v_proj():
    """31B: 50 sliding layers of 16 KV heads x 256 and 10 full layers of 4 x 512 whose keys
    are the values (attention_k_eq_v: no v_proj)."""
    m = _import("gemma-4-31b-it")
    h, heads = 5376, 32
    sliding = h * heads * 256 + 2 * h * 16 * 256 + heads * 256 * h
    full = h * heads * 512 + 1 * h * 4 * 512 + heads * 512 * h
    assert parameter_breakdown(m).attention == 50 * sliding + 10 * full
    kv = kv_layout(m, "auto", tp=1)
    assert kv.sliding_bytes_per_token == 50 * 2 * 16 * 256 * 2
    assert kv.full_bytes_per_token == 10 * 2 * 4 * 512 * 2


def test_gemma4_kv_shared_layers_keep_no_cache_and_no_kv_projections():
    """E2B: 35 layers (every fifth full), the last 20 share KV; layers 0-14 keep a cache:
    12 sliding and 3 full, one KV head each (256 sliding, 512 full)."""
    m = _import("gemma-4-e2b-it")
    kv = kv_layout(m, "auto", tp=1)
    assert kv.sliding_bytes_per_token == 12 * 2 * 1 * 256 * 2
    assert kv.full_bytes_per_token == 3 * 2 * 1 * 512 * 2
    h, heads = 1536, 8
    own = {"sliding_attention": 256, "full_attention": 512}
    expected = 0
    for layer, kind in enumerate(m.layer_types):
        d = own[kind]
        kv_proj = 2 * h * d if layer < 15 else 0
        expected += h * heads * d + kv_proj + heads * d * h
    assert parameter_breakdown(m).attention == expected


def test_gemma4_kv_shared_layers_still_read_the_cache_they_share():
    """E2B's last 20 layers keep no cache but attend over an earlier layer's: a decode
    step reads K and V in all 35 layers (28 sliding, 7 full) and writes them in 15."""
    import numpy as np

    from capsim.catalog.loader import load_catalog
    from capsim.physics.deployment import Deployment
    from capsim.physics.step import StepModel

    m = _import("gemma-4-e2b-it")
    cat = load_catalog()
    step = StepModel(cat.gpu("h200"), m, cat.quant("bf16"), Deployment(tp=1))
    assert step.kv_read.sliding_bytes_per_token == 28 * 2 * 1 * 256 * 2
    assert step.kv_read.full_bytes_per_token == 7 * 2 * 1 * 512 * 2
    seqs, context = 64, 8192  # past the 512-token window: sliding layers read 512 tokens
    agg = step._aggregate(np.ones(seqs, dtype=int), np.full(seqs, context))
    t = step._terms(*agg, seqs, 0.0)
    read = seqs * ((context + 1) * 7 * 2048 + 512 * 28 * 1024)
    assert t["kv_read"] == pytest.approx(read)
    assert t["kv_write"] == seqs * (3 * 2048 + 12 * 1024)


def test_gemma4_per_layer_embeddings_are_looked_up_not_read():
    """E2B's per-layer table (262,144 x 35 x 256) counts in the total but, unlike the tied
    token table (which is the output head too), is not read by a decode step: in bf16 a
    step reads every other weight, two bytes each."""
    from capsim.catalog.loader import load_catalog
    from capsim.physics.deployment import Deployment
    from capsim.physics.step import StepModel

    m = _import("gemma-4-e2b-it")
    p = parameter_breakdown(m)
    assert p.per_layer_embeddings == 262_144 * 35 * 256
    cat = load_catalog()
    step = StepModel(cat.gpu("h200"), m, cat.quant("bf16"), Deployment(tp=1))
    assert step.dense_weight_bytes == pytest.approx((p.total - p.per_layer_embeddings) * 2)


def test_gemma4_moe_layers_run_their_dense_mlp_beside_the_experts():
    """26B-A4B: every layer has a GeGLU MLP of 2112 beside 128 experts of 704 (top 8)."""
    m = _import("gemma-4-26b-a4b-it-4bit")
    assert m.moe.experts_per_token == 8
    assert (m.moe.num_shared_experts, m.moe.shared_width) == (1, 2112)
    p = parameter_breakdown(m)
    assert p.routed_experts_active == 30 * 8 * 3 * 2816 * 704


def test_nemotron_super_latent_experts_work_on_the_latent_width():
    """Super: 512 ReLU^2 experts of 2688 on a 1024 latent (2 matrices), and per MoE layer a
    4096 -> 1024 -> 4096 pair of projections every token runs, beside the shared expert."""
    m = _import("nemotron-3-super-120b-a12b-nvfp4")
    assert m.moe.latent_size == 1024 and not m.mlp_gated
    p = parameter_breakdown(m)
    assert p.expert_params_per_expert == 2 * 1024 * 2688
    assert p.moe_layers == 40
    shared_and_latent = 2 * 4096 * 5376 + 2 * 4096 * 1024
    assert p.shared_experts == 40 * shared_and_latent
    assert p.routed_experts_active == 40 * 22 * 2 * 1024 * 2688


def test_minimax_m3_leads_with_dense_layers_of_their_own_width():
    """M3: moe_layer_freq [0, 0, 0] + [1] * 57; the three dense layers' FFN is
    dense_intermediate_size (12288) wide, the experts intermediate_size (3072)."""
    m = _import("minimax-m3")
    assert m.moe.first_dense_layers == 3 and m.intermediate_size == 12288
    assert m.moe.moe_intermediate_size == 3072
    p = parameter_breakdown(m)
    assert p.mlp == 3 * 3 * 6144 * 12288
    assert p.moe_layers == 57


CATALOG_CONFIGS = Path(__file__).parent / "data" / "hf_configs_catalog"


@pytest.mark.parametrize("folder", sorted(p.name for p in CATALOG_CONFIGS.iterdir() if p.is_dir()))
def test_a_catalog_models_own_config_imports_as_its_hand_written_entry(folder):
    """The config.json of a catalog model (tests/data/hf_configs_catalog/SOURCES.md) gives
    the entry's parameter breakdown, KV layout and weight format exactly."""
    from capsim.catalog.loader import load_catalog
    from capsim.catalog.resolve import resolve_model

    cat = load_catalog()
    repo = folder.replace("--", "/")
    entry = cat.model(resolve_model(repo, cat, offline=True).name)
    path = CATALOG_CONFIGS / folder / "config.json"
    imported = model_from_hf_config(read_config(path), "imported", hf_id=repo)
    assert parameter_breakdown(imported) == parameter_breakdown(entry)
    assert kv_layout(imported) == kv_layout(entry)
    assert imported.dtype == entry.dtype


QUANT = Path(__file__).parent / "data" / "hf_quant"
QUANT_CASES = yaml.safe_load((QUANT / "SOURCES.yaml").read_text())


@pytest.mark.parametrize("name", sorted(QUANT_CASES))
def test_a_real_checkpoints_quantization_metadata_names_its_format(name):
    """tests/data/hf_quant: ModelOpt's hf_quant_config.json (single and MIXED_PRECISION) and
    config.json quantization blocks (ModelOpt, compressed-tensors mixed-precision, MXFP4,
    block FP8), each as published, read as the format its weights are stored in."""
    from capsim.catalog.hf_quant import quant_of_config

    text = (QUANT / name).read_text()
    if name.endswith("hf_quant_config.json"):
        found = quant_of_config({}, {}, json.loads(text))
    else:
        found = quant_of_config(json.loads("{" + text.strip().rstrip(",") + "}"), {})
    assert found == QUANT_CASES[name]["format"]
    assert set(QUANT_CASES) == {p.name for p in QUANT.iterdir()} - {"SOURCES.yaml"}


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        ({"group_size": 64, "bits": 4}, "mlx-4bit"),
        ({"group_size": 64, "bits": 8, "mode": "affine"}, "mlx-8bit"),
        ({"group_size": 32, "bits": 4, "mode": "mxfp4"}, "mxfp4"),
        ({"group_size": 16, "bits": 4, "mode": "nvfp4"}, "nvfp4"),
    ],
)
def test_mlx_quantization_blocks(block, expected):
    """mlx-lm writes {group_size, bits[, mode]} as config.json's "quantization" (and the same
    as "quantization_config"): mlx_lm/utils.py at d78bf58e."""
    from capsim.catalog.hf_quant import quant_of_config

    assert quant_of_config({"quantization": block, "quantization_config": block}, {}) == expected


HOSTILE_VALUES = [None, "x", "", -1, 0, 1.5, [], {}, [1], {"a": 1}, 10**30, True, 1e308]


@settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    folder=st.sampled_from(sorted(PUBLISHED)),
    edits=st.lists(
        st.tuples(st.integers(0, 10_000), st.sampled_from([*HOSTILE_VALUES, "<drop>"])),
        min_size=1,
        max_size=3,
    ),
    in_text_config=st.booleans(),
)
def test_a_mutated_config_imports_or_says_what_is_wrong(folder, edits, in_text_config):
    """issue 47: any key of a real config.json set to a value of another type or range, or
    dropped, either imports or is a user error (exit 2 at the command line), never another
    exception; a million layers are refused, not expanded."""
    from capsim.errors import CapsimUserError

    config = read_config(DATA / folder / "config.json")
    target = config.get("text_config") if in_text_config else None
    target = target if isinstance(target, dict) else config
    keys = sorted(target)
    for index, value in edits:
        key = keys[index % len(keys)]
        if value == "<drop>":
            target.pop(key, None)
        else:
            target[key] = value
    try:
        model = model_from_hf_config(config, "mutated")
    except CapsimUserError:
        return
    parameter_breakdown(model)
    kv_layout(model, "auto", tp=1)
