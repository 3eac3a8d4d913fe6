"""The speculative drafter's time per step: n-gram lookup, a separate draft model's steps,
or MTP/EAGLE passes of one decoder layer and the lm_head (physics/speculative.py holds the
acceptance and the passes' token counts).

``DrafterTerms`` is mixed into ``StepModel`` (physics/step.py); ``_init_drafter`` sets the
drafter layer's bytes and FLOPs per token.
"""

from __future__ import annotations

import numpy as np

from capsim.physics.drafter_memory import eagle_layer_weight_count
from capsim.physics.parameters import attention_params, layer_ffn_params
from capsim.physics.roofline import roofline


class DrafterTerms:
    """The drafter's time (mixed into ``StepModel``)."""

    def _init_drafter(self, weight_parts: dict[str, float]) -> None:
        """MTP / EAGLE: the bytes of one decoder layer and the lm_head read per pass
        (``draft_layer_bytes``), the routed expert slice it touches per expert
        (``draft_routed_slice``) and its FLOPs per token; zeros otherwise.
        ``weight_parts``: memory.weight_bytes of the deployment (bytes per GPU)."""
        model, fmt, dep = self.model, self.fmt, self.deployment
        tp = dep.tp
        self.draft_layer_bytes = 0.0
        self.draft_routed_slice = 0.0
        self.draft_layer_flops_per_token = 0.0
        if dep.spec is None or dep.spec.method not in ("mtp", "eagle"):
            return
        last = model.num_layers - 1
        ffn = layer_ffn_params(model, last)
        bits = fmt.bits_per_weight / 8
        dense_ffn = ffn.get("mlp", 0) + ffn.get("shared", 0)
        head = weight_parts["embeddings" if model.tie_word_embeddings else "lm_head"]
        self.draft_layer_bytes = eagle_layer_weight_count(model) * bits / tp + head
        self.draft_routed_slice = (
            self.expert_slice_bytes if "routed" in ffn and self.moe_layers else 0.0
        )
        self.draft_layer_flops_per_token = (
            2.0 * (attention_params(model) + dense_ffn + ffn.get("routed_active", 0)) / tp
            + self.lm_head_flops_per_token
        )

    def draft_seconds(self, sequences: int, context: np.ndarray) -> float:
        """Time the drafter spends proposing k tokens for ``sequences`` sequences."""
        spec = self.deployment.spec
        if spec is None or sequences == 0:
            return 0.0
        p = self.params
        k = spec.num_tokens
        if spec.method == "ngram":
            return sequences * p.ngram_lookup_us * 1e-6
        if spec.method == "draft":
            assert self.draft is not None
            ones = np.ones(sequences, dtype=int)
            return float(sum(self.draft.step(ones, context + j).t_total for j in range(k)))
        return float(self._layer_draft_seconds(sequences, np.sum(context + 1)))

    def _layer_draft_seconds(self, sequences: int, context_sum: float | np.ndarray) -> np.ndarray:
        """MTP/EAGLE drafting, seconds: passes of one decoder layer plus the lm_head
        (``SpecConfig.draft_pass_tokens``: a draft-extend pass over the verified positions,
        then k - 1 passes of topk tokens a sequence), each reading the layer's weights,
        its KV for ``context_sum`` tokens, and computing its tokens."""
        p = self.params
        kv_pass = np.asarray(context_sum, dtype=float) * self.kv_bytes_per_layer_token
        # the drafter is one of the model's own layers (an MTP layer; an MLA one for
        # DeepSeek), launched op by op at that layer's eager cost without graphs
        launch = p.layer_overhead_graph_us if self.deployment.cuda_graphs else self.eager_layer_us
        total = 0.0
        for tokens in self.deployment.spec.draft_pass_tokens(sequences):
            touched = float(self.experts_touched(tokens)) if self.draft_routed_slice else 0.0
            bytes_per_pass = self.draft_layer_bytes + touched * self.draft_routed_slice
            t_mem = bytes_per_pass / self.dense_bw + kv_pass / self.kv_bw
            rate = self.dense_gemm_rate(tokens)
            t_flop = tokens * self.draft_layer_flops_per_token / rate
            per_pass = roofline(t_mem, t_flop, p.roofline_sharpness) * p.drafter_layer_cost
            comm = float(self.communication_seconds(tokens)) / max(self.layers, 1)
            total = total + per_pass + launch * 1e-6 + comm
        return total

    def _draft_for(self, drafting_sequences: int, new_tokens, context) -> float:
        if not drafting_sequences or self.deployment.spec is None:
            return 0.0
        n = np.asarray(new_tokens, dtype=float)
        c = np.asarray(context, dtype=float)[n > 0][:drafting_sequences]
        return self.draft_seconds(drafting_sequences, c)
