"""The router in front of data-parallel replicas: its policies, and the API server each
replica has of its own (a burst queues per replica, not for one server of the whole
deployment)."""

from __future__ import annotations

import pytest
import simpy

from capsim.engine.request import SimRequest
from capsim.engine.router import Router


class FakeReplica:
    """Records when each request reaches it."""

    def __init__(self, env: simpy.Environment, index: int):
        self.env, self.index = env, index
        self.arrivals: list[tuple[int, float]] = []

    @property
    def outstanding(self) -> int:
        return len(self.arrivals)

    def submit(self, req: SimRequest) -> None:
        self.arrivals.append((req.rid, self.env.now))


def burst(policy: str, replicas: int, requests: int, api_s=None, seed: int = 0):
    env = simpy.Environment()
    fakes = [FakeReplica(env, i) for i in range(replicas)]
    router = Router(env, fakes, policy, api_server_s=api_s, seed=seed)
    for rid in range(requests):
        router.submit(SimRequest(env, rid, 0.0, 1000, 10, ("s", rid), awaited=False))
    env.run()
    return fakes


def test_each_replica_serves_its_own_api_queue():
    """Eight requests at once, 2 ms of serial API-server work each, over four replicas:
    each replica's API server takes its two in turn (2 and 4 ms), where one server for the
    deployment would have let the last in after 16 ms."""
    fakes = burst("round_robin", 4, 8, api_s=lambda tokens: 0.002)
    for fake in fakes:
        assert [round(t, 9) for _, t in fake.arrivals] == [0.002, 0.004]
    assert max(t for f in fakes for _, t in f.arrivals) == 0.004


def test_least_outstanding_counts_requests_still_in_an_api_server():
    """Requests queued in a replica's API server count as its load: a burst of eight over
    four replicas lands two on each, not all on the first (which looks idle until they
    reach it)."""
    fakes = burst("least_outstanding", 4, 8, api_s=lambda tokens: 0.002)
    assert [len(f.arrivals) for f in fakes] == [2, 2, 2, 2]


def test_random_routing_is_uneven_and_repeatable():
    """The random policy (a ClusterIP Service's kube-proxy) draws each request's replica:
    1,000 requests over eight replicas land unevenly, and the same seed draws the same."""
    counts = [len(f.arrivals) for f in burst("random", 8, 1000, seed=3)]
    assert sum(counts) == 1000 and max(counts) - min(counts) > 10
    assert counts == [len(f.arrivals) for f in burst("random", 8, 1000, seed=3)]
    assert counts != [len(f.arrivals) for f in burst("random", 8, 1000, seed=4)]
    assert [len(f.arrivals) for f in burst("round_robin", 8, 1000)] == [125] * 8


def test_predict_takes_a_gateways_latency_and_capacity():
    """--router-latency-ms adds its latency to every first token; --router-capacity-rps
    queues requests beyond its rate (5 a second caps 64 clients far below the engine)."""
    import json

    from typer.testing import CliRunner

    from capsim.cli.main import app

    def run(*extra):
        args = ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "-c", "16"]
        r = CliRunner().invoke(app, [*args, "--requests", "64", "--json", *extra])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["results"][0]["points"][0]

    plain, slow = run(), run("--router-latency-ms", "50")
    assert slow["ttft_ms"]["p50"] == pytest.approx(plain["ttft_ms"]["p50"] + 50, abs=15)
    capped = run("--router-capacity-rps", "5")
    assert capped["request_throughput"] <= 5.0 * 1.02
    r = CliRunner().invoke(
        app,
        [
            "predict",
            "--gpu",
            "h100-sxm",
            "--model",
            "llama-3.1-8b",
            "--offline",
            "--router-latency-ms",
            "5",
        ],
    )
    assert r.exit_code == 2 and "--offline runs have none" in r.output


def test_a_scenario_says_how_its_source_spread_requests():
    """A published scenario's router (random for a Kubernetes Service, whose kube-proxy
    picks a pod at random) is simulated as given; without one, round-robin."""
    from capsim.calibration.compare import scenario_config
    from capsim.calibration.published import load_dataset, published_dir

    name = "corpus-llmd-h200x16-gptoss120b-pd-8p1-2d4-5000in-250out"
    ds = load_dataset(published_dir() / f"{name}.yaml")
    routers = {sc.name: scenario_config(ds, sc, [45]).router for sc in ds.scenarios}
    assert routers["h200-gpt-oss-120b-aggregated-16x-tp1"] == "random"
    assert routers["h200-gpt-oss-120b-pd-8p-tp1-2d-tp4"] == "round_robin"
