"""Step times measured on a real server, for simulating that server as it is.

A probe run of the closed workload at several concurrency levels gives, per level:

* the decode step time with b sequences running: the median inter-token gap at
  concurrency b (in steady state every step yields one token per running sequence, and
  the median leaves out the gaps stretched by other requests' prefill chunks);
* the prefill cost per prompt token: TTFT at concurrency 1 over the prompt length.

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
        self, decode_batch: list[int], decode_step_s: list[float], prefill_s_per_token: float
    ):
        if not decode_batch or len(decode_batch) != len(decode_step_s):
            raise CapsimUserError("a step-time table needs at least one decode measurement")
        order = np.argsort(decode_batch)
        self.batch = np.asarray(decode_batch, dtype=float)[order]
        self.decode_s = np.asarray(decode_step_s, dtype=float)[order]
        self.prefill_s_per_token = float(prefill_s_per_token)
        self.deployment = Deployment()
        self.decode_width = 1
        self.decode_advance = 1.0
        self.draft = None
        # it tells decoding from prefilling sequences by their tokens: steps are costed
        # from the arrays, not from the scheduler's token moments
        self.takes_moments = False

    def frontend_seconds(self, prompt_tokens: float) -> float:
        """No front-end latency: a measured step table already holds what the server
        took (seconds)."""
        return 0.0

    def api_server_seconds(self, prompt_tokens: float = 0.0) -> float:
        """No API-server queue: the measured table already holds it (seconds)."""
        return 0.0

    def frontend_parallel_seconds(self, prompt_tokens: float) -> float:
        """No front-end latency beside the queue either (seconds)."""
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
    # TTFT at C=1 is one prefill step of the whole prompt (vLLM's budget exceeds it)
    prefill = max(float(np.median(ttft_c1)) - decode[0], 0.0) / prompt
    return MeasuredStepModel(batches, decode, prefill)
