"""Issue 45: with async scheduling (vLLM's batch queue of two steps, SGLang's overlap loop)
step n+1 is scheduled when step n is launched, so a request that reaches the engine while
step n runs is taken into step n+2; without it (llama.cpp, --no-async-scheduling, eager
mode) into step n+1. Hand-built timelines on one replica."""

from __future__ import annotations

import pytest
import simpy

from capsim.catalog.loader import load_catalog
from capsim.engine.config import PredictConfig
from capsim.engine.replica import Replica
from capsim.engine.request import SimRequest
from capsim.engine.setup import build_setup

CAT = load_catalog()


def timeline(async_scheduling: bool, arrive_at: float, fast_forward: bool = True):
    """One request decoding from t=0 (256 prompt tokens, 64 out) and a second one that
    reaches the engine at ``arrive_at`` s: the replica's step start times, the second
    request's first scheduling time, and the first request's step times."""
    config = PredictConfig(
        gpu="h100-sxm",
        model="llama-3.1-8b",
        concurrency=[1],
        async_scheduling=async_scheduling,
        fast_forward=fast_forward,
        skip_periods=False,
    )
    setup = build_setup(config, CAT)
    env = simpy.Environment()
    replica = Replica(
        env, 0, setup.step_model, setup.scheduler, setup.num_blocks, fast_forward=fast_forward
    )
    starts: list[float] = []
    original = replica.scheduler.schedule

    def schedule(now):
        step = original(now)
        if not step.empty:
            starts.append(now)
        return step

    replica.scheduler.schedule = schedule
    first = SimRequest(env, 0, 0.0, 256, 64, None)
    second = SimRequest(env, 1, arrive_at, 256, 64, None)

    def send():
        replica.submit(first)
        yield env.timeout(arrive_at)
        replica.submit(second)

    env.process(send())
    env.run()
    return starts, second.first_scheduled, replica.admits_a_step_late


def step_starts(async_scheduling: bool) -> list[float]:
    """The first request's step start times alone (step by step; the second arrives long
    after it finished)."""
    starts, _, _ = timeline(async_scheduling, 100.0, fast_forward=False)
    return [t for t in starts if t < 100.0]


@pytest.mark.parametrize("fast_forward", [True, False])
def test_an_arrival_during_a_step_joins_the_step_after_next_with_async_scheduling(fast_forward):
    starts = step_starts(True)
    k = len(starts) // 2  # a decode step well inside the first request's run
    arrive = (starts[k] + starts[k + 1]) / 2  # in the middle of step k
    _, scheduled, lagged = timeline(True, arrive, fast_forward)
    assert lagged
    assert scheduled == pytest.approx(starts[k + 2], abs=1e-12)


@pytest.mark.parametrize("fast_forward", [True, False])
def test_without_async_scheduling_an_arrival_joins_the_next_step(fast_forward):
    starts = step_starts(False)
    k = len(starts) // 2
    arrive = (starts[k] + starts[k + 1]) / 2
    _, scheduled, lagged = timeline(False, arrive, fast_forward)
    assert not lagged
    assert scheduled == pytest.approx(starts[k + 1], abs=1e-12)


def test_an_arrival_at_an_idle_engine_is_scheduled_at_once():
    assert step_starts(True)[-1] < 100.0  # the first request is long done by then
    _, scheduled, _ = timeline(True, 100.0)
    assert scheduled == pytest.approx(100.0, abs=1e-12)


def test_the_lag_lengthens_a_loaded_closed_loops_ttft_and_not_a_single_clients():
    from capsim.engine.simulate import predict

    def ttft_p50(c: int, async_scheduling: bool) -> float:
        config = PredictConfig(
            gpu="h100-sxm",
            model="llama-3.1-8b",
            concurrency=[c],
            requests=4 * c,
            input_tokens="1024",
            output_tokens="128",
            async_scheduling=async_scheduling,
            profile="none",
        )
        return predict(config, CAT, workers=1).levels[0].metrics.ttft_ms.p50

    assert ttft_p50(64, True) > ttft_p50(64, False)
    # alone, a request always finds the engine idle: no step is in flight to wait behind
    single_async, single_sync = ttft_p50(1, True), ttft_p50(1, False)
    assert single_async <= single_sync * 1.0001


@pytest.mark.parametrize(
    "args, steps",
    [
        (["--gpu", "h200", "--model", "llama-3.1-8b"], 1),
        (["--gpu", "h200", "--model", "llama-3.1-8b", "--engine", "sglang"], 1),
        (["--gpu", "h200", "--model", "llama-3.1-8b", "--no-async-scheduling"], 0),
        (
            [
                "--gpu",
                "rtx3090",
                "--model",
                "llama-3.1-8b",
                "--quant",
                "gguf-q4_k_m",
                "--engine",
                "llama.cpp",
            ],
            0,
        ),
    ],
)
def test_predict_json_says_how_many_steps_an_arrival_waits_beyond_the_running_one(args, steps):
    import json

    from typer.testing import CliRunner

    from capsim.cli.main import app

    r = CliRunner().invoke(app, ["predict", *args, "-c", "2", "--requests", "4", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["results"][0]["admission_lag_steps"] == steps
