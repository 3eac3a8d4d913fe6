"""Planner: pruning, costs, SLO filter, Pareto frontiers and seed 001's DP-vs-TP ranking."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from capsim.calibration.applied import calibrated_predict
from capsim.catalog.loader import load_catalog
from capsim.cli.main import app
from capsim.errors import CapsimUserError
from capsim.physics.memory import memory_fit
from capsim.planner.costs import HOURS_PER_YEAR, CostModel, cost_of
from capsim.planner.pareto import pareto_front
from capsim.planner.search import (
    Candidate,
    PlanRequest,
    enumerate_candidates,
    evaluate,
)
from capsim.planner.serve_command import effective_max_num_seqs, vllm_serve_command

CAT = load_catalog()


def test_pruning_drops_what_does_not_fit():
    req = PlanRequest(models=("llama-3.3-70b",), agents=4, gpus=("rtx3090",), gpu_counts=(1, 2))
    candidates, pruned = enumerate_candidates(req, CAT)
    assert pruned > 0
    for c in candidates:
        fit = memory_fit(
            CAT.gpu(c.gpu), CAT.model(c.model), CAT.quant(c.quant), tp=c.tp, kv_dtype=c.kv_dtype
        )
        assert fit.fits
    assert all(c.quant != "bf16" for c in candidates)  # 141 GB never fits 2 x 24 GiB


def test_cost_arithmetic_by_hand():
    gpu = CAT.gpu("rtx3090")  # 800 USD used, 350 W
    cost = cost_of(gpu, 2, output_tok_s=100.0, model=CostModel(years=1, kwh_price_usd=0.2))
    energy = 0.35 * 2 * HOURS_PER_YEAR * 0.2
    assert cost.purchase_usd == 1600
    assert cost.energy_usd == pytest.approx(energy)
    assert cost.usd_per_million_output_tokens == pytest.approx(
        (1600 + energy) / (100 * HOURS_PER_YEAR * 3600) * 1e6
    )
    cloud = cost_of(gpu, 2, 100.0, CostModel(years=1, cloud_usd_per_gpu_hour=0.5))
    assert cloud.total_usd == pytest.approx(0.5 * 2 * HOURS_PER_YEAR)
    unpriced_gpu = CAT.gpu("h100-sxm").model_copy(update={"price": None})
    unpriced = cost_of(unpriced_gpu, 1, 100.0, CostModel())
    assert unpriced.total_usd is None
    # serving a quarter of the time: a quarter of the energy, of the cloud hours and of
    # the tokens the purchase is spread over
    part = cost_of(gpu, 2, 100.0, CostModel(years=1, kwh_price_usd=0.2, duty_cycle=0.25))
    assert part.energy_usd == pytest.approx(energy / 4)
    assert part.usd_per_million_output_tokens == pytest.approx(
        (1600 + energy / 4) / (100 * HOURS_PER_YEAR / 4 * 3600) * 1e6
    )
    part_cloud = cost_of(
        gpu, 2, 100.0, CostModel(years=1, cloud_usd_per_gpu_hour=0.5, duty_cycle=0.25)
    )
    assert part_cloud.total_usd == pytest.approx(0.5 * 2 * HOURS_PER_YEAR / 4)


def test_the_plan_says_what_its_costs_assume():
    """issue 48: the caption and JSON name the horizon, duty cycle, electricity price and
    each GPU's price with its kind and date."""
    from capsim.planner.costs import cost_assumptions, cost_caption

    model = CostModel(years=2, kwh_price_usd=0.3, duty_cycle=0.5)
    gpus = [CAT.gpu("rtx3090"), CAT.gpu("h100-sxm")]
    caption = cost_caption(model, gpus)
    assert "rtx3090 $800 used 2026-03-07" in caption
    assert "50% of 2 years at $0.3/kWh" in caption and "idle draw not counted" in caption
    facts = cost_assumptions(model, gpus)
    assert facts["duty_cycle"] == 0.5 and facts["horizon_years"] == 2
    assert facts["gpu_prices"]["rtx3090"]["kind"] == "used"
    with pytest.raises(CapsimUserError, match="--duty-cycle"):
        CostModel(duty_cycle=0)


