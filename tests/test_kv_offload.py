"""vLLM's KV offloading (--kv-offloading-size): a tier of the prefix cache in system RAM,
its eviction, the load a hit there costs, and what it does for agents whose contexts the
GPU's cache cannot hold."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from capsim.catalog.loader import load_catalog
from capsim.engine.config import PredictConfig
from capsim.engine.kv_offload import HostKVTier
from capsim.engine.replica import Replica
from capsim.engine.request import SimRequest
from capsim.engine.setup import build_setup
from capsim.engine.simulate import predict
from capsim.errors import CapsimUserError

CAT = load_catalog()


def agents_level(**extra):
    """16 agents of 8 turns growing from 8,000 tokens (500 of tool output and 200 of
    their own a turn) on one RTX 3090 with Qwen3-8B AWQ, uncalibrated: its level."""
    config = PredictConfig(
        gpu="rtx3090",
        model="qwen3-8b",
        quant="awq-int4",
        workload="agents",
        concurrency=[16],
        turns=8,
        input_tokens="8000",
        tool_tokens="500",
        output_tokens="200",
        profile="none",
        **extra,
    )
    return predict(config, workers=1).levels[0]


def test_the_tier_keeps_leading_blocks_and_evicts_the_least_recent_stream():
    tier = HostKVTier(10)
    tier.store("a", 4)
    tier.store("b", 5)
    assert tier.prefix("a") == 4  # a is now the most recent
    tier.store("c", 3)  # 12 > 10: b, the least recent, goes whole
    assert (tier.prefix("b"), tier.prefix("a"), tier.prefix("c")) == (0, 4, 3)
    tier.store("a", 6)  # a grows by two: 9 of 10
    assert tier.used == 9 and tier.prefix("a") == 6
    tier.store("d", 25)  # longer than the tier: keeps what room the others leave
    assert tier.used <= tier.capacity


def test_a_prompt_found_in_system_ram_loads_in_its_first_step_and_skips_its_prefill():
    """A 4,096-token prompt whose first 4,080 tokens (255 blocks) sit in system RAM and not
    on the GPU: the step that admits it waits for those tokens' KV to cross PCIe 4.0 x16 at
    host_link_efficiency, and computes only the last 16 tokens."""
    setup = build_setup(
        PredictConfig(
            gpu="rtx3090", model="qwen3-8b", quant="awq-int4", kv_offloading_gb=16, profile="none"
        ),
        CAT,
    )
    env = simpy.Environment()
    rep = Replica(env, 0, setup.step_model, setup.scheduler, setup.num_blocks)
    rep.scheduler.kv.host.store("s", 300)
    req = SimRequest(env, 0, 0.0, 4096, 1, "s", session="s")
    rep.submit(req)
    env.run()
    link = CAT.gpu("rtx3090").interconnect("pcie").bandwidth_gb_s_per_direction * 1e9
    link *= setup.step_model.params.host_link_efficiency
    load_s = 4080 * setup.fit.kv_bytes_per_token / link
    step_s = setup.step_model.scheduled_step_time(np.array([16.0]), np.array([4080.0]))
    assert req.first_token == pytest.approx(load_s + step_s, rel=1e-6)
    assert rep.scheduler.kv.host.loaded_tokens == 4080
    assert rep.scheduler.kv.hit_tokens == 4080


def test_agents_whose_contexts_outgrow_the_gpu_cache_load_instead_of_recomputing():
    """16 agents of 8 turns growing from 8,000 tokens on one RTX 3090: the GPU's cache
    (about 103,000 tokens) cannot keep their contexts, so without the tier nearly every
    turn is prefilled again; with 64 GiB of system RAM most are loaded back."""
    without = agents_level()
    with_tier = agents_level(kv_offloading_gb=64)
    assert without.prefix_cache_hit_rate < 0.05 < 0.4 < with_tier.prefix_cache_hit_rate
    assert with_tier.metrics.output_tok_s > 2 * without.metrics.output_tok_s
    assert with_tier.metrics.ttft_ms.p50 < without.metrics.ttft_ms.p50


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (dict(engine="sglang"), "--enable-hierarchical-cache"),
        (dict(engine="llama.cpp", quant="gguf-q4_k_m"), "has no KV tier in system RAM"),
        (dict(prefix_caching=False), "--no-prefix-caching"),
        (dict(gpu="gb10"), "shares one memory"),
    ],
)
def test_kv_offloading_where_it_cannot_apply_is_refused(extra, message):
    config = PredictConfig(
        **{"gpu": "rtx3090", "model": "qwen3-8b", "kv_offloading_gb": 8, **extra}
    )
    with pytest.raises(CapsimUserError, match=message):
        build_setup(config, CAT)


def test_sglangs_hicache_pool_is_a_ratio_of_the_devices_or_a_size_a_gpu():
    """SGLang's --enable-hierarchical-cache: a host pool --hicache-ratio (2 by default)
    times the device pool, or --hicache-size GB a GPU over one GPU's bytes a block."""
    base = dict(gpu="rtx3090", model="qwen3-8b", quant="awq-int4", engine="sglang")
    on = build_setup(PredictConfig(**base, hierarchical_cache=True), CAT)
    assert on.scheduler.host_kv_blocks == 2 * on.num_blocks
    tripled = build_setup(PredictConfig(**base, hierarchical_cache=True, hicache_ratio=3), CAT)
    assert tripled.scheduler.host_kv_blocks == 3 * tripled.num_blocks
    sized = build_setup(PredictConfig(**base, hierarchical_cache=True, hicache_size_gb=10), CAT)
    assert sized.scheduler.host_kv_blocks == int(10e9 // (16 * sized.fit.kv_bytes_per_token))
    off = build_setup(PredictConfig(**base), CAT)
    assert off.scheduler.host_kv_blocks == 0


def test_sglang_agents_hit_their_contexts_in_the_host_pool():
    without = agents_level(engine="sglang")
    with_pool = agents_level(engine="sglang", hierarchical_cache=True)
    assert with_pool.prefix_cache_hit_rate > without.prefix_cache_hit_rate + 0.3
    assert with_pool.metrics.output_tok_s > 2 * without.metrics.output_tok_s


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (dict(hierarchical_cache=True), "--enable-hierarchical-cache is SGLang's"),
        (dict(engine="sglang", hicache_ratio=4), "--enable-hierarchical-cache is not given"),
        (
            dict(engine="sglang", hierarchical_cache=True, prefix_caching=False),
            "--no-prefix-caching",
        ),
    ],
)
def test_hicache_where_it_cannot_apply_is_refused(extra, message):
    config = PredictConfig(**{"gpu": "rtx3090", "model": "qwen3-8b", **extra})
    with pytest.raises(CapsimUserError, match=message):
        build_setup(config, CAT)
