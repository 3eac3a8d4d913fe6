"""The API server's round over the streaming requests (issue 45, the front end): how many
requests stream at a level, and what one round of the API server does to a closed loop."""

from __future__ import annotations

import numpy as np
import pytest

from capsim.catalog.loader import load_catalog
from capsim.engine.config import PredictConfig
from capsim.engine.front_end import level_frontend, streaming_requests
from capsim.engine.levels import make_workload, simulate_level
from capsim.engine.setup import build_setup

CAT = load_catalog()


def setup_of(chunk_us: float, **fields):
    cfg = PredictConfig(
        gpu="h200",
        model="llama-3.1-8b",
        efficiency_overrides={"api_server_us_per_stream_chunk": chunk_us},
        **fields,
    )
    return cfg, build_setup(cfg, CAT)


def test_streams_are_the_clients_a_replica_serves_within_its_limits():
    cfg, setup = setup_of(100.0, concurrency=[64], input_tokens="1024", output_tokens="256")
    assert streaming_requests(setup, make_workload(cfg, 64)) == 64
    # past max_num_seqs the rest wait and stream nothing
    short, _ = setup_of(100.0, concurrency=[5000], input_tokens="128", output_tokens="64")
    assert streaming_requests(setup, make_workload(short, 5000)) == setup.scheduler.max_num_seqs
    cfg2, two = setup_of(100.0, concurrency=[64], gpus=2)
    assert streaming_requests(two, make_workload(cfg2, 64)) == 32  # each replica's own
    # the KV cache holds fewer sequences of this size than max_num_seqs
    cfg3, small = setup_of(
        100.0,
        concurrency=[512],
        input_tokens="30000",
        output_tokens="2000",
        kv_capacity_tokens=100_000,
    )
    held = small.num_blocks // -(-31_000 // small.scheduler.block_size)
    assert streaming_requests(small, make_workload(cfg3, 512)) == held < 512
    cfg4, _ = setup_of(100.0, workload="open", rates=[2.0])
    assert streaming_requests(setup, make_workload(cfg4, 2.0)) == 0  # not known beforehand


def test_one_round_adds_streams_times_the_chunk_cost_to_what_a_client_sees():
    cfg, setup = setup_of(250.0, concurrency=[64])
    frontend = level_frontend(setup, make_workload(cfg, 64))
    base = setup.step_model.frontend_parallel_seconds
    assert frontend(1024.0) - base(1024.0) == pytest.approx(64 * 250e-6)
    assert np.allclose(frontend(np.array([10.0, 2000.0])) - base(np.array([10.0, 2000.0])), 0.016)
    cfg0, plain = setup_of(0.0, concurrency=[64])
    assert (
        level_frontend(plain, make_workload(cfg0, 64)) == plain.step_model.frontend_parallel_seconds
    )


def test_a_slower_api_server_bunches_the_second_wave_of_a_burst():
    """256 clients that start together on an H200 (1,024 in, 256 out, two requests each):
    the second wave's requests reach the engine only once the API server has sent the
    first wave's last tokens and taken the new requests in. The longer that round, the
    more of the first wave has finished before the second arrives, so it queues for the
    prefill budget as the first did: the median first token of all 512 comes much later,
    while the engine's own work (throughput) barely moves."""
    results = {}
    for chunk_us in (0.0, 600.0):
        cfg, setup = setup_of(
            chunk_us, concurrency=[256], requests=512, input_tokens="1024", output_tokens="256"
        )
        results[chunk_us] = simulate_level(setup, make_workload(cfg, 256)).metrics
    fast, slow = results[0.0], results[600.0]
    assert slow.ttft_ms.p50 > 2 * fast.ttft_ms.p50
    assert slow.output_tok_s == pytest.approx(fast.output_tok_s, rel=0.1)
    assert slow.output_tok_s <= fast.output_tok_s * 1.001
