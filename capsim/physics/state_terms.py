"""Recurrent-state layers in a step (Gated DeltaNet, Mamba): the state bytes a step moves and
the chunked Gated DeltaNet prefill kernels' time beyond their FLOPs.

``StateTerms`` is mixed into ``StepModel`` (physics/step.py) and reads its KV layout,
decode width and linear-attention rates.
"""

from __future__ import annotations


class StateTerms:
    """Recurrent-state terms (mixed into ``StepModel``)."""

    def state_traffic_bytes(self, seqs: int) -> float:
        """Bytes of recurrent state (Gated DeltaNet, Mamba) a step moves: each scheduled
        sequence's state read once and written once per token of its decode width. A
        speculative verify of k + 1 tokens writes k + 1 states, one per draft position, so
        that a rejection can roll back to the last accepted one (vLLM's and SGLang's
        recurrent kernels store a state slot per position); a plain decode reads and
        writes one. Bytes."""
        return seqs * self.kv.state_bytes_per_sequence * (1.0 + self.decode_width)

    def gdn_chunked_tokens(self, tokens: float, seqs: int) -> float:
        """Tokens of a step that run through the chunked Gated DeltaNet prefill kernels:
        those beyond the decode width of each sequence (a decode runs the recurrent
        kernel, whose state traffic is costed with the KV)."""
        return max(tokens - seqs * self.decode_width, 0.0)

    def gdn_prefill_extra(self, tokens: float, seqs: int) -> float:
        """Seconds the chunked Gated DeltaNet prefill kernels take beyond their FLOPs at
        the attention rate (0 where the class sets no rate of their own): the step's
        chunked tokens' GDN FLOPs at ``linear_attention_compute_efficiency`` of the 16-bit
        peak, plus ``linear_attention_prefill_token_ns`` a chunked token and GDN layer
        (the serial walk over chunks), less the same FLOPs at the attention rate (already
        in its compute term). The walk is charged for every chunked token of the step, as
        if its prefilling sequences ran one after another; they run side by side, so a
        step of several short prompts is costed a little high."""
        if self.gdn_prefill_rate is None:
            return 0.0
        chunked = self.gdn_chunked_tokens(tokens, seqs)
        flops = chunked * self.gdn_flops_per_token
        walk = chunked * self.linear_layers * self.gdn_prefill_token_seconds
        return walk + flops / self.gdn_prefill_rate - flops / self.attention_flops_rate
