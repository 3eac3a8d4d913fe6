"""An open loop whose arrivals outpace the server: once MAX_OPEN_BACKLOG requests wait,
arrivals stop (memory stays bounded; 10 million arrivals at 100 req/s against a server
of one a second grew to 3.7 GB), and the prediction says the level is overloaded."""

from __future__ import annotations

import pytest

from capsim.api import predict
from capsim.engine import workloads


def test_an_overloaded_open_loop_stops_sending_and_says_so(monkeypatch):
    monkeypatch.setattr(workloads, "MAX_OPEN_BACKLOG", 40)
    result = predict(
        gpu="rtx3090",
        model="llama-3.1-8b",
        workload="open",
        rates=[50.0],
        requests=400,
        input_tokens="1024",
        output_tokens="256",
    )
    level = result.levels[0]
    assert level.unsent_requests > 0
    assert level.metrics.requests + level.unsent_requests == 400
    note = next(n for n in result.notes if "overloaded" in n)
    assert f"the last {level.unsent_requests:,} were not sent" in note


def test_a_loop_the_server_keeps_up_with_sends_everything(monkeypatch):
    monkeypatch.setattr(workloads, "MAX_OPEN_BACKLOG", 40)
    result = predict(
        gpu="h100-sxm",
        model="llama-3.1-8b",
        workload="open",
        rates=[1.0],
        requests=60,
        input_tokens="256",
        output_tokens="64",
    )
    assert result.levels[0].unsent_requests == 0
    assert not any("overloaded" in n for n in result.notes)
    assert result.levels[0].metrics.requests == pytest.approx(60)
