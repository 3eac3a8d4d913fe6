"""Bounded memory (capsim/engine/request_log.py): a simulation past its buffers folds its
requests and ITL samples into streaming accumulators, with the same throughput and
percentiles within the stated error; finished requests are not kept; records beyond the
buffer are refused; progress follows the requests."""

from __future__ import annotations

import gc

import pytest

import capsim.engine.request_log as request_log
from capsim.catalog.loader import load_catalog
from capsim.engine.config import PredictConfig
from capsim.engine.request import SimRequest
from capsim.engine.simulate import predict
from capsim.errors import CapsimUserError
from capsim.streaming import RELATIVE_ERROR

CAT = load_catalog()
BASE = dict(
    gpu="rtx3090",
    model="qwen3-coder-30b-a3b",
    quant="awq-int4",
    input_tokens="uniform:50,400",
    output_tokens="uniform:5,120",
    profile="none",
)
EXACT_FIELDS = (
    "requests",
    "completed",
    "failed",
    "wall_s",
    "input_tokens",
    "output_tokens",
    "output_tok_s",
    "total_tok_s",
    "prefill_tok_s",
    "request_throughput",
)
DISTRIBUTIONS = ("per_request_output_tok_s", "ttft_ms", "tpot_ms", "itl_ms", "e2e_s", "queueing_ms")


def small_buffers(monkeypatch, requests: int = 40, itl: int = 300, batch: int = 16) -> None:
    monkeypatch.setattr(request_log, "REQUEST_BUFFER", requests)
    monkeypatch.setattr(request_log, "ITL_BUFFER", itl)
    monkeypatch.setattr(request_log, "REQUEST_BATCH", batch)


def assert_folded_matches(exact, folded) -> None:
    a, b = exact.metrics, folded.metrics
    for name in EXACT_FIELDS:
        assert getattr(b, name) == pytest.approx(getattr(a, name), rel=1e-12), name
    for name in DISTRIBUTIONS:
        x, y = getattr(a, name), getattr(b, name)
        assert y.count == x.count, name
        assert y.mean == pytest.approx(x.mean, rel=1e-9, abs=1e-12), name
        for q in ("p50", "p90", "p99"):
            bound = RELATIVE_ERROR * (1 + 1e-9) * abs(getattr(x, q)) + 1e-12
            assert abs(getattr(y, q) - getattr(x, q)) <= bound, (name, q)
    assert (folded.steps, folded.events) == (exact.steps, exact.events)


@pytest.mark.parametrize(
    "extra",
    [
        dict(workload="closed", concurrency=[3, 12], requests=150),
        dict(workload="open", rates=[4.0], requests=150),
        dict(workload="agents", concurrency=[10], turns=8, think_time="uniform:0,1"),
        dict(workload="closed", concurrency=[8], requests=120, dp=2, router="least_outstanding"),
    ],
)
def test_a_run_past_the_buffers_matches_the_exact_one(monkeypatch, extra):
    config = PredictConfig(**BASE, **extra)
    exact = predict(config, CAT, workers=1)
    small_buffers(monkeypatch)
    folded = predict(config, CAT, workers=1)
    for a, b in zip(exact.levels, folded.levels, strict=True):
        assert_folded_matches(a, b)


def test_a_saturated_run_past_the_buffer_is_not_derived_from(monkeypatch):
    # C=8 saturates this small KV cache and C=30 is derived from it while its requests
    # are kept; once folded, C=30 is simulated, with the same figures within the bound
    lengths = dict(input_tokens="1024", output_tokens="512")
    config = PredictConfig(
        **{**BASE, **lengths}, concurrency=[8, 30], requests=150, kv_capacity_tokens=16 * 400
    )
    exact = predict(config, CAT, workers=1)
    assert exact.levels[1].service_of == 8
    small_buffers(monkeypatch)
    folded = predict(config, CAT, workers=1)
    assert [lv.service_of for lv in folded.levels] == [None, None]
    assert_folded_matches(exact.levels[1], folded.levels[1])


@pytest.mark.parametrize("workload", ["closed", "open"])
def test_finished_requests_are_let_go(monkeypatch, workload):
    small_buffers(monkeypatch)
    live = []
    real_close = request_log.RequestLog.close

    def counting_close(self, unfinished):
        # every request has finished; the simulation's objects are all still alive
        gc.collect()
        live.append(sum(isinstance(o, SimRequest) for o in gc.get_objects()))
        return real_close(self, unfinished)

    monkeypatch.setattr(request_log.RequestLog, "close", counting_close)
    extra = dict(concurrency=[4]) if workload == "closed" else dict(rates=[5.0])
    result = predict(PredictConfig(**BASE, workload=workload, requests=400, **extra), CAT)
    assert result.levels[0].metrics.completed == 400
    # at most the last request of each closed-loop client is still referenced
    assert live and max(live) <= 4


def test_records_beyond_the_buffer_are_refused(monkeypatch):
    small_buffers(monkeypatch)
    config = PredictConfig(**BASE, concurrency=[4], requests=60)
    with pytest.raises(CapsimUserError, match=r"records are kept for at most 40"):
        predict(config, CAT, keep_records=True)
    assert predict(config.model_copy(update={"requests": 40}), CAT, keep_records=True)


def test_progress_follows_the_requests(monkeypatch):
    monkeypatch.setattr("capsim.engine.progress.REPORT_EVERY", 50)
    calls = []
    config = PredictConfig(**BASE, concurrency=[2, 8], requests=400)
    predict(config, CAT, workers=1, progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (800, 800)
    assert all(total == 800 for _, total in calls)
    done = [d for d, _ in calls]
    assert done == sorted(done)
    # within a level, not only at its end
    assert any(0 < d < 400 for d in done) and any(400 < d < 800 for d in done)


def test_a_level_without_decode_steps_has_no_itl():
    # one output token each: prefill samples it, no decode step runs
    config = PredictConfig(**{**BASE, "output_tokens": "1"}, concurrency=[2], requests=10)
    (level,) = predict(config, CAT).levels
    assert level.metrics.completed == 10 and level.metrics.itl_ms.count == 0
    assert level.metrics.itl_ms.mean is None


def test_draws_hold_one_chunk_above_the_buffer_and_are_one_shot_below(monkeypatch):
    import numpy as np

    import capsim.engine.workloads as workloads
    from capsim.engine.lengths import parse_length
    from capsim.engine.workloads import Draws, Workload

    w = Workload(kind="closed", concurrency=4, requests=10, input=parse_length("uniform:10,100"))
    # below the buffer: exactly the draws made at once, prompts then outputs
    rng = np.random.default_rng(3)
    at_once = (w.input.tokens(rng, 10), w.output.tokens(rng, 10))
    draws = Draws(w, np.random.default_rng(3), 10)
    assert [draws.get(i)[:2] for i in range(10)] == list(zip(*at_once, strict=True))
    # above it: chunks of DRAW_CHUNK, read in order, the same values however far it goes
    monkeypatch.setattr(workloads, "REQUEST_BUFFER", 8)
    monkeypatch.setattr(workloads, "DRAW_CHUNK", 4)
    big = Draws(w, np.random.default_rng(3), 10)
    first = [big.get(i)[0] for i in range(10)]
    assert len(big.values[0]) <= 4  # one chunk held
    again = Draws(w, np.random.default_rng(3), 10)
    assert [again.get(i)[0] for i in range(10)] == first
    assert all(10 <= p <= 100 for p in first)
