"""A long closed-loop level simulated as independent replications laid end to end."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capsim.catalog.loader import load_catalog
from capsim.engine import replication, request_log
from capsim.engine import simulate as sim
from capsim.engine.config import PredictConfig
from capsim.engine.levels import (
    level_parts,
    make_workload,
    measure_level,
    replicated_run,
    run_replicas,
)
from capsim.engine.replication import part_seed, replication_parts, shifted
from capsim.engine.setup import build_setup
from capsim.request_columns import RequestTable

CAT = load_catalog()
BASE = dict(gpu="rtx3090", model="qwen3-coder-30b-a3b", quant="awq-int4")


def test_parts_by_hand():
    # 1,000,000 // 65,536 = 15 parts, each far above 1,000 rounds of 16
    assert replication_parts("closed", 1_000_000, 16) == [66_667] * 10 + [66_666] * 5
    # four parts of 2^16 would be 655 rounds of 100 each: two parts of 1,310 rounds
    assert replication_parts("closed", 262_144, 100) == [131_072, 131_072]
    # a part must run 1,000 rounds: at C=256, 262,144 requests are one part
    assert replication_parts("closed", 262_144, 256) == [262_144]
    assert replication_parts("closed", 131_071, 1) == [131_071]
    assert replication_parts("open", 10_000_000, None) == [10_000_000]
    assert replication_parts("agents", 10_000_000, 16) == [10_000_000]
    parts = replication_parts("closed", 1_000_003, 1)
    assert sum(parts) == 1_000_003 and max(parts) - min(parts) <= 1


@given(
    requests=st.integers(1, 50_000_000),
    concurrency=st.integers(1, 4096),
)
def test_parts_cover_the_level_and_each_runs_its_rounds(requests, concurrency):
    parts = replication_parts("closed", requests, concurrency)
    assert sum(parts) == requests
    if len(parts) > 1:
        assert min(parts) >= replication.MIN_ROUNDS * concurrency
        assert min(parts) >= replication.PART_REQUESTS


def test_part_seeds_are_fixed_and_distinct():
    seeds = [part_seed(7, k) for k in range(50)]
    assert seeds[0] == 7
    assert len(set(seeds)) == 50
    assert seeds == [part_seed(7, k) for k in range(50)]


def test_shifted_moves_every_time_and_keeps_unknowns():
    table = RequestTable(
        np.array([0.0, 1.0]),
        np.array([0.5, np.nan]),
        np.array([2.0, np.nan]),
        np.array([10, 20]),
        np.array([5, 6]),
        np.array([0.1, np.nan]),
        np.array([True, False]),
    )
    moved = shifted(table, 100.0)
    assert moved.send.tolist() == [100.0, 101.0]
    assert moved.first_token[0] == 100.5 and np.isnan(moved.first_token[1])
    assert moved.finish[0] == 102.0 and np.isnan(moved.finish[1])
    assert moved.first_scheduled[0] == pytest.approx(100.1)
    assert moved.ttft().tolist() == table.ttft().tolist()


@pytest.fixture
def small_parts(monkeypatch):
    """Parts of 1,500 requests and 100 rounds, so a test level of 6,000 splits in four."""
    monkeypatch.setattr(replication, "PART_REQUESTS", 1_500)
    monkeypatch.setattr(replication, "MIN_ROUNDS", 100)


def config(**kw) -> PredictConfig:
    return PredictConfig(
        **{**BASE, "concurrency": [8], "requests": 6_000, "output_tokens": "128", **kw}
    )


def whole(cfg: PredictConfig):
    """The level simulated as one run (its replication disabled)."""
    setup = build_setup(cfg, CAT)
    workload = make_workload(cfg, cfg.concurrency[0])
    run = run_replicas(setup, workload, cfg.seed)
    return measure_level(
        [run], workload, False, 0.0, setup.step_model.frontend_parallel_seconds
    ).metrics


@pytest.mark.parametrize("output", ["128", "uniform:32,224"])
def test_replications_measure_the_steady_state_of_one_long_run(small_parts, output):
    cfg = config(output_tokens=output)
    assert len(level_parts(make_workload(cfg, 8))) == 4
    split = sim.predict(cfg, CAT, workers=1).levels[0].metrics
    one = whole(cfg)
    assert split.requests == one.requests == 6_000
    assert split.completed == 6_000
    # each part adds one start-up burst and one drain of 8 requests: 24 of 6,000 more
    tolerance = 0.01 if output == "128" else 0.03  # spread lengths: other draws
    assert split.output_tok_s == pytest.approx(one.output_tok_s, rel=tolerance)
    assert split.tpot_ms.mean == pytest.approx(one.tpot_ms.mean, rel=tolerance)
    assert split.ttft_ms.p50 == pytest.approx(one.ttft_ms.p50, rel=0.05)


def test_replications_do_not_depend_on_the_processes_that_run_them(small_parts):
    cfg = config()
    alone = sim.predict(cfg, CAT, workers=1).levels[0].metrics
    pooled = sim.predict(cfg, CAT, workers=2).levels[0].metrics
    assert pooled.model_dump() == alone.model_dump()


def test_parts_past_the_request_buffer_fold_as_one_run_would(small_parts, monkeypatch):
    cfg = config()
    exact = sim.predict(cfg, CAT, workers=1).levels[0].metrics
    monkeypatch.setattr(request_log, "REQUEST_BUFFER", 4_000)
    folded = sim.predict(cfg, CAT, workers=1).levels[0].metrics
    assert folded.requests == exact.requests
    assert folded.output_tokens == exact.output_tokens
    assert folded.output_tok_s == pytest.approx(exact.output_tok_s, rel=1e-9)
    assert folded.ttft_ms.p90 == pytest.approx(exact.ttft_ms.p90, rel=0.01)
    assert folded.e2e_s.p50 == pytest.approx(exact.e2e_s.p50, rel=0.01)


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_a_replicated_level_is_never_a_saturation_base(seed):
    cfg = config(requests=40, concurrency=[4])
    setup = build_setup(cfg, CAT)
    workload = make_workload(cfg, 4)
    run = replicated_run(setup, workload, [20, 20], seed)
    assert run.finish_order is None and run.dry_at is None
    assert len(run.requests) == 40
    # the second part starts where the first ended
    assert float(run.requests.send[20:].min()) >= float(np.nanmax(run.requests.finish[:20]))
