"""A decode run: the durations of consecutive identical decode steps of the same sequences,
evaluated for the whole run at once (the simulator waits for a run in one event).

``DecodeRuns`` is mixed into ``StepModel`` (physics/step.py) and uses its per-deployment
constants and step parts; every duration equals the step-by-step ``decode_step`` (tested).
"""

from __future__ import annotations

import numpy as np

from capsim.physics.roofline import causal_pairs, roofline


class DecodeRuns:
    """Decode-run durations for ``StepModel`` (seconds)."""

    def decode_run_times(self, context: np.ndarray, n_steps: int) -> np.ndarray:
        """Durations of ``n_steps`` consecutive decode steps of the same sequences, seconds.

        Step j sees each sequence's context grown by j x decode_advance. Equal, step by
        step, to calling decode_step (tested), but evaluated for all steps at once.
        """
        c0 = np.asarray(context, dtype=float)
        seqs = c0.size
        width = self.decode_width
        if self.takes_moments:  # the contexts enter only through their sum
            return self._affine_decode_run_times(float(np.add.reduce(c0)), seqs, n_steps)
        j = np.arange(n_steps, dtype=float)
        # summed context of the batch at each step: only the windowed terms and a draft
        # model need each sequence's own context, the rest is linear in the sum
        ctx_sum = float(c0.sum()) + seqs * self.decode_advance * j
        kv = self.kv
        total_sum = ctx_sum + seqs * width
        pairs = width * ctx_sum + seqs * width * (width + 1) / 2
        ranks = self.deployment.dp_attention
        if ranks > 1 and seqs:  # the busiest rank holds the longest sequence (_busiest_rank)
            top = float(c0.max()) + self.decode_advance * j
            total_sum = np.maximum(total_sum, ranks * (top + width))
            pairs = np.maximum(pairs, ranks * (width * top + width * (width + 1) / 2))
        read = self.kv_read  # every attending layer's K and V (KV-shared ones too)
        kv_read = total_sum * read.full_bytes_per_token
        attn = self.full_pair_flops * pairs  # attention FLOPs
        ctx = None
        if kv.sliding_window is not None and ranks == 1 and not self._draft_model_runs:
            # the windowed sums in O(sequences + steps), not over a (steps, seqs) array
            window_sum, windowed = sliding_window_sums(
                c0, self.decode_advance * j, width, kv.sliding_window
            )
            kv_read += window_sum * read.sliding_bytes_per_token
            if self.sliding_layers:
                attn = attn + self.sliding_pair_flops * windowed
        elif kv.sliding_window is not None or self._draft_model_runs:
            ctx = c0[None, :] + j[:, None] * self.decode_advance  # (steps, seqs)
        if ctx is not None and kv.sliding_window is not None:
            held = np.minimum(ctx + width, kv.sliding_window)
            window_sum = held.sum(axis=1)
            if ranks > 1 and seqs:
                window_sum = np.maximum(window_sum, ranks * held.max(axis=1))
            kv_read += window_sum * read.sliding_bytes_per_token
            if self.sliding_layers:
                n = np.full_like(ctx, width)
                each = causal_pairs(ctx, n, kv.sliding_window)
                windowed = each.sum(axis=1)
                if ranks > 1 and seqs:
                    windowed = np.maximum(windowed, ranks * each.max(axis=1))
                attn = attn + self.sliding_pair_flops * windowed
        elif kv.sliding_window is None:
            kv_read += total_sum * read.sliding_bytes_per_token
            attn = attn + self.sliding_pair_flops * pairs
        logits = seqs * width if self.deployment.spec is not None else seqs
        host, gpu, dispatch, att_mem, att_cmp = self._context_free(
            float(seqs * width), seqs, logits
        )
        attention = roofline(
            att_mem + kv_read / self.kv_bw,
            att_cmp + attn / self.attention_flops_rate,
            self.params.roofline_sharpness,
        )
        device = gpu + attention if not dispatch else self._overlapped(gpu + attention, dispatch)
        if self.deployment.spec is not None:
            device = device + self._draft_run(seqs, ctx_sum, ctx)
        return self._with_host(host, device)

    def _affine_decode_run_times(self, context_sum: float, seqs: int, n_steps: int) -> np.ndarray:
        """``decode_run_times`` without a sliding window or speculation, seconds: every term
        that changes from step to step (the KV read, the attention FLOPs) is then affine in
        the step index, so the run costs a handful of vector operations however long it
        is. ``context_sum``: the batch's summed context (tokens) before the run."""
        adv = self.decode_advance
        host, gpu, dispatch, att_mem, att_cmp = self._context_free(float(seqs), seqs, seqs)
        kv_bytes = self.kv_read.bytes_per_token  # what every attending layer reads a token
        # at step j: summed context S0 + seqs adv j; KV read of (S + seqs) tokens and
        # S + seqs query-key pairs a layer (one new token each)
        pair_time = (self.full_pair_flops + self.sliding_pair_flops) / self.attention_flops_rate
        mem0 = att_mem + (context_sum + seqs) * kv_bytes / self.kv_bw
        cmp0 = att_cmp + (context_sum + seqs) * pair_time
        mem_slope = seqs * adv * kv_bytes / self.kv_bw
        cmp_slope = seqs * adv * pair_time
        j = np.arange(n_steps, dtype=float)
        t_mem = mem_slope * j
        t_mem += mem0
        t_cmp = cmp_slope * j
        t_cmp += cmp0
        last = n_steps - 1
        p = self.params.roofline_sharpness
        if (
            p < 64
            and mem0 > 0
            and (mem0 >= cmp0) == (mem0 + mem_slope * last >= cmp0 + cmp_slope * last)
        ):
            # one side dominates the whole run (both are affine): no elementwise max/min
            hi, lo = (t_mem, t_cmp) if mem0 >= cmp0 else (t_cmp, t_mem)
            lo /= hi
            if p == 3.0:  # the default sharpness: a cube and a cube root, not two powers
                cube = lo * lo
                cube *= lo
                cube += 1.0
                lo = np.cbrt(cube, out=cube)
            else:
                lo **= p
                lo += 1.0
                lo **= 1.0 / p
            lo *= hi
            attention = lo
        else:
            attention = roofline(t_mem, t_cmp, p)
        attention += gpu
        device = attention if not dispatch else self._overlapped(attention, dispatch)
        if not self.async_host:
            device += host
            return device
        hidden = self.params.async_host_overlap * host
        if device[0] >= hidden:  # device time only grows along the run
            device += host - hidden
            return device
        return self._with_host(host, device)

    @property
    def _draft_model_runs(self) -> bool:
        spec = self.deployment.spec
        return spec is not None and spec.method == "draft"

    def _draft_run(self, seqs: int, ctx_sum: np.ndarray, ctx: np.ndarray | None) -> np.ndarray:
        """Drafter time for each step of a speculative decode run, seconds; ``ctx_sum``
        is the batch's summed context per step, ``ctx`` each sequence's (steps, seqs)
        context where a draft model needs it."""
        spec = self.deployment.spec
        if spec.method == "ngram":
            return np.full(ctx_sum.size, seqs * self.params.ngram_lookup_us * 1e-6)
        if spec.method == "draft":
            return np.array([self.draft_seconds(seqs, row) for row in ctx])
        return self._layer_draft_seconds(seqs, ctx_sum + seqs)


