"""Disaggregated prefill and decode (issue 49 item 3): the KV transfer's time, the link it
takes, a request's path through the prefill pool, the transfer and a decode replica, the
flags, and what it changes against co-located replicas."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from capsim.catalog.loader import load_catalog
from capsim.cli.main import app
from capsim.engine.config import PredictConfig
from capsim.engine.setup import build_setup
from capsim.engine.simulate import predict
from capsim.errors import CapsimUserError
from capsim.physics.kv_transfer import (
    KVLink,
    KVTransfer,
    busiest_bytes_per_token,
    kv_transfer_link,
)

CAT = load_catalog()
runner = CliRunner()
LLAMA_KV = 32 * 8 * 128 * 2 * 2
"""Llama-3.1-8B's KV bytes per token in bf16: 32 layers x 8 KV heads x 128 dims x (K, V) x
2 bytes = 131,072."""


def config(**extra) -> PredictConfig:
    base = dict(
        gpu="h100-sxm",
        model="llama-3.1-8b",
        concurrency=[1],
        requests=4,
        input_tokens="2048",
        output_tokens="64",
        profile="none",
    )
    return PredictConfig(**{**base, **extra})


def test_a_transfer_takes_the_fixed_cost_and_the_bytes_over_the_link():
    transfer = KVTransfer(LLAMA_KV, KVLink(450.0, "NVLink"), 0.8, 0.002)
    # 1,000 tokens x 131,072 B / (450 GB/s x 0.8) = 0.364 ms, plus 2 ms
    assert transfer.link_seconds(1000) == pytest.approx(1000 * 131072 / 360e9)
    assert transfer.seconds(1000) == pytest.approx(0.002 + 0.000364089, rel=1e-5)


def test_the_busiest_gpu_moves_its_own_shard_or_the_prefill_groups_share():
    # equal TP: each GPU sends what one decode GPU receives
    assert busiest_bytes_per_token(32768.0, 4, 4) == 32768.0
    # a TP2 prefill group sends a TP4 decode group's KV over two GPUs: twice a decode GPU's
    assert busiest_bytes_per_token(32768.0, 4, 2) == 65536.0
    # a wider prefill group: the decode GPUs receive their own shard, the busiest end
    assert busiest_bytes_per_token(32768.0, 2, 8) == 32768.0


def test_the_link_is_nvlink_inside_one_server_then_the_servers_nic_or_pcie():
    h100 = CAT.gpu("h100-sxm")
    assert kv_transfer_link(h100, 8) == KVLink(450.0, "NVLink", "nvlink")
    # beyond one server: the 400 Gb/s NIC each GPU of a DGX-style server has
    assert kv_transfer_link(h100, 16) == KVLink(50.0, "a 400 Gb/s RDMA NIC per GPU")
    # a two-card NVLink bridge is no switch between instances: PCIe
    pcie = CAT.gpu("rtx3090").interconnect("pcie").bandwidth_gb_s_per_direction
    assert kv_transfer_link(CAT.gpu("rtx3090"), 2) == KVLink(pcie, "PCIe")
    assert kv_transfer_link(h100, 16, 25.0) == KVLink(
        25.0, "the link given by --kv-transfer-bandwidth"
    )


def test_nvlink_and_network_transfers_take_their_own_efficiency():
    setup = build_setup(config(prefill_replicas=1), CAT)
    params = setup.step_model.params
    assert setup.kv_transfer.efficiency == params.kv_transfer_nvlink_efficiency
    given = build_setup(config(prefill_replicas=1, kv_transfer_gbs=25.0), CAT)
    assert given.kv_transfer.efficiency == params.kv_transfer_efficiency


def test_one_request_waits_for_its_prefill_the_transfer_and_one_decode_step():
    """At one client, disaggregation adds exactly the transfer, the decode server's front
    end and the decode instance's step over the prompt's last token to the co-located TTFT
    (same prefill chunks)."""
    alone = predict(config(), workers=1).levels[0].metrics
    pd = config(prefill_replicas=1)
    setup = build_setup(pd, CAT)
    split = predict(pd, workers=1).levels[0].metrics
    prompt = 2048
    last_token = setup.step_model.scheduled_step_time(np.array([1.0]), np.array([prompt - 1.0]))
    second_front_end = setup.step_model.frontend_parallel_seconds(prompt)
    extra = setup.kv_transfer.seconds(prompt) + second_front_end + last_token
    assert setup.kv_transfer.busiest_bytes_per_token == LLAMA_KV
    assert split.ttft_ms.p50 - alone.ttft_ms.p50 == pytest.approx(extra * 1e3, rel=1e-6)
    # the decodes are the same steps: the same TPOT
    assert split.tpot_ms.p50 == pytest.approx(alone.tpot_ms.p50, rel=1e-9)
    assert split.completed == 4 and split.output_tokens == 4 * 64


def test_sglangs_router_sends_to_both_instances_so_no_second_front_end_waits():
    """SGLang's router hands a request to its prefill and decode instances at once: the
    decode server's front end overlaps the prefill, and only the transfer and the step
    over the last prompt token are added (vLLM's proxy adds that front end too)."""
    extra = dict(engine="sglang")
    alone = predict(config(**extra), workers=1).levels[0].metrics
    pd = config(prefill_replicas=1, **extra)
    setup = build_setup(pd, CAT)
    assert setup.kv_transfer_handoff == "concurrent"
    split = predict(pd, workers=1).levels[0].metrics
    last_token = setup.step_model.scheduled_step_time(np.array([1.0]), np.array([2047.0]))
    added = setup.kv_transfer.seconds(2048) + last_token
    assert split.ttft_ms.p50 - alone.ttft_ms.p50 == pytest.approx(added * 1e3, rel=1e-6)


def test_decode_replicas_run_no_prompts_so_long_prompts_no_longer_stretch_decode_steps():
    """Two co-located replicas against one prefill instance and one decode replica, 32
    clients of 4,096-token prompts: the decode steps no longer carry prefill chunks, so
    no request's decodes are stretched by prompts."""
    load = dict(concurrency=[32], requests=256, input_tokens="4096", output_tokens="256")
    together = predict(config(dp=2, **load), workers=1).levels[0].metrics
    apart = predict(config(prefill_replicas=1, **load), workers=1).levels[0].metrics
    # co-located, a request's TPOT depends on how many prompts its decodes shared steps
    # with; disaggregated, every decode step is a plain decode batch
    assert together.tpot_ms.p99 > 1.1 * together.tpot_ms.p50
    assert apart.tpot_ms.p99 < 1.02 * apart.tpot_ms.p50
    assert apart.itl_ms.p99 < 0.5 * together.itl_ms.p99
    assert apart.completed == together.completed == 256


def test_another_prefill_instance_shortens_the_queue_for_first_tokens():
    load = dict(concurrency=[32], requests=256, input_tokens="8192", output_tokens="128")
    one = predict(config(prefill_replicas=1, **load), workers=1).levels[0].metrics
    two = predict(config(prefill_replicas=2, **load), workers=1).levels[0].metrics
    assert two.ttft_ms.p50 < 0.7 * one.ttft_ms.p50


@settings(max_examples=12, deadline=None)
@given(slow=st.floats(1.0, 400.0), faster=st.floats(1.01, 10.0))
def test_a_faster_link_never_slows_a_request(slow, faster):
    """Property (issue 49): a faster KV link never raises TTFT or end-to-end time."""
    load = dict(prefill_replicas=1, requests=2, input_tokens="1024", output_tokens="8")
    a = predict(config(kv_transfer_gbs=slow, **load), workers=1).levels[0].metrics
    b = predict(config(kv_transfer_gbs=slow * faster, **load), workers=1).levels[0].metrics
    assert b.ttft_ms.p50 <= a.ttft_ms.p50 + 1e-9
    assert b.e2e_s.p50 <= a.e2e_s.p50 + 1e-12


def test_prefill_instances_of_another_tp_size_are_their_own_deployment():
    setup = build_setup(config(tp=4, prefill_replicas=2, prefill_tp=2), CAT)
    assert setup.prefill.config.tp == 2 and setup.dp == 1
    assert setup.gpus == 8 and setup.instances == 3
    # the prefill GPUs hold the model over two: less room for KV than the TP4 replica
    assert setup.prefill.num_blocks < setup.num_blocks
    assert setup.kv_transfer.busiest_bytes_per_token == pytest.approx(LLAMA_KV / 2)
    # --gpus counts both pools: 8 GPUs, two TP2 prefill instances, one TP4 decode replica
    assert build_setup(config(tp=4, gpus=8, prefill_replicas=2, prefill_tp=2), CAT).dp == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (dict(engine="llama.cpp", gpu="rtx3090"), "llama.cpp has no disaggregated"),
        (dict(gpus=3, tp=2), "not a whole number of decode replicas"),
        (dict(offline=True), "--offline with --prefill-replicas"),
        (dict(prefill_tp=3), "the prefill instances \\(TP 3\\): tensor parallel size 3"),
    ],
)
def test_combinations_no_engine_runs_are_refused(extra, message):
    with pytest.raises(CapsimUserError, match=message):
        build_setup(config(prefill_replicas=1, **extra), CAT)