def test_slo_filter_and_figures_match_predict():
    req = PlanRequest(
        models=("qwen3-coder-30b-a3b",),
        agents=8,
        gpus=("rtx3090",),
        gpu_counts=(1,),
        min_agent_tok_s=1e6,
        requests=16,
    )
    candidates, _ = enumerate_candidates(req, CAT)
    items = evaluate(candidates, req, CAT, workers=1)
    assert items and not any(e.meets_slo for e in items)
    assert all("per-agent" in e.reasons[0] for e in items)
    first = items[0]
    level = calibrated_predict(first.candidate.config(req), CAT).levels[0]
    assert first.output_tok_s == pytest.approx(level.metrics.output_tok_s)
    relaxed = PlanRequest(**{**req.__dict__, "min_agent_tok_s": 1.0})
    assert all(e.meets_slo for e in evaluate(candidates, relaxed, CAT, workers=1))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 100)), min_size=1, max_size=30))
def test_no_frontier_point_is_dominated(points):
    front = pareto_front(points, [True, True])
    assert front
    for i in front:
        a = points[i]
        for b in points:
            assert not (b[0] >= a[0] and b[1] >= a[1] and (b[0] > a[0] or b[1] > a[1]))
    for j in set(range(len(points))) - set(front):
        assert any(
            points[i][0] >= points[j][0] and points[i][1] >= points[j][1]
            for i in range(len(points))
            if i != j
        )


@pytest.mark.xfail(
    reason="open (issue 17): with the measured custom all-reduce costs (7-20 us, not the "
    "ring formula's ~43 us) TP=8 comes out faster and the DP/TP ratio falls to about 2.0 "
    "against the measured 3.36; the TP=8 host and large-batch terms are still to be modelled",
    strict=False,
)
def test_seed001_data_parallel_ranks_above_tensor_parallel_on_b200():
    """Seed 001's node: 1,024 in / 512 out (the author's post), 1,472 requests in flight
    (derived from its 96,000 tok/s and ~46 ms TPOT, see the dataset), default engine
    limits, no calibration profile."""
    req = PlanRequest(
        models=("qwen3.5-27b",),
        agents=1472,
        requests=2944,
        input_tokens="1024",
        output_tokens="512",
        profile="none",
    )
    tp8 = Candidate("b200", 8, 8, "qwen3.5-27b", "fp8", "auto")
    dp8 = Candidate("b200", 8, 1, "qwen3.5-27b", "fp8", "auto")
    a, b = evaluate([tp8, dp8], req, CAT, workers=1)
    ranked = sorted([a, b], key=lambda e: -e.output_tok_s)
    assert ranked[0].candidate.tp == 1
    measured = 74_848 / 22_300  # seed 001: DP=8 vs TP=8 tok/s per node
    assert b.output_tok_s / a.output_tok_s == pytest.approx(measured, rel=0.30)


def run_plan(*extra: str, gpus: str = "rtx3090,rtx4090"):
    base = ["plan", "--model", "qwen3-coder-30b-a3b", "--agents", "8", "--gpus", gpus]
    return CliRunner().invoke(app, [*base, "--counts", "1", *extra])


def test_plan_cli(tmp_path):
    png = tmp_path / "plan.png"
    r = run_plan("--min-agent-tok-s", "5", "--budget", "10000", "--json", "--plot", str(png))
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["configurations"] and data["configurations"][0]["meets_slo"]
    assert png.read_bytes()[:4] == b"\x89PNG"
    r = run_plan("--min-agent-tok-s", "100000", gpus="rtx3090")
    assert r.exit_code == 0 and "nothing meets these SLOs; the closest is" in r.stdout
    r = run_plan("--power-limits", "1.5")
    assert r.exit_code == 2 and "fractions of TDP" in r.stderr
    r = CliRunner().invoke(app, ["plan", "--model", "llama-9", "--agents", "8"])
    assert r.exit_code == 2 and "unknown model" in r.stderr


