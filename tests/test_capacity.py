"""capsim capacity: the largest concurrency that meets the objectives."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import capsim
from capsim.catalog.loader import load_catalog
from capsim.cli.main import app
from capsim.engine.config import PredictConfig
from capsim.errors import CapsimUserError
from capsim.planner.capacity import Objectives, capacity

CAT = load_catalog()
BASE = dict(
    gpu="rtx3090",
    model="qwen3-coder-30b-a3b",
    quant="awq-int4",
    input_tokens="256",
    output_tokens="128",
)


def test_the_answer_meets_the_objectives_and_one_more_agent_does_not():
    objectives = Objectives(min_agent_tok_s=60)
    answer = capacity(PredictConfig(**BASE), objectives, CAT)
    by_c = {p.concurrency: p for p in answer.curve}
    c = answer.max_concurrency
    assert c >= 1
    assert by_c[c].ok and by_c[c].agent_tok_s >= 60
    assert not by_c[c + 1].ok  # the bisection ends on adjacent levels
    assert "per-agent" in answer.binding
    # every level the search tried below the answer met the objective too (monotone here)
    assert all(p.ok for k, p in by_c.items() if k <= c)
    assert answer.suggestions


def test_an_objective_nobody_meets_gives_zero():
    answer = capacity(PredictConfig(**BASE), Objectives(max_ttft_p90_s=1e-4), CAT)
    assert answer.max_concurrency == 0
    assert "TTFT" in answer.binding


def test_capacity_needs_an_objective():
    with pytest.raises(CapsimUserError):
        capacity(PredictConfig(**BASE), Objectives(), CAT)


def test_the_cli_answers_in_json_and_refuses_bad_objectives():
    runner = CliRunner()
    args = ["capacity", "--gpu", "rtx3090", "--model", "qwen3-coder-30b-a3b"]
    args += ["--input-tokens", "256", "--output-tokens", "128"]
    r = runner.invoke(app, [*args, "--min-agent-tok-s", "60", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["answers"][0]["max_concurrency"] >= 1
    r = runner.invoke(app, [*args, "--min-agent-tok-s", "-3"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "objective" in r.output


def test_a_value_the_schema_refuses_names_its_flag_without_a_traceback():
    for command in ("capacity", "predict"):
        args = [command, "--gpu", "rtx3090", "--model", "qwen3-coder-30b-a3b", "--max-num-seqs"]
        extra = ["--min-agent-tok-s", "30"] if command == "capacity" else []
        r = CliRunner().invoke(app, [*args, "0", *extra])
        assert r.exit_code == 2, r.output
        assert "--max-num-seqs" in r.output and "Traceback" not in r.output


def test_pessimistic_capacity_holds_each_objective_at_its_band_edge():
    objectives = Objectives(min_agent_tok_s=60)
    plain = capacity(PredictConfig(**BASE), objectives, CAT)
    edge = capacity(PredictConfig(**BASE), objectives, CAT, pessimistic=True)
    assert 0 < edge.max_concurrency < plain.max_concurrency
    assert "(band edge)" in edge.binding
    assert any("pessimistic edge" in n for n in edge.notes)
    # at the answer the prediction itself clears the objective with the band's margin
    at = {p.concurrency: p for p in edge.curve}[edge.max_concurrency]
    assert at.ok and at.agent_tok_s > 60


def test_pessimistic_factors_are_band_edges_over_the_figure():
    from capsim.engine.bands import band_values, pessimistic_factors

    (level,) = capsim.predict(
        PredictConfig(**BASE, concurrency=[4], requests=16), catalog=CAT
    ).levels
    factors = pessimistic_factors(level)
    values = band_values(level.metrics)
    assert factors["output_tok_s"] == pytest.approx(
        level.band_80["output_tok_s"][0] / values["output_tok_s"]
    )
    assert factors["tpot_ms"] == pytest.approx(level.band_80["tpot_ms"][1] / values["tpot_ms"])


def test_a_hybrid_model_on_sglang_is_limited_by_its_state_pool():
    """SGLang caps running requests by its Mamba-state pool: agents beyond the cap queue,
    and the answer names the pool and what enlarges it, not --max-num-seqs."""
    config = PredictConfig(
        gpu="h200",
        model="qwen3.6-35b-a3b",
        engine="sglang",
        input_tokens="512",
        output_tokens="64",
    )
    answer = capacity(config, Objectives(max_ttft_p90_s=2.0), CAT)
    assert answer.limiter == "recurrent-state pool"
    assert any("mamba" in s for s in answer.suggestions)
    assert any(
        "--disable-overlap-schedule" in s and "holds 3 slots" in s for s in answer.suggestions
    )
    assert not any("--max-num-seqs" in s for s in answer.suggestions)
    # with the overlap scheduler already off the hint is not repeated
    sync = config.model_copy(update={"async_scheduling": False})
    answer = capacity(sync, Objectives(max_ttft_p90_s=2.0), CAT)
    assert answer.limiter == "recurrent-state pool"
    assert not any("--disable-overlap-schedule" in s for s in answer.suggestions)


def test_a_ttft_bound_answer_names_the_cause_and_checks_each_change_in_the_simulator():
    """Issue 45: a TTFT objective that binds gets its cause (against one agent alone) and
    the changes that could move it, each rerun at the first failing level."""
    config = PredictConfig(
        gpu="h100-sxm", model="llama-3.1-8b", input_tokens="2048", output_tokens="128"
    )
    answer = capacity(config, Objectives(max_ttft_p90_s=0.3), CAT)
    miss = next(p for p in answer.curve if p.concurrency == answer.max_concurrency + 1)
    lone = next(p for p in answer.curve if p.concurrency == 1)
    assert miss.ttft_mean_s > 1.5 * lone.ttft_mean_s  # the other agents' prompts, a wave
    assert answer.ttft_cause.startswith("prompts that arrive together share the prefill")
    labels = [c.split(":")[0] for c in answer.checked_changes]
    assert labels == [
        "--max-num-batched-tokens 16384",
        "another replica (--gpus 2)",
        "a prompt half as long (--input-tokens 1024)",
    ]
    # a second replica halves the agents each one serves: the rerun says it meets the SLO
    replica = answer.checked_changes[1]
    assert f"at {miss.concurrency} agents, meets every objective" in replica
    after = float(replica.split("-> ")[1].split(" s")[0])
    assert after < miss.ttft_p90_s


def test_an_answer_bound_by_throughput_has_no_ttft_diagnosis():
    answer = capacity(PredictConfig(**BASE), Objectives(min_agent_tok_s=60), CAT)
    assert answer.ttft_cause is None and answer.checked_changes == []


def test_many_replicas_are_searched_as_one_replicas_share_of_the_agents():
    """Issue 47's battery: capacity --gpus 1000 simulated every replica at every level of
    the search and ran for minutes. Past MAX_JOINT_REPLICAS round-robin replicas, one
    replica's share is searched and multiplied (the same answer per replica as one GPU)."""
    from capsim.planner.capacity import MAX_JOINT_REPLICAS

    objectives = Objectives(min_agent_tok_s=60)
    one = capacity(PredictConfig(**BASE), objectives, CAT)
    n = 4 * MAX_JOINT_REPLICAS
    many = capacity(PredictConfig(**BASE, gpus=n), objectives, CAT)
    assert many.gpus == n and many.max_concurrency == n * one.max_concurrency
    assert any(f"one of the {n} replicas" in note for note in many.notes)
    assert [p.concurrency for p in many.curve] == [n * p.concurrency for p in one.curve]
    assert any(f"--gpus {2 * n}" in s for s in many.suggestions)
    # a gateway joins the replicas: they are simulated together, never multiplied
    gated = PredictConfig(**BASE, gpus=MAX_JOINT_REPLICAS + 1, router_latency_s=0.001)
    from capsim.planner.capacity import per_replica_share

    assert per_replica_share(gated, MAX_JOINT_REPLICAS + 1) == 1
    assert per_replica_share(PredictConfig(**BASE), MAX_JOINT_REPLICAS) == 1
