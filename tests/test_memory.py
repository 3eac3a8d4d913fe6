"""Memory fit: KV bytes per token by hand for each attention kind, and budget invariants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capsim.catalog.loader import load_catalog
from capsim.errors import CapsimUserError, DoesNotFitError
from capsim.physics.kv_layout import BLOCK_SIZE_TOKENS, kv_bytes_per_token, kv_layout
from capsim.physics.memory import GIB, memory_fit, require_fit, weight_bytes

CAT = load_catalog()


def test_gqa_kv_bytes_by_hand(cat):
    # Llama-3.1-8B: 32 layers x (K and V) x 8 KV heads x 128 dims x 2 bytes
    assert kv_bytes_per_token(cat.model("llama-3.1-8b")) == 32 * 2 * 8 * 128 * 2 == 131072
    assert kv_bytes_per_token(cat.model("llama-3.1-8b"), "fp8") == 65536
    # TP=2 halves the KV heads per GPU; TP=16 cannot go below one head per GPU
    assert kv_bytes_per_token(cat.model("llama-3.1-8b"), tp=2) == 65536
    qwen = cat.model("qwen3-30b-a3b")  # 4 KV heads
    assert kv_bytes_per_token(qwen, tp=8) == 48 * 2 * 1 * 128 * 2


def test_mla_kv_bytes_by_hand(cat):
    # DeepSeek-V3: 61 layers x (512 latent + 64 rope) x 2 bytes, replicated across TP
    m = cat.model("deepseek-v3")
    assert kv_bytes_per_token(m) == 61 * (512 + 64) * 2 == 70272
    assert kv_bytes_per_token(m, tp=8) == 70272
    assert kv_bytes_per_token(m, "fp8") == 61 * 576


def test_sliding_window_kv_by_hand(cat):
    # gpt-oss-120b: 18 full + 18 sliding layers, 8 KV heads x 64 dims, window 128
    m = cat.model("gpt-oss-120b")
    lay = kv_layout(m)
    per_layer = 2 * 8 * 64 * 2
    assert lay.full_bytes_per_token == 18 * per_layer
    assert lay.sliding_bytes_per_token == 18 * per_layer
    assert lay.sliding_window == 128
    # A 10,000-token sequence holds all its tokens in full layers but only the window
    # (rounded up to blocks, plus one partial block) in sliding layers.
    window_tokens = (math.ceil(128 / BLOCK_SIZE_TOKENS) + 1) * BLOCK_SIZE_TOKENS
    assert lay.sequence_bytes(10_000) == 10_000 * 18 * per_layer + window_tokens * 18 * per_layer
    # Short sequences hold every token in both kinds of layer.
    assert lay.sequence_bytes(64) == 64 * 36 * per_layer


def test_sglang_window_pool_by_hand(cat):
    """SGLang's hybrid SWA memory (hardware_db/engines/sglang.yaml): one full-pool token
    costs the full layers' bytes plus 0.8 x the sliding layers', every layer allocated (the
    18 KV-shared layers of Gemma 4 E4B too); vLLM's one pool counts the 24 layers that keep
    a cache, and Gemma 3 (not on SGLang's list) keeps one pool on SGLang as well."""
    sglang = cat.engine("sglang")
    pool = sglang.sliding_window_pool
    assert pool is not None and pool.full_tokens_ratio == 0.8
    e4b = cat.model("gemma-4-e4b")
    full_layer, sliding_layer = 2 * 2 * 512 * 2, 2 * 2 * 256 * 2  # K+V x heads x dim x bf16
    # 42 layers, every sixth full: 7 full and 35 sliding, 4 and 20 of them with a cache
    assert kv_layout(e4b).full_bytes_per_token == 4 * full_layer
    assert kv_layout(e4b).sliding_bytes_per_token == 20 * sliding_layer
    h200, bf16 = cat.gpu("h200"), cat.quant("bf16")
    kw = dict(gpu_memory_utilization=0.85, max_model_len=9216)
    split = memory_fit(h200, e4b, bf16, sliding_window_pool=pool, **kw)
    one = memory_fit(h200, e4b, bf16, **kw)
    assert split.kv_bytes_per_token == 7 * full_layer + 0.8 * 35 * sliding_layer == 86_016
    assert one.kv_bytes_per_token == 4 * full_layer + 20 * sliding_layer == 57_344
    assert split.sliding_pool_ratio == 0.8 and one.sliding_pool_ratio is None
    assert split.kv_capacity_tokens <= split.kv_budget_bytes / 86_016
    assert split.kv_capacity_tokens > split.kv_budget_bytes / 86_016 - BLOCK_SIZE_TOKENS
    # the full pool bounds a sequence: no window shortens what it holds
    assert split.max_sequences == int(split.kv_budget_bytes // (9216 * 86_016))
    gemma3 = cat.model("gemma-3-27b")
    assert not pool.applies_to(gemma3.architecture)
    g3 = memory_fit(cat.gpu("h200"), gemma3, bf16, sliding_window_pool=pool, **kw)
    assert (
        g3.kv_bytes_per_token == memory_fit(cat.gpu("h200"), gemma3, bf16, **kw).kv_bytes_per_token
    )


def test_vllm_keeps_only_the_window_of_sliding_layers(cat):
    """vLLM's hybrid KV cache manager (hardware_db/engines/vllm.yaml): a pool token costs
    gpt-oss-120b's 18 full layers alone and each running sequence holds its 128-token window
    (9 blocks with the partial one) of the 18 sliding layers, as a fixed part like a state.
    The simulation then holds what the fit reports: 1k + 8k tokens a sequence fit about
    twice as often as with every sliding token counted."""
    assert cat.engine("vllm").sliding_window_pages and not cat.engine("sglang").sliding_window_pages
    m, h100, fmt = cat.model("gpt-oss-120b"), cat.gpu("h100-sxm"), cat.quant("mxfp4")
    per_layer = 2 * 8 * 64 * 2
    kw = dict(tp=2, max_model_len=9216)
    pages = memory_fit(h100, m, fmt, sliding_window_pages=True, **kw)
    every = memory_fit(h100, m, fmt, **kw)
    assert pages.kv_bytes_per_token == 18 * per_layer // 2  # two GPUs share the KV heads
    assert every.kv_bytes_per_token == 36 * per_layer // 2
    assert pages.window_bytes_per_sequence == 144 * 18 * per_layer / 2
    assert pages.state_blocks_per_sequence == 9 and every.state_blocks_per_sequence == 0
    assert pages.kv_full_bytes_per_token == every.kv_full_bytes_per_token  # as reported
    assert pages.sliding_window == every.sliding_window == 128
    # sequences of 9,216 tokens: the pool's tokens over (9,216 + 9 x 16) a sequence
    assert pages.max_sequences == every.max_sequences  # the fit counted windows already
    held = pages.kv_capacity_tokens // (9216 + 9 * BLOCK_SIZE_TOKENS)
    assert held == pytest.approx(pages.max_sequences, rel=0.01)
    assert held > 1.9 * (every.kv_capacity_tokens // 9216)


def test_hybrid_linear_attention_by_hand(cat):
    # Qwen3.5-27B: 16 full-attention layers x 2 x 4 KV heads x 256 dims x 2 bytes per token,
    # plus per sequence 48 GDN layers x (48 heads x 128 x 128 x 4 bytes recurrent state
    # + 3 conv steps x (2 x 16 x 128 + 48 x 128) channels x 2 bytes)
    m = cat.model("qwen3.5-27b")
    lay = kv_layout(m)
    assert lay.full_bytes_per_token == 16 * 2 * 4 * 256 * 2 == 65536
    recurrent = 48 * 128 * 128 * 4
    conv = 3 * (2 * 16 * 128 + 48 * 128) * 2
    assert lay.state_bytes_per_sequence == 48 * (recurrent + conv)
    # fp8 KV halves the attention cache but not the recurrent state
    lay8 = kv_layout(m, "fp8")
    assert lay8.full_bytes_per_token == 32768
    assert lay8.state_bytes_per_sequence == lay.state_bytes_per_sequence
    # TP=4 splits both
    assert kv_layout(m, tp=4).state_bytes_per_sequence == pytest.approx(
        lay.state_bytes_per_sequence / 4
    )


def test_awq_weights_match_seed_002_model_sizes(cat):
    # Seed 002: "Model size 16.9 GB" (Qwen3-Coder-30B-A3B AWQ) and "19.5 GB" (Qwen2.5-Coder-32B AWQ)
    awq = cat.quant("awq-int4")
    moe = sum(weight_bytes(cat.model("qwen3-coder-30b-a3b"), awq).values())
    dense = sum(weight_bytes(cat.model("qwen2.5-coder-32b"), awq).values())
    assert moe / 1e9 == pytest.approx(16.9, rel=0.03)
    assert dense / 1e9 == pytest.approx(19.5, rel=0.03)


def test_seed_001_model_size(cat):
    # Seed 001: "each GPU hosted a full copy of the roughly 29 GB model" (Qwen3.5-27B, FP8)
    w = sum(weight_bytes(cat.model("qwen3.5-27b"), cat.quant("fp8")).values())
    assert w / 1e9 == pytest.approx(29, rel=0.05)


def test_mxfp4_leaves_attention_in_bf16(cat):
    m = cat.model("gpt-oss-120b")
    parts = weight_bytes(m, cat.quant("mxfp4"))
    bf16 = weight_bytes(m, cat.quant("bf16"))
    assert parts["attention"] == bf16["attention"]
    assert parts["experts"] == pytest.approx(bf16["experts"] * 4.25 / 16)


def test_fit_qwen3_coder_on_3090(cat):
    fit = memory_fit(cat.gpu("rtx3090"), cat.model("qwen3-coder-30b-a3b"), cat.quant("awq-int4"))
    assert fit.fits
    assert fit.kv_bytes_per_token == 98304
    budget = 24 * GIB * 0.9
    assert fit.kv_budget_bytes == pytest.approx(
        budget - fit.weight_bytes - fit.activation_bytes - fit.runtime_reserve_bytes
    )
    assert fit.kv_capacity_tokens == pytest.approx(fit.kv_budget_bytes / 98304, abs=16)
    assert fit.kv_capacity_tokens % BLOCK_SIZE_TOKENS == 0
    assert 20_000 < fit.kv_capacity_tokens < 80_000


def test_llama_70b_bf16_does_not_fit_on_3090(cat):
    fit = memory_fit(cat.gpu("rtx3090"), cat.model("llama-3.3-70b"), cat.quant("bf16"))
    assert not fit.fits
    assert fit.weight_bytes / 1e9 == pytest.approx(141, rel=0.01)
    assert "141.1 GB" in fit.reason and "24 GiB" in fit.reason
    with pytest.raises(DoesNotFitError):
        require_fit(fit)


def test_too_long_max_model_len_does_not_fit(cat):
    args = (cat.gpu("rtx3090"), cat.model("qwen2.5-coder-32b"), cat.quant("awq-int4"))
    auto = memory_fit(*args)
    assert auto.fits and auto.max_model_len == auto.max_model_len_limit
    too_long = memory_fit(*args, max_model_len=auto.max_model_len_limit + 1000)
    assert not too_long.fits and "max_model_len" in too_long.reason
    with pytest.raises(CapsimUserError, match="maximum context"):
        memory_fit(*args, max_model_len=10**6)


def test_tp_must_divide_heads(cat):
    with pytest.raises(CapsimUserError, match="does not divide"):
        memory_fit(cat.gpu("rtx3090"), cat.model("qwen3-8b"), cat.quant("bf16"), tp=3)


def test_bad_options_are_user_errors(cat):
    args = (cat.gpu("rtx3090"), cat.model("qwen3-8b"), cat.quant("awq-int4"))
    with pytest.raises(CapsimUserError, match="gpu_memory_utilization"):
        memory_fit(*args, gpu_memory_utilization=1.5)
    with pytest.raises(CapsimUserError, match="KV cache dtype"):
        memory_fit(*args, kv_dtype="int3")


def test_fp8_kv_doubles_capacity(cat):
    args = (cat.gpu("h100-sxm"), cat.model("llama-3.1-8b"), cat.quant("bf16"))
    bf16 = memory_fit(*args, kv_dtype="auto")
    fp8 = memory_fit(*args, kv_dtype="fp8")
    assert fp8.kv_capacity_tokens == pytest.approx(2 * bf16.kv_capacity_tokens, abs=32)


def test_tp_splits_weights(cat):
    args = (cat.gpu("rtx3090"), cat.model("qwen3-32b"), cat.quant("awq-int4"))
    one, two = memory_fit(*args, tp=1), memory_fit(*args, tp=2)
    norms_router = one.weight_breakdown["norms"] + one.weight_breakdown["router"]
    assert two.weight_bytes == pytest.approx((one.weight_bytes - norms_router) / 2 + norms_router)


GPU_NAMES = [g.name for g in CAT.gpus]
MODEL_NAMES = [m.name for m in CAT.models]


@settings(max_examples=60, deadline=None)
@given(
    gpu=st.sampled_from(GPU_NAMES),
    model=st.sampled_from(MODEL_NAMES),
    quant=st.sampled_from(["bf16", "fp8", "awq-int4", "gguf-q4_k_m"]),
    util=st.floats(0.5, 0.95),
    extra=st.floats(0.0, 0.05),
)
def test_more_memory_utilization_never_reduces_capacity(gpu, model, quant, util, extra):
    args = (CAT.gpu(gpu), CAT.model(model), CAT.quant(quant))
    low = memory_fit(*args, gpu_memory_utilization=util)
    high = memory_fit(*args, gpu_memory_utilization=util + extra)
    assert high.kv_capacity_tokens >= low.kv_capacity_tokens
    assert high.max_sequences >= low.max_sequences
    assert high.fits or not low.fits


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from(MODEL_NAMES),
    kv=st.sampled_from(["auto", "fp8"]),
    a=st.integers(1, 300_000),
    b=st.integers(1, 300_000),
)
def test_sequence_bytes_grow_with_context(model, kv, a, b):
    lay = kv_layout(CAT.model(model), kv)
    lo, hi = sorted((a, b))
    assert lay.sequence_bytes(lo) <= lay.sequence_bytes(hi)


@settings(max_examples=40, deadline=None)
@given(model=st.sampled_from(MODEL_NAMES), bits=st.sampled_from(["bf16", "fp8", "awq-int4"]))
def test_fewer_bits_never_more_weight_bytes(model, bits):
    m = CAT.model(model)
    order = ["awq-int4", "fp8", "bf16"]
    sizes = [sum(weight_bytes(m, CAT.quant(q)).values()) for q in order]
    assert sizes == sorted(sizes)


@pytest.mark.parametrize(
    ("model", "printed_gib"), [("gpt-oss-20b", 11.27), ("gpt-oss-120b", 59.02)]
)
def test_gguf_mxfp4_weights_match_the_size_llama_bench_prints(model, printed_gib):
    # benches/dgx-spark.md: "gpt-oss 20B MXFP4 MoE | 11.27 GiB", "gpt-oss 120B ... | 59.02 GiB";
    # the file also holds float32 norms, biases and sinks, so capsim may be a little under
    from capsim.physics.memory import weight_bytes

    gguf = sum(weight_bytes(CAT.model(model), CAT.quant("gguf-mxfp4")).values())
    release = sum(weight_bytes(CAT.model(model), CAT.quant("mxfp4")).values())
    printed = printed_gib * 2**30
    assert 0.99 * printed < gguf <= printed
    assert release > 1.02 * printed  # BF16 outside the experts would be larger than the file


def test_split_state_pool_caps_running_requests_by_hand(cat):
    # SGLang: the state pool takes r / (1 + r) of the memory left after weights and
    # reserves (r = 0.9), the attention KV the rest; each running request holds 3 slots
    g, m, q = cat.gpu("h200"), cat.model("qwen3.6-35b-a3b"), cat.quant("bf16")
    shared = memory_fit(g, m, q, gpu_memory_utilization=0.8)
    split = memory_fit(
        g,
        m,
        q,
        gpu_memory_utilization=0.8,
        state_layout="split",
        state_share=0.9 / 1.9,
        state_slots_per_sequence=3,
    )
    rest = split.kv_budget_bytes
    state = split.state_bytes_per_sequence
    # 30 GDN layers x (32 heads x 128 x 128 x 4 bytes + 3 x 8,192 conv channels x 2 bytes)
    assert state == 30 * (32 * 128 * 128 * 4 + 3 * (2 * 16 * 128 + 32 * 128) * 2)
    assert split.state_pool_bytes == pytest.approx(rest * 0.9 / 1.9)
    assert split.state_sequence_cap == int(rest * 0.9 / 1.9 // (3 * state))
    assert split.max_num_seqs == min(shared.max_num_seqs, split.state_sequence_cap)
    kv_tokens = int(rest / 1.9 // split.kv_bytes_per_token)
    assert split.kv_capacity_tokens == kv_tokens - kv_tokens % BLOCK_SIZE_TOKENS
    assert split.state_blocks_per_sequence == 0
    # the shared layout pages each running sequence's state into the KV pool instead
    assert shared.state_sequence_cap is None
    assert shared.kv_capacity_tokens > split.kv_capacity_tokens
    assert shared.state_blocks_per_sequence == math.ceil(
        state / (BLOCK_SIZE_TOKENS * shared.kv_bytes_per_token)
    )
    # one slot per request (radix cache off) triples the cap
    one = memory_fit(
        g, m, q, gpu_memory_utilization=0.8, state_layout="split", state_share=0.9 / 1.9
    )
    assert one.state_sequence_cap == int(rest * 0.9 / 1.9 // state)


def test_split_state_pool_ignores_models_without_state(cat):
    g, m, q = cat.gpu("h100-sxm"), cat.model("llama-3.1-8b"), cat.quant("bf16")
    plain = memory_fit(g, m, q)
    split = memory_fit(g, m, q, state_layout="split", state_share=0.5, state_slots_per_sequence=3)
    assert split.kv_capacity_tokens == plain.kv_capacity_tokens
    assert split.state_sequence_cap is None and split.state_layout == "shared"


def test_the_speculative_drafter_shares_the_pool_by_hand(cat):
    """vLLM gives the drafter's attention layers pages of the one KV pool and loads its
    weights from the same budget (physics/drafter_memory.py)."""
    from capsim.physics.drafter_memory import Drafter, draft_format, eagle_layer_weight_count

    gpu, target = cat.gpu("rtx4090"), cat.model("llama-3.1-8b")
    fmt = cat.quant("awq-int4")
    alone = memory_fit(gpu, target, fmt)
    # a Llama-3.2-1B draft: 16 layers x (K and V) x 8 KV heads x 64 dims x 2 bytes a token
    small = cat.model("llama-3.2-1b")
    draft = Drafter("draft", small, draft_format(cat, "awq-int4", small))
    with_draft = memory_fit(gpu, target, fmt, drafter=draft)
    assert with_draft.kv_bytes_per_token == 131072 + 16 * 2 * 8 * 64 * 2 == 163840
    assert with_draft.weight_breakdown["drafter"] == pytest.approx(
        sum(weight_bytes(small, fmt).values())
    )
    budget = alone.kv_budget_bytes - with_draft.weight_breakdown["drafter"]
    assert with_draft.kv_budget_bytes == pytest.approx(budget)
    assert with_draft.kv_capacity_tokens == pytest.approx(budget / 163840, abs=BLOCK_SIZE_TOKENS)
    # EAGLE: one decoder layer (attention, the dense FFN, the 2 h^2 fc) at the target's
    # format, and one layer's KV in the target's shape
    eagle = memory_fit(gpu, target, fmt, drafter=Drafter("eagle"))
    layer = (4096 * 128 * (32 + 2 * 8) + 32 * 128 * 4096) + 3 * 4096 * 14336 + 2 * 4096**2
    assert eagle_layer_weight_count(target) == layer
    assert eagle.weight_breakdown["drafter"] == pytest.approx(layer * fmt.bits_per_weight / 8)
    assert eagle.kv_bytes_per_token == 131072 + 2 * 8 * 128 * 2
    # MTP: DeepSeek-V3's one MTP layer keeps a latent like the other 61 (its weights are
    # the model's MTP module)
    v3 = cat.model("deepseek-v3")
    h200, fp8 = cat.gpu("h200"), cat.quant("fp8")
    mtp = memory_fit(h200, v3, fp8, tp=8, drafter=Drafter("mtp"))
    assert mtp.kv_bytes_per_token == (61 + 1) * (512 + 64) * 2
    assert mtp.weight_breakdown["drafter"] == 0.0 and mtp.weight_breakdown["mtp"] > 0
    # n-gram lookup runs on the CPU: no drafter
    from capsim.physics.drafter_memory import drafter_for
    from capsim.physics.speculative import SpecConfig

    assert drafter_for(cat, SpecConfig(method="ngram", num_tokens=4), None) is None


@settings(max_examples=25, deadline=None)
@given(
    model=st.sampled_from(["llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v3", "gemma-3-27b"]),
    method=st.sampled_from(["eagle", "mtp", "draft"]),
    tp=st.sampled_from([1, 2, 4, 8]),
)
def test_a_drafter_never_adds_capacity(model, method, tp):
    from capsim.physics.drafter_memory import Drafter

    m = CAT.model(model)
    small = CAT.model("qwen3-0.6b")
    drafter = Drafter(method, small, CAT.quant("bf16")) if method == "draft" else Drafter(method)
    gpu = CAT.gpu("h200")
    try:
        alone = memory_fit(gpu, m, CAT.quant("fp8"), tp=tp)
        spec = memory_fit(gpu, m, CAT.quant("fp8"), tp=tp, drafter=drafter)
    except CapsimUserError:  # TP does not divide the heads
        return
    assert spec.kv_capacity_tokens <= alone.kv_capacity_tokens
    assert spec.max_sequences <= alone.max_sequences
    assert spec.weight_bytes >= alone.weight_bytes


def test_a_drafter_too_large_is_named_in_the_reason(cat):
    """A draft model larger than the GPU was reported as the target's weights alone."""
    from capsim.physics.drafter_memory import Drafter

    big = cat.model("deepseek-v3")
    fit = memory_fit(
        cat.gpu("rtx4090"),
        cat.model("llama-3.1-8b"),
        cat.quant("bf16"),
        drafter=Drafter("draft", big, cat.quant("fp8")),
    )
    assert not fit.fits and "the speculative drafter's" in fit.reason