def test_plan_ranks_by_cost_throughput_or_cost_per_token():
    """Configurations that meet the SLOs come first, in the order --rank asks for."""

    def ranked(rank: str) -> list[dict]:
        r = run_plan("--min-agent-tok-s", "5", "--rank", rank, "--json")
        assert r.exit_code == 0, r.output
        configs = json.loads(r.stdout)["configurations"]
        met = [c["meets_slo"] for c in configs]
        assert met == sorted(met, reverse=True)  # every SLO-meeting row before any other
        return [c for c in configs if c["meets_slo"]]

    for rank, key, sign in (
        ("cost", "cost_usd", 1),
        ("throughput", "output_tok_s", -1),
        ("cost-per-token", "usd_per_million_output_tokens", 1),
    ):
        values = [sign * c[key] for c in ranked(rank)]
        assert len(values) > 2 and values == sorted(values), rank
    r = run_plan("--rank", "speed")
    assert r.exit_code == 2 and "unknown ranking" in r.stderr


def test_serve_command_carries_the_configuration():
    from capsim.planner.serve_command import vllm_serve_command

    c = Candidate(gpu="rtx3090", count=4, tp=2, model="m", quant="awq-int4", kv_dtype="fp8")
    line = vllm_serve_command(c, "Org/Model", max_num_seqs=32)
    assert line.startswith("vllm serve Org/Model --tensor-parallel-size 2 --max-num-seqs 32")
    assert "--kv-cache-dtype fp8" in line
    assert "checkpoint of this model in awq-int4" in line and "x2 replicas" in line
    plain = vllm_serve_command(
        Candidate(gpu="h100-sxm", count=1, tp=1, model="m", quant="bf16", kv_dtype="auto"),
        "Org/Model",
        max_num_seqs=8,
    )
    assert "#" not in plain and "--kv-cache-dtype" not in plain


def test_dask_cluster_gives_the_same_results_as_local_processes():
    distributed = pytest.importorskip("distributed")
    req = PlanRequest(
        models=("qwen3-coder-30b-a3b",), agents=4, gpus=("rtx3090",), gpu_counts=(1, 2)
    )
    candidates, _ = enumerate_candidates(req, CAT)
    candidates = candidates[:3]
    local = evaluate(candidates, req, CAT, workers=1)
    # one worker process is a remote evaluation all the same (a second doubled the
    # cluster's start-up, the test's cost, on a 2-core host)
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        remote = evaluate(candidates, req, CAT, dask_scheduler=cluster.scheduler_address)
    assert [e.candidate for e in remote] == [e.candidate for e in local]
    assert [e.output_tok_s for e in remote] == [e.output_tok_s for e in local]


def test_unreachable_dask_scheduler_is_a_user_error(monkeypatch):
    pytest.importorskip("distributed")
    from capsim.errors import CapsimUserError
    from capsim.planner import search

    monkeypatch.setattr(search, "DASK_CONNECT_TIMEOUT_S", 1.0)

    req = PlanRequest(models=("qwen3-coder-30b-a3b",), agents=2, gpus=("rtx3090",), gpu_counts=(1,))
    candidates, _ = enumerate_candidates(req, CAT)
    with pytest.raises(CapsimUserError, match="Dask scheduler"):
        evaluate(candidates[:1], req, CAT, dask_scheduler="tcp://127.0.0.1:9")


