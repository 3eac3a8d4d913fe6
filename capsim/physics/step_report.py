"""A step term by term (``StepBreakdown``, what ``capsim explain`` prints): every named
term with its units, the bound, the bytes and FLOPs behind them, and a decode step's
throughput. The simulation's hot path (``_seconds``) computes the same total without
building it (tested).

``StepReport`` is mixed into ``StepModel`` (physics/step.py).
"""

from __future__ import annotations

import numpy as np

from capsim.physics.dtypes import ACTIVATION_BYTES
from capsim.physics.roofline import StepBreakdown


class StepReport:
    """One step's breakdown, term by term (a mixin of StepModel)."""

    def step(
        self,
        new_tokens: np.ndarray | list[int],
        context: np.ndarray | list[int],
        logits_tokens: int | None = None,
        drafting_sequences: int = 0,
    ) -> StepBreakdown:
        """Cost of one engine step, term by term.

        Args:
            new_tokens: tokens each scheduled sequence processes this step.
            context: tokens already in each sequence's KV cache before the step.
            logits_tokens: positions the lm_head runs on (default: one per sequence).
            drafting_sequences: sequences the speculative drafter proposes for this step.
        """
        agg = self._aggregate(new_tokens, context)
        tokens, seqs = agg[0], agg[1]
        logits = seqs if logits_tokens is None else logits_tokens
        t = self._terms(*agg, logits, self._draft_for(drafting_sequences, new_tokens, context))
        mem_parts = (t["t_dense_mem"], t["t_exp_mem"], t["t_att_mem"])
        cmp_parts = (t["t_dense_cmp"], t["t_exp_cmp"], t["t_att_cmp"])
        pairs = list(zip(mem_parts, cmp_parts, strict=True))
        terms = {
            "memory": sum(m for m, f in pairs if m >= f) + t["t_elementwise"] + t["t_scores"],
            "compute": sum(f for m, f in pairs if f > m),
            "communication": t["t_comm"],
            "experts in system RAM": t["t_offload"],
            "overhead": t["t_host"] + t["t_floor"],
            "drafting": t["t_draft"],
        }
        if t["t_dispatch"] > self._gpu(t) and self.params.launch_overlap > 0:
            terms["CPU launches"] = t["t_dispatch"]
        device = self._device(t)
        total = self._total(t, device)
        message = t["graph_tokens"] * self.model.hidden_size * ACTIVATION_BYTES  # one all-reduce
        return StepBreakdown(
            sequences=seqs,
            tokens=int(tokens),
            graph_tokens=int(t["graph_tokens"]),
            logits_tokens=int(logits),
            weight_bytes=t["dense_bytes"],
            expert_bytes=t["expert_bytes"],
            experts_touched_per_layer=t["touched"],
            kv_read_bytes=t["kv_read"],
            kv_write_bytes=t["kv_write"],
            state_bytes=t["state"],
            linear_flops=t["linear_flops"],
            attention_flops=t["attn_flops"],
            comm_bytes=self.allreduces_per_step * message if self.link else 0.0,
            t_dense_memory=t["t_dense_mem"],
            t_dense_compute=t["t_dense_cmp"],
            t_expert_memory=t["t_exp_mem"],
            t_expert_compute=t["t_exp_cmp"],
            t_attention_memory=t["t_att_mem"],
            t_attention_compute=t["t_att_cmp"],
            t_memory=sum(mem_parts) + t["t_elementwise"] + t["t_scores"],
            t_compute=sum(cmp_parts),
            t_communication=t["t_comm"],
            t_overhead=t["t_host"] + t["t_floor"],
            t_dispatch=t["t_dispatch"],
            t_draft=t["t_draft"],
            t_total=total,
            bound=max(terms, key=terms.get),
            sampler_bytes=t["sampler_bytes"],
            activation_bytes=t["activation_bytes"],
            t_elementwise=t["t_elementwise"],
            score_bytes=t["score_bytes"],
            t_scores=t["t_scores"],
            t_block_fp8_tiles=t["t_tiles"],
            t_host=t["t_host"],
            t_host_hidden=t["t_host"] + device - total,
            allreduce_algorithm=self.allreduce_algorithm(message),
            expert_gemm_flops_per_s=t["expert_rate"] if t["touched"] else 0.0,
            gdn_prefill_flops_per_s=(
                (self.gdn_prefill_rate or self.attention_flops_rate)
                if self.gdn_flops_per_token
                else 0.0
            ),
            gdn_chunked_tokens=(
                self.gdn_chunked_tokens(tokens, seqs) if self.gdn_flops_per_token else 0.0
            ),
            gdn_prefill_token_seconds=(
                self.gdn_prefill_token_seconds if self.gdn_prefill_rate else 0.0
            ),
            t_state=t["t_state"],
            t_offload=t["t_offload"],
            offload_path=self.offload_path(tokens / self.passes(tokens)) if t["t_offload"] else "",
            state_bytes_per_s=self.state_bw if t["state"] else 0.0,
            ep_busiest_experts=t["ep_busiest"],
            ep_pair_load=t["ep_pair_load"],
        )

    def decode_step(self, context: np.ndarray | list[int]) -> tuple[StepBreakdown, float]:
        """One decode step for sequences at ``context``; with speculation, verification of
        k + 1 positions each plus drafting. Returns (breakdown, expected tokens per
        sequence)."""
        c = np.asarray(context, dtype=float)
        spec = self.deployment.spec
        if spec is None:
            return self.step(np.ones_like(c), c), 1.0
        width = spec.verify_width
        step = self.step(
            np.full_like(c, width), c, logits_tokens=width * len(c), drafting_sequences=len(c)
        )
        return step, spec.expected_tokens_per_step

    def decode_tokens_per_second(self, batch: int, context: int) -> float:
        """Aggregate decode output tok/s of ``batch`` sequences at ``context`` tokens."""
        step, per_seq = self.decode_step(np.full(batch, context))
        return batch * per_seq / step.t_total
