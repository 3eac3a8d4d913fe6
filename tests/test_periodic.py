"""Period skipping (engine/periodic.py): a closed loop of equal requests, its repeating
steady state laid down as copies, gives the figures of simulating every request."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capsim.catalog.loader import load_catalog
from capsim.engine.config import PredictConfig
from capsim.engine.levels import make_workload, run_replicas
from capsim.engine.setup import build_setup
from capsim.engine.simulate import predict
from capsim.physics.speculative import SpecConfig

CAT = load_catalog()


def closed_config(c: int, requests: int, **kw) -> PredictConfig:
    base = dict(
        gpu="rtx3090",
        model="qwen3-coder-30b-a3b",
        quant="awq-int4",
        workload="closed",
        concurrency=[c],
        requests=requests,
        input_tokens="300",
        output_tokens="60",
        max_num_batched_tokens=512,
    )
    return PredictConfig(**{**base, **kw})


def flat_figures(metrics) -> dict[str, float]:
    """Every number in a level's metrics, by dotted name."""
    out = {}

    def walk(value, name):
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(inner, f"{name}.{key}")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value)

    walk(metrics.model_dump(), "metrics")
    return out


def skipped(config: PredictConfig) -> int:
    """Requests one run of the config's first level laid down as copies."""
    setup = build_setup(config, CAT)
    return run_replicas(setup, make_workload(config, config.concurrency[0])).skipped_requests


def assert_same_level(on, off) -> None:
    assert on.steps == off.steps
    assert on.events == off.events
    assert on.preemptions == off.preemptions
    assert on.peak_kv_usage == off.peak_kv_usage
    a, b = flat_figures(on.metrics), flat_figures(off.metrics)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name] == pytest.approx(b[name], rel=1e-9, abs=1e-9), name
    for x, y in zip(on.records, off.records, strict=True):
        assert x.request_id == y.request_id
        for field in ("send", "first_scheduled", "first_token", "finish"):
            a, b = getattr(x, field), getattr(y, field)
            assert (a is None) == (b is None), field
            if a is not None:
                assert a == pytest.approx(b, rel=1e-9, abs=1e-9), field
        assert x.output_tokens == y.output_tokens


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    c=st.integers(1, 7),
    requests=st.integers(20, 160),
    seed=st.integers(0, 50),
    kv_blocks=st.sampled_from([None, 70, 140]),
    spec=st.booleans(),
    offline=st.booleans(),
    output=st.sampled_from(["60", "7"]),
)
def test_skipping_periods_gives_the_figures_of_simulating_every_request(
    c, requests, seed, kv_blocks, spec, offline, output
):
    kw = dict(seed=seed, offline=offline, output_tokens=output)
    if kv_blocks:  # preemptions (the spec model's recurrent state takes blocks too)
        kw["kv_capacity_tokens"] = (kv_blocks + (40 * c if spec else 0)) * 16
    if spec:
        kw.update(
            model="qwen3.5-27b",
            tp=4,
            spec=SpecConfig(method="mtp", num_tokens=2, acceptance=0.6),
        )
    config = closed_config(c, requests, **kw)
    on = predict(config, CAT, keep_records=True).levels[0]
    off = predict(config.model_copy(update={"skip_periods": False}), CAT, keep_records=True)
    assert_same_level(on, off.levels[0])


def test_a_steady_closed_loop_is_mostly_laid_down_not_simulated():
    # C=4, fixed lengths: the state repeats within a few rounds
    config = closed_config(4, 400)
    n = skipped(config)
    assert 300 <= n < 400 and n % 4 == 0
    # and the figures are those of the full simulation (the ITL samples' weights too)
    on = predict(config, CAT, keep_records=True).levels[0]
    off = predict(config.model_copy(update={"skip_periods": False}), CAT, keep_records=True)
    assert_same_level(on, off.levels[0])
    assert on.metrics.itl_ms.p90 == pytest.approx(off.levels[0].metrics.itl_ms.p90, rel=1e-9)


@pytest.mark.parametrize(
    "kw",
    [
        {"input_tokens": "uniform:200,400"},  # lengths that differ never repeat
        {"output_tokens": "normal:60,5"},
        {"workload": "agents", "turns": 3},  # sessions share a prefix cache
        {"gpus": 2, "dp": 2},  # several replicas
        {"skip_periods": False},
        {"fast_forward": False},  # step by step: the reference simulation
    ],
)
def test_skipping_applies_only_where_it_is_exact(kw):
    assert skipped(closed_config(4, 400, **kw)) == 0


def test_skipping_keeps_a_long_level_bounded_and_exact_in_its_counts():
    # 200,000 requests at C=2 in a fraction of a second: every request counted once
    config = closed_config(2, 200_000, output_tokens="20")
    level = predict(config, CAT).levels[0]
    assert level.metrics.completed == 200_000
    assert math.isclose(
        level.metrics.output_tok_s * level.metrics.wall_s, 200_000 * 20, rel_tol=1e-3
    )


def test_a_saturated_sweep_of_equal_requests_derives_what_it_would_simulate():
    # small KV: the levels from about 5 up are saturated, and each simulated level lays
    # down repeated periods; deriving the levels above from one of them gives the figures
    # of simulating them (to float rounding: the periods are laid down at other points)
    config = closed_config(1, 300, concurrency=[1, 2, 3, 4, 6, 8, 12], kv_capacity_tokens=16 * 100)
    config = config.model_copy(update={"profile": "none"})
    reused = predict(config, CAT, workers=1)
    simulated = predict(config, CAT, workers=1, reuse_saturated=False)
    assert any(level.service_of is not None for level in reused.levels)
    assert any(level.repeated_requests for level in simulated.levels)
    for a, b in zip(reused.levels, simulated.levels, strict=True):
        fa, fb = flat_figures(a.metrics), flat_figures(b.metrics)
        for name in fa:
            assert fa[name] == pytest.approx(fb[name], rel=1e-9, abs=1e-9), (a.level, name)