@pytest.mark.parametrize("answer", [b"", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"])
def test_a_server_that_is_not_a_dask_scheduler_is_a_user_error_in_time(monkeypatch, answer):
    """A server that takes the connection and never answers held plan for 30 s; one that
    answers HTTP made Dask read a 3 EiB frame length (a traceback): both are user errors
    within 1.5 x the connect timeout."""
    import socket
    import threading
    import time

    pytest.importorskip("distributed")
    from capsim.errors import CapsimUserError
    from capsim.planner import search

    monkeypatch.setattr(search, "DASK_CONNECT_TIMEOUT_S", 0.5)
    server = socket.create_server(("127.0.0.1", 0))
    held = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            if answer:
                conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    address = f"tcp://127.0.0.1:{server.getsockname()[1]}"
    req = PlanRequest(models=("qwen3-coder-30b-a3b",), agents=2, gpus=("rtx3090",), gpu_counts=(1,))
    candidates, _ = enumerate_candidates(req, CAT)
    started = time.monotonic()
    try:
        with pytest.raises(CapsimUserError, match="Dask scheduler"):
            evaluate(candidates[:1], req, CAT, dask_scheduler=address)
    finally:
        server.close()
        for conn in held:
            conn.close()
    assert time.monotonic() - started < 20  # the hang it replaced held plan for 30 s


def test_every_plan_row_has_a_band_and_a_profile_sets_it():
    """The 3090 has a calibration profile (fit on seed 002): its band comes from the fit's
    residuals and parameters; with the profile turned off it is the uncalibrated corpus
    spread, as on the 4090, which has none. Every row's band holds its prediction. (Which
    is wider depends on how well the profile fits: seed 002's noisy points give the 3090's a
    width close to the corpus spread's.)"""
    req = PlanRequest(models=("qwen3-coder-30b-a3b",), agents=4, gpu_counts=(1,))
    a = Candidate("rtx3090", 1, 1, "qwen3-coder-30b-a3b", "awq-int4", "auto")
    b = Candidate("rtx4090", 1, 1, "qwen3-coder-30b-a3b", "awq-int4", "auto")
    on_3090, on_4090 = evaluate([a, b], req, CAT, workers=1)
    uncalibrated = PlanRequest(
        models=("qwen3-coder-30b-a3b",), agents=4, gpu_counts=(1,), profile="none"
    )
    (plain_3090,) = evaluate([a], uncalibrated, CAT, workers=1)
    for row in (on_3090, on_4090, plain_3090):
        lo, hi = row.output_band_80
        assert lo < row.output_tok_s < hi
    # without a profile both GPUs take the corpus's factors: the same relative width
    width = [row.output_band_80[1] / row.output_band_80[0] for row in (on_4090, plain_3090)]
    assert width[0] == pytest.approx(width[1], rel=1e-9)
    # the profile's band is its own
    assert on_3090.output_band_80[1] / on_3090.output_band_80[0] != pytest.approx(
        width[1], rel=1e-3
    )


def test_interconnects_and_power_limits_are_search_dimensions():
    req = PlanRequest(
        models=("qwen3-coder-30b-a3b",),
        agents=4,
        gpus=("rtx3090",),
        gpu_counts=(2, 4),
        power_fractions=(1.0, 0.7),
    )
    candidates, _ = enumerate_candidates(req, CAT)
    links = {(c.tp, c.interconnect) for c in candidates}
    assert (2, "nvlink") in links and (2, "pcie") in links  # the bridge joins two 3090s
    assert (4, "pcie") in links and (4, "nvlink") not in links
    assert {c.power_limit_w for c in candidates} == {None, 245}  # 0.7 x 350 W
    limited = next(c for c in candidates if c.power_limit_w and c.tp == 1)
    full = Candidate(**{**limited.__dict__, "power_limit_w": None})
    slow, fast = evaluate([limited, full], req, CAT, workers=1)
    assert slow.output_tok_s <= fast.output_tok_s
    assert slow.cost.energy_usd == pytest.approx(0.7 * fast.cost.energy_usd)


def small_request(**kw) -> PlanRequest:
    base = dict(
        models=("qwen3-coder-30b-a3b",),
        agents=32,
        requests=64,
        input_tokens="512",
        output_tokens="128",
        profile="none",
    )
    return PlanRequest(**{**base, **kw})


def awq_3090(**kw) -> Candidate:
    return Candidate("rtx3090", 1, 1, "qwen3-coder-30b-a3b", "awq-int4", "auto", **kw)


def test_nodes_multiply_replicas_cost_and_throughput():
    one, two = evaluate(
        [awq_3090(), awq_3090(nodes=2)], small_request(agents=32, requests=128), CAT, workers=1
    )
    assert (two.candidate.dp, two.candidate.total_gpus) == (2, 2)
    assert two.cost.purchase_usd == 2 * one.cost.purchase_usd
    # twice the replicas behind a least-outstanding router share 32 agents: more aggregate
    # throughput, never more than twice
    assert one.output_tok_s < two.output_tok_s <= 2 * one.output_tok_s * 1.001
    assert "2 nodes" in two.candidate.label()
    assert "behind a router" in vllm_serve_command(two.candidate, "x/y", 256)


def test_a_slow_gateway_costs_throughput():
    c = awq_3090(nodes=2)
    (free,) = evaluate([c], small_request(), CAT, workers=1)
    (gated,) = evaluate([c], small_request(router_capacity_rps=0.5), CAT, workers=1)
    assert gated.output_tok_s < 0.8 * free.output_tok_s


def test_max_num_seqs_is_a_search_dimension_and_reaches_the_serve_line():
    req = small_request(gpus=("rtx3090",), gpu_counts=(1,), max_num_seqs=(4, 32))
    candidates, _ = enumerate_candidates(req, CAT)
    assert {c.max_num_seqs for c in candidates} == {4, 32}
    four, many = evaluate([awq_3090(max_num_seqs=4), awq_3090(max_num_seqs=32)], req, CAT, 1)
    assert four.output_tok_s < many.output_tok_s  # 32 agents queue behind 4 slots
    assert "--max-num-seqs 4" in vllm_serve_command(four.candidate, "x/y", 4)
    assert effective_max_num_seqs(awq_3090(), CAT) == 256  # vLLM's default below 70 GiB


def test_plan_cli_rejects_bad_nodes_and_router():
    r = run_plan("--nodes", "0")
    assert r.exit_code == 2 and "--nodes" in r.stderr
    r = run_plan("--router", "fastest")
    assert r.exit_code == 2 and "round_robin" in r.stderr
    r = run_plan("--max-num-seqs", "8,x")
    assert r.exit_code == 2 and "malformed --max-num-seqs" in r.stderr


def test_plan_judges_ttft_in_steady_state_not_on_the_start_up_burst():
    from capsim.planner.search import steady_requests

    # by default 8 requests per agent, the first `agents` (the burst) left out, as
    # capacity does: the burst's queue makes TTFT p90 several times the steady one
    assert steady_requests(16) == 128 and steady_requests(2) == 64
    req = PlanRequest(models=("qwen3-coder-30b-a3b",), agents=16, gpus=("rtx3090",))
    candidates, _ = enumerate_candidates(req, CAT)
    first = candidates[0]
    (item,) = evaluate([first], req, CAT, workers=1)
    burst = calibrated_predict(first.config(req).model_copy(update={"requests": 32}), CAT).levels[0]
    assert first.config(req).requests == 128
    assert item.ttft_p90_s < 0.5 * burst.metrics.ttft_ms.p90 / 1e3


def test_closest_configuration_is_the_smallest_normalised_shortfall():
    from capsim.planner.costs import Cost
    from capsim.planner.search import Evaluated, closest_to_slos

    def item(distance: float, reasons: int, tok_s: float = 1.0) -> Evaluated:
        c = Candidate(gpu="rtx3090", count=1, tp=1, model="m", quant="bf16", kv_dtype="auto")
        cost = Cost(None, None, None, None)
        return Evaluated(c, tok_s, 1, 1, cost, False, ["x"] * reasons, slo_distance=distance)

    # one SLO missed by 300% is farther than two missed by 5% each (sqrt(2) x 0.05)
    far, near = item(3.0, 1), item(0.0707, 2)
    assert closest_to_slos([far, near]) is near
    assert closest_to_slos([item(0.1, 1, 5.0), item(0.1, 1, 9.0)]).output_tok_s == 9.0


def test_slo_distance_is_the_root_sum_of_relative_shortfalls():
    req = PlanRequest(
        models=("qwen3-coder-30b-a3b",),
        agents=4,
        gpus=("rtx3090",),
        gpu_counts=(1,),
        min_agent_tok_s=1e4,
        max_ttft_p90_s=1e-6,
        requests=32,
    )
    candidates, _ = enumerate_candidates(req, CAT)
    (e,) = evaluate(candidates[:1], req, CAT, workers=1)
    agent_short = 1 - e.per_agent_tok_s / 1e4
    ttft_over = e.ttft_p90_s / 1e-6 - 1
    assert e.slo_distance == pytest.approx((agent_short**2 + ttft_over**2) ** 0.5)


def test_winner_serve_line_names_the_quantised_checkpoint_and_max_model_len():
    from capsim.planner.costs import Cost
    from capsim.planner.search import Evaluated
    from capsim.planner.serve_command import winner_serve_command

    c = Candidate(
        gpu="h100-sxm", count=1, tp=1, model="qwen3-coder-30b-a3b", quant="fp8", kv_dtype="auto"
    )
    e = Evaluated(c, 1, 1, 1, Cost(None, None, None, None), True, [], max_model_len=50_000)
    line = winner_serve_command(e, CAT)
    # the catalog's FP8 checkpoint, so no --quantization flag and no checkpoint caveat
    assert line.startswith("vllm serve Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8 ")
    assert "--max-model-len 50000" in line
    assert "--quantization" not in line and "#" not in line
    # the model's whole context fits: no --max-model-len
    whole = CAT.model("qwen3-coder-30b-a3b").max_position_embeddings
    e.max_model_len = whole
    assert "--max-model-len" not in winner_serve_command(e, CAT)


def test_plan_tries_only_formats_a_checkpoint_exists_in():
    """issue 48: the winner's line names a checkpoint that exists in its format: the
    release's own, FP8 quantised online by vLLM on GPUs with FP8 tensor cores, or a
    published checkpoint the catalog records (FP4 ones only where FP4 tensor cores are)."""
    from capsim.planner.search import plan_formats
    from capsim.planner.serve_command import serve_repo

    for model in CAT.models:
        for gpu in (CAT.gpu("rtx3090"), CAT.gpu("h100-sxm"), CAT.gpu("b200")):
            for fmt in plan_formats(model, gpu):
                repo, in_format = serve_repo(model, fmt)
                online_fp8 = fmt == "fp8" and "fp8" in gpu.native_formats
                assert in_format or online_fp8, (model.name, gpu.name, fmt, repo)
                if fmt in ("nvfp4", "mxfp4") and fmt != model.dtype:
                    assert "fp4" in gpu.native_formats
    gemma = CAT.model("gemma-4-31b")
    assert "awq-int4" not in plan_formats(gemma, CAT.gpu("h100-sxm"))  # no AWQ checkpoint
    coder = CAT.model("qwen3-coder-30b-a3b")
    assert "awq-int4" in plan_formats(coder, CAT.gpu("rtx3090"))
    assert serve_repo(coder, "awq-int4") == ("QuantTrio/Qwen3-Coder-30B-A3B-Instruct-AWQ", True)


def test_plan_searches_expert_parallelism_for_moe_on_two_gpus_or_more():
    """Issue 49: an MoE on a box of two GPUs or more is tried with its experts sliced (TP)
    and split whole over every GPU of the box (EP: within the TP group, or with vLLM's data
    parallelism over its ranks); a dense model, or one GPU, only as it is; the winner's
    line carries the flags."""
    req = PlanRequest(
        models=("qwen3-30b-a3b", "llama-3.1-8b"), agents=4, gpus=("h100-sxm",), gpu_counts=(1, 2)
    )
    candidates, _ = enumerate_candidates(req, CAT)
    ep = [c for c in candidates if c.expert_parallel]
    assert ep and all(c.model == "qwen3-30b-a3b" and c.count == 2 for c in ep)
    data_parallel = [c for c in ep if c.tp == 1]
    assert data_parallel and all(c.dp == 2 for c in data_parallel)
    line = vllm_serve_command(data_parallel[0], "Org/Model", 64)
    assert "--data-parallel-size 2 --enable-expert-parallel" in line and "replicas" not in line
    assert "DP2+EP2" in data_parallel[0].label()
    config = data_parallel[0].config(req)
    from capsim.engine.setup import build_setup

    setup = build_setup(config, CAT)  # one EP group of both GPUs, attention in two ranks
    assert (setup.config.tp, setup.config.dp_attention, setup.dp) == (2, 2, 1)
    ep = [c for c in ep if c.tp > 1]
    twins = {(c.model, c.tp, c.quant, c.kv_dtype, c.spec, c.interconnect) for c in ep}
    plain = {
        (c.model, c.tp, c.quant, c.kv_dtype, c.spec, c.interconnect)
        for c in candidates
        if not c.expert_parallel
    }
    assert twins <= plain  # every EP configuration has its TP twin
    assert "--enable-expert-parallel" in vllm_serve_command(ep[0], "Org/Model", 64)
    assert "EP" in ep[0].label() and ep[0].config(req).expert_parallel


@pytest.mark.parametrize("agents", ["0", "100001", "1000000000"])
def test_plan_agents_outside_the_simulated_range_is_refused(agents):
    """--agents beyond --concurrency's ceiling ran for minutes (100,001: 800,000 requests a
    configuration), or was refused with a message about --requests, a flag plan lacks."""
    r = CliRunner().invoke(
        app, ["plan", "--model", "llama-3.1-8b", "--gpus", "h100-sxm", "--agents", agents]
    )
    assert r.exit_code == 2 and "must be from 1 to 100,000" in r.output, r.output
    assert "--requests" not in r.output
