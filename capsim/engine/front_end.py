"""What a client waits for outside the engine at one load level: the front end's latency
per request (physics/host_terms.py's parallel part) and one round of the API server over
the requests streaming at that level (``stream_round_seconds``).

A closed loop's client sees its last token and sends its next request about one round of
the API server after the engine produced that token, so the round is part of the
turnaround the simulation gives each finished request, and of each first token and finish
a client sees. How many requests stream is known before the level runs where its
concurrency is: the closed, batch and agents workloads (at most the engine's sequence
limit, and what its KV cache can hold at once); an open loop's varies and is not counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from capsim.engine.setup import Setup
from capsim.engine.workloads import Workload


def streaming_requests(setup: Setup, workload: Workload) -> int:
    """Requests streaming from one replica's API server at once at this level: the
    clients a replica serves, at most ``max_num_seqs`` and at most as many sequences of
    the workload's mean prompt and half its mean output as the KV cache holds; 0 for an
    open loop (not known before it runs)."""
    if workload.kind not in ("closed", "batch", "agents") or not workload.concurrency:
        return 0
    clients = math.ceil(workload.concurrency / setup.engines)
    sequence_tokens = workload.input.mean + workload.output.mean / 2
    blocks = max(1, math.ceil(sequence_tokens / setup.scheduler.block_size))
    held = max(1, setup.num_blocks // blocks)
    return min(clients, setup.scheduler.max_num_seqs, held)


@dataclass(frozen=True)
class LevelFrontEnd:
    """``frontend(prompt tokens)`` of one level, seconds: the front end's parallel latency
    plus one round of the API server over the level's streams (a picklable callable)."""

    base: Callable[[float | np.ndarray], float | np.ndarray]
    round_s: float

    def __call__(self, prompt_tokens):
        return self.base(prompt_tokens) + self.round_s


def level_frontend(setup: Setup, workload: Workload) -> Callable:
    """The front-end latency a client sees at this level (``LevelFrontEnd``), or the
    parallel part alone where no round is modelled (the engine's cost per chunk is 0)."""
    base = setup.step_model.frontend_parallel_seconds
    round_s = setup.step_model.stream_round_seconds(streaming_requests(setup, workload))
    return LevelFrontEnd(base, round_s) if round_s else base