def test_a_prefill_flag_without_prefill_instances_is_refused():
    with pytest.raises(CapsimUserError, match="--prefill-replicas is 0"):
        build_setup(config(kv_transfer_gbs=50.0), CAT)
    result = runner.invoke(
        app, ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--prefill-tp", "2"]
    )
    assert result.exit_code == 2 and "--prefill-replicas" in result.output


def test_predict_and_explain_show_the_transfer():
    args = ["--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--prefill-replicas", "1"]
    out = runner.invoke(app, ["predict", *args, "-c", "2", "--requests", "4", "--json"])
    assert out.exit_code == 0, out.output
    facts = json.loads(out.stdout)["results"][0]["disaggregation"]
    assert facts["kv_link"] == "NVLink" and facts["prefill_instances"] == 1
    assert facts["kv_transfer_efficiency"] == 0.11
    assert facts["kv_transfer_ms_per_1k_tokens"] == pytest.approx(
        1000 * LLAMA_KV / (450e9 * facts["kv_transfer_efficiency"]) * 1e3
    )
    shown = runner.invoke(app, ["explain", *args, "--prefill-chunk", "4096", "--json"])
    assert shown.exit_code == 0, shown.output
    terms = json.loads(shown.stdout)["kv_transfer"]
    assert terms["prompt_tokens"] == 4096
    assert terms["total_ms"] == pytest.approx(terms["latency_ms"] + terms["link_ms"])
    text = runner.invoke(app, ["explain", *args, "--prefill-chunk", "4096"])
    assert "KV transfer, prefill to decode instance" in text.output


