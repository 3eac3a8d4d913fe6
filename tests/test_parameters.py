"""Parameter counts computed from dimensions match the model cards' published totals."""

from __future__ import annotations

import pytest

from capsim.catalog.loader import load_catalog
from capsim.physics.parameters import attention_params, linear_attention_params, parameter_breakdown

MODELS = [m.name for m in load_catalog().models if m.published is not None]


def _tolerance(unit_b: float | None) -> dict[str, float]:
    """2%, or half the unit of a rounded label's last digit where the card gives only one."""
    return {"rel": 0.02, "abs": (unit_b or 0) / 2}


@pytest.mark.parametrize("name", MODELS)
def test_total_matches_published_within_2_percent(cat, name):
    m = cat.model(name)
    p = parameter_breakdown(m)
    total = p.total + (p.mtp if m.published.includes_mtp else 0)
    total += p.vision if m.published.includes_vision else 0
    assert total / 1e9 == pytest.approx(
        m.published.total_b, **_tolerance(m.published.total_label_unit_b)
    )


@pytest.mark.parametrize("name", [n for n in MODELS if load_catalog().model(n).published.active_b])
def test_active_matches_published_within_2_percent(cat, name):
    m = cat.model(name)
    p = parameter_breakdown(m)
    active = p.active_by_convention(m.published.active_convention)
    active += p.vision if m.published.includes_vision else 0
    assert active / 1e9 == pytest.approx(
        m.published.active_b, **_tolerance(m.published.active_label_unit_b)
    )


def test_a_model_without_a_published_total_says_why(cat):
    """Most cards publish a count; where one gives only a rounded label or none, the
    entry's notes say so (the count is then not tested against anything)."""
    assert len(MODELS) >= 0.85 * len(cat.models)
    for m in cat.models:
        if m.published is None:
            assert m.notes, f"{m.name} has no published total and no note saying why"


def test_llama_8b_by_hand(cat):
    m = cat.model("llama-3.1-8b")
    h, kv, ffn, vocab, layers = 4096, 8 * 128, 14336, 128256, 32
    per_layer = (h * h + 2 * h * kv + h * h) + 3 * h * ffn + 2 * h
    expected = layers * per_layer + 2 * vocab * h + h
    assert parameter_breakdown(m).total == expected


def test_moe_active_by_hand(cat):
    m = cat.model("qwen3-30b-a3b")
    p = parameter_breakdown(m)
    expert = 3 * 2048 * 768
    assert p.expert_params_per_expert == expert
    assert p.routed_experts == 48 * 128 * expert
    assert p.routed_experts_active == 48 * 8 * expert
    assert p.total - p.active == 48 * 120 * expert


def test_mla_attention_by_hand(cat):
    m = cat.model("deepseek-v3")
    h, heads = 7168, 128
    q = h * 1536 + 1536 * heads * 192 + 1536
    kv = h * (512 + 64) + 512 + 512 * heads * (128 + 128)
    o = heads * 128 * h
    assert attention_params(m) == q + kv + o


def test_gated_deltanet_by_hand(cat):
    m = cat.model("qwen3.5-27b")
    proj, small = linear_attention_params(m)
    h, nk, nv, d = 5120, 16, 48, 128
    assert proj == h * (2 * nk * d + 2 * nv * d) + h * 2 * nv + nv * d * h
    assert small == (2 * nk * d + nv * d) * 4 + 2 * nv + d
    assert m.count_layers("linear_attention") == 48
    assert m.count_layers("full_attention") == 16


def test_output_gate_doubles_q_projection(cat):
    m = cat.model("qwen3.5-27b")
    plain = m.model_copy(update={"attn_output_gate": False})
    assert attention_params(m) - attention_params(plain) == 5120 * 24 * 256


def test_tied_embeddings_drop_lm_head(cat):
    m = cat.model("qwen3-8b")
    tied = m.model_copy(update={"tie_word_embeddings": True})
    assert parameter_breakdown(tied).lm_head == 0
    assert parameter_breakdown(m).total - parameter_breakdown(tied).total == 151936 * 4096


def test_mla_down_projections_are_whole_on_every_gpu():
    """vLLM (fused_qkv_a_proj with disable_tp) and SGLang (ReplicatedLinear) keep MLA's
    q and kv down-projections whole on every GPU: DeepSeek-R1's 7,168 x (1,536 + 512 + 64)
    a layer; a GQA model has none."""
    from capsim.catalog.loader import load_catalog
    from capsim.physics.memory import weight_bytes
    from capsim.physics.parameters import parameter_breakdown

    cat = load_catalog()
    dsr1, fp8 = cat.model("deepseek-r1"), cat.quant("fp8")
    b = parameter_breakdown(dsr1)
    assert b.attention_replicated == 7168 * 2112 * 61
    per_byte = fp8.bits_per_weight / 8
    split = (b.attention - b.attention_replicated) * per_byte
    assert weight_bytes(dsr1, fp8, 8)["attention"] == pytest.approx(
        split / 8 + b.attention_replicated * per_byte
    )
    assert weight_bytes(dsr1, fp8, 1)["attention"] == pytest.approx(b.attention * per_byte)
    assert parameter_breakdown(cat.model("llama-3.1-8b")).attention_replicated == 0
