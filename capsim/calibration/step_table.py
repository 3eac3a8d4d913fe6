"""Step times measured on a real server, for simulating that server as it is.

A probe run of the closed workload at several concurrency levels gives, per level:

* the decode step time with b sequences running: the median inter-token gap at
  concurrency b (in steady state every step yields one token per running sequence, and
  the median leaves out the gaps stretched by other requests' prefill chunks);
* the prefill cost per prompt token: TTFT at concurrency 1 over the prompt length.

What a measured table cannot hold is the API server's serial work: requests sent together
reach the engine one tokenization apart (vLLM tokenizes on a one-thread executor), so an
idle engine starts its first step with the first request alone. That spacing sets how a
closed loop's burst is cut into prefill steps, and so when each later wave arrives: on
vLLM's CPU build (C=16, 512-token prompts, 64 output tokens, 48 requests) the simulator
without it put the second wave's median TTFT at 0.63 s against 1.2-1.4 s measured, and with
it at 1.26 s. The table keeps that serial share as the sourced prior
``tokenize_us_per_token`` (capsim/physics/efficiency.py) and takes it out of the measured
prefill cost, which held it.

``MeasuredStepModel`` offers the interface the engine asks of the physics (``step_time``,
``decode_run_times``, ``decode_width``, ``decode_advance``, ``deployment``), so the
simulator can run on a server's own step times instead of computed ones. Decode step times
between and beyond measured batch sizes are interpolated linearly and held flat past the
largest.
"""

from __future__ import annotations

import numpy as np

from capsim.errors import CapsimUserError
from capsim.physics.deployment import Deployment
from capsim.probe.runfile import RunSummary


class MeasuredStepModel:
    """Step time = decode time of the batch's decoding sequences (measured table)
    + prefill tokens x measured seconds per prompt token."""

    def __init__(
        self,
        decode_batch: list[int],
        decode_step_s: list[float],
        prefill_s_per_token: float,
        api_server_s_per_token: float | None = None,
    ):
        """``api_server_s_per_token``: the API server's serial work per prompt token
        (seconds); None: the prior ``tokenize_us_per_token``."""
        if not decode_batch or len(decode_batch) != len(decode_step_s):
            raise CapsimUserError("a step-time table needs at least one decode measurement")
        order = np.argsort(decode_batch)
        self.batch = np.asarray(decode_batch, dtype=float)[order]
        self.decode_s = np.asarray(decode_step_s, dtype=float)[order]
        self.prefill_s_per_token = float(prefill_s_per_token)
        if api_server_s_per_token is None:
            api_server_s_per_token = tokenize_prior_s_per_token()
        self.api_server_s_per_token = float(api_server_s_per_token)
        self.deployment = Deployment()
        self.decode_width = 1
        self.decode_advance = 1.0
        self.draft = None
        # it tells decoding from prefilling sequences by their tokens: steps are costed
        # from the arrays, not from the scheduler's token moments
        self.takes_moments = False
        # arrivals join the next step: the measured server (vLLM's CPU build) schedules each
        # step after the last one ends (physics.step.StepModel.admits_a_step_late)
        self.admits_a_step_late = False

    def frontend_seconds(self, prompt_tokens: float) -> float:
        """The front end's latency outside the engine's steps (seconds): only the API
        server's serial share; the rest is in the measured prefill cost."""
        return self.api_server_seconds(prompt_tokens)

    def api_server_seconds(self, prompt_tokens: float = 0.0) -> float:
        """The API server's serial work on a request (seconds): requests queue for it one
        at a time before they reach the engine."""
        return self.api_server_s_per_token * prompt_tokens

    def frontend_parallel_seconds(self, prompt_tokens: float) -> float:
        """No front-end latency beside the queue (seconds): the measured prefill cost
        holds it."""
        return 0.0

    def stream_round_seconds(self, streams: float) -> float:
        """No round of the API server beside the measured costs (seconds): the decode
        gaps and prefill costs were read off the server's own streams, which hold it."""
        return 0.0

    def decode_seconds(self, sequences: float) -> float:
        if sequences <= 0:
            return 0.0
        return float(np.interp(sequences, self.batch, self.decode_s))

    def step_time(self, new_tokens, context, logits_tokens=None, drafting_sequences=0) -> float:
        n = np.asarray(new_tokens, dtype=float)
        decoding = float(np.count_nonzero(n == 1))
        prefill_tokens = float(n[n > 1].sum())
        return self.decode_seconds(decoding) + prefill_tokens * self.prefill_s_per_token

    def scheduled_step_time(self, new_tokens, context, logits_tokens=None, draft_context=None):
        """The engine's entry point (StepModel's interface); the table has no drafter."""
        return self.step_time(new_tokens, context, logits_tokens)

    def decode_run_times(self, context, n_steps: int) -> np.ndarray:
        return np.full(n_steps, self.decode_seconds(len(context)))


def step_table_from_run(summary: RunSummary) -> MeasuredStepModel:
    """Build the table from a closed-workload probe run (levels at several concurrencies)."""
    if summary.header.workload != "closed":
        raise CapsimUserError("step times come from a closed-workload run (--workload closed)")
    by_c: dict[int, list[float]] = {}
    ttft_c1: list[float] = []
    for lv in summary.levels:
        m = lv.metrics
        if m.itl_ms.p50:
            by_c.setdefault(lv.concurrency, []).append(m.itl_ms.p50 / 1e3)
        if lv.concurrency == 1 and m.ttft_ms.p50:
            ttft_c1.append(m.ttft_ms.p50 / 1e3)
    if not by_c or not ttft_c1:
        raise CapsimUserError("the run needs a level at concurrency 1 and inter-token gaps")
    batches = sorted(by_c)
    decode = [float(np.median(by_c[c])) for c in batches]
    prompt = summary.header.input_tokens or 1
    # TTFT at C=1 is the API server's serial work, then one prefill step of the whole
    # prompt (vLLM's budget exceeds it)
    serial = tokenize_prior_s_per_token()
    prefill = max(float(np.median(ttft_c1)) - decode[0] - serial * prompt, 0.0) / prompt
    return MeasuredStepModel(batches, decode, prefill, serial)


def measured_setup_from_run(summary: RunSummary, max_num_batched_tokens: int = 2048):
    """A Setup that simulates the server of a closed-workload probe run on its own step
    times (``step_table_from_run``), with the KV capacity and context limit the server
    reported. ``max_num_batched_tokens``: the server's token budget a step (the probe
    cannot read it; 2048 is vLLM's default below 70 GiB, its CPU build included)."""
    from capsim.engine.setup import measured_setup

    server = summary.header.server
    cache = server["cache_config"]
    capacity = int(cache["num_gpu_blocks"]) * int(cache["block_size"])
    return measured_setup(
        step_table_from_run(summary),
        capacity,
        int(server["max_model_len"]),
        max_num_batched_tokens=max_num_batched_tokens,
    )


def tokenize_prior_s_per_token() -> float:
    """The prior for the API server's serial tokenization, seconds per prompt token
    (``tokenize_us_per_token``'s default in capsim/physics/efficiency.py, where its source
    is given)."""
    from capsim.physics.efficiency import EfficiencyParams

    return EfficiencyParams.model_fields["tokenize_us_per_token"].default * 1e-6