def test_plan_tries_a_quarter_half_and_three_quarters_of_the_replicas_as_prefill():
    from capsim.planner.search import prefill_splits

    assert prefill_splits(1) == []
    assert prefill_splits(2) == [1]
    assert prefill_splits(4) == [1, 2, 3]
    assert prefill_splits(8) == [2, 4, 6]


def test_plan_with_disaggregation_adds_split_deployments_and_their_serve_line():
    from capsim.planner.search import PlanRequest, enumerate_candidates
    from capsim.planner.serve_command import vllm_serve_command

    base = dict(models=("llama-3.1-8b",), agents=8, gpus=("h100-sxm",), gpu_counts=(4,))
    plain, _ = enumerate_candidates(PlanRequest(**base), CAT)
    split, _ = enumerate_candidates(PlanRequest(**base, disaggregation=True), CAT)
    assert all(not c.prefill_replicas for c in plain)
    added = [c for c in split if c.prefill_replicas]
    # TP1 (4 replicas: 1, 2 or 3 prefill) and TP2 (2 replicas: 1) of every format and KV dtype
    assert len(split) == len(plain) + len(added)
    assert {(c.tp, c.prefill_replicas) for c in added} == {(1, 1), (1, 2), (1, 3), (2, 1)}
    one = next(c for c in added if c.tp == 1 and c.prefill_replicas == 3)
    assert one.dp == 1 and one.config(PlanRequest(**base)).prefill_replicas == 3
    line = vllm_serve_command(one, "meta-llama/Llama-3.1-8B-Instruct", 1024)
    assert '--kv-transfer-config \'{"kv_connector":"NixlConnector","kv_role":"kv_both"}\'' in line
    assert "3 prefill and 1 decode servers of this line" in line
    assert "PD 3P:1D" in one.label()


def test_sglang_disaggregated_servers_never_hold_admission_shut():
    """SGLang's disaggregated prefill loop resets batch_is_full each pass (its requests
    leave when their prompt is done, never through a decode batch that shrinks) and its
    decode loop admits from a pre-allocation queue that never reads it: both pools keep
    the reserve without its hold, which a colocated SGLang server keeps."""
    setup = build_setup(config(engine="sglang", tp=1, prefill_replicas=1), CAT)
    for pool in (setup, setup.prefill):
        assert pool.scheduler.reserve is not None
        assert not pool.scheduler.reserve.holds_until_finish
    alone = build_setup(config(engine="sglang", tp=1), CAT)
    assert alone.scheduler.reserve.holds_until_finish