def sliding_window_sums(
    context: np.ndarray, shift: np.ndarray, width: float, window: float
) -> tuple[np.ndarray, np.ndarray]:
    """For each step ``k`` (``shift[k]`` tokens added to every sequence's ``context``),
    the batch's sum of min(context + shift + width, window), the KV tokens a windowed layer
    reads, and of ``causal_pairs(context + shift, width, window)``, its query-key pairs;
    equal to summing the (steps, sequences) arrays, in O((sequences + steps) log
    sequences). Each sequence's terms are linear in its context below the window, constant
    past it and, for the pairs, quadratic over the ``width`` tokens between (with d =
    window - context there, width x window - d (d - 1) / 2): sums over the sorted contexts
    from prefix sums of c and c^2."""
    c = np.sort(np.asarray(context, dtype=float))
    count = c.size
    prefix = np.concatenate(([0.0], np.cumsum(c)))
    squares = np.concatenate(([0.0], np.cumsum(c * c)))
    s = np.asarray(shift, dtype=float)
    w, n = float(window), float(width)
    # sequences with c + s <= w - n: every term still below the window
    low = np.searchsorted(c, w - n - s, side="right")
    # sequences with c + s >= w: every term at the window
    high = np.maximum(np.searchsorted(c, w - s, side="left"), low)
    below_sum = prefix[low] + low * s  # sum of c + s over the sequences below
    held = below_sum + low * n + (count - low) * w
    pairs = n * below_sum + low * n * (n + 1) / 2 + (count - high) * n * w
    middle = high - low
    c_sum = prefix[high] - prefix[low] + middle * s
    c_squares = squares[high] - squares[low] + 2 * s * (prefix[high] - prefix[low]) + middle * s * s
    d_sum = middle * w - c_sum
    d_squares = middle * w * w - 2 * w * c_sum + c_squares
    pairs = pairs + middle * n * w - (d_squares - d_sum) / 2
    return held, pairs
