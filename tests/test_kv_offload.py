"""vLLM's KV offloading (--kv-offloading-size): a tier of the prefix cache in system RAM,
its eviction, the load a hit there costs, and what it does for agents whose contexts the
GPU's cache cannot hold."""

from __future__ import annotations

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


def test_a_prompt_found_in_system_ram_waits_for_its_load_and_skips_its_prefill():
    """A 4,096-token prompt whose first 4,080 tokens (255 blocks) sit in system RAM and not
    on the GPU: it reaches the engine after 4,080 tokens' KV crossed PCIe 4.0 x16 at
    host_link_efficiency, and enters with them computed."""
    setup = build_setup(
        PredictConfig(
            gpu="rtx3090", model="qwen3-8b", quant="awq-int4", kv_offloading_gb=16, profile="none"
        ),
        CAT,
    )
    env = simpy.Environment()
    rep = Replica(env, 0, setup.step_model, setup.scheduler, setup.num_blocks)
    rep.scheduler.kv.host.store("s", 300)
    req = SimRequest(env, 0, 0.0, 4096, 8, "s", session="s")
    rep.submit(req)
    env.run()
    link = CAT.gpu("rtx3090").interconnect("pcie").bandwidth_gb_s_per_direction * 1e9
    link *= setup.step_model.params.host_link_efficiency
    load_s = 4080 * setup.fit.kv_bytes_per_token / link
    assert req.first_scheduled == pytest.approx(load_s)
    assert rep.scheduler.kv.host.loaded_tokens == 4080
    assert rep.scheduler.kv.hit_tokens == 4080


def test_agents_whose_contexts_outgrow_the_gpu_cache_load_instead_of_recomputing():
    """16 agents of 8 turns growing from 8,000 tokens on one RTX 3090: the GPU's cache
    (about 103,000 tokens) cannot keep their contexts, so without the tier nearly every
    turn is prefilled again; with 64 GiB of system RAM most are loaded back."""
    load = dict(
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
    )
    without = predict(PredictConfig(**load), workers=1).levels[0]
    with_tier = predict(PredictConfig(**load, kv_offloading_gb=64), workers=1).levels[0]
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
