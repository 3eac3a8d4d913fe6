"""Mixture-of-experts routing: how many distinct experts one step's tokens touch.

With top-k routing over E experts and T tokens in a step, a decode step reads only the
experts some token routed to. For uniform routing the expected number of distinct experts
per layer is

    E_touched(T) = E * (1 - (1 - k/E) ** T)

(each token picks k distinct experts, so an expert escapes one token with probability
1 - k/E). With popularity skew, expert j is chosen with probability p_j (a Zipf law
p_j ~ j ** -skew, normalised), escapes one token with probability 1 - min(1, k p_j), and

    E_touched(T) = sum_j 1 - (1 - min(1, k p_j)) ** T

which equals the uniform formula when skew = 0. Skew makes a batch touch fewer experts, so
batching gets cheaper. Example: 128 experts, top-8, 4 tokens -> 29.1 experts, 3.64x the 8
of a single token.
"""

from __future__ import annotations

import numpy as np


def expert_popularity(num_experts: int, skew: float = 0.0) -> np.ndarray:
    """Routing probability of each expert (sums to 1): Zipf with exponent ``skew``."""
    ranks = np.arange(1, num_experts + 1, dtype=float)
    weights = ranks**-skew
    return weights / weights.sum()


def expected_distinct_experts(
    num_experts: int, top_k: int, tokens: float | np.ndarray, skew: float = 0.0
) -> np.ndarray:
    """Expected distinct experts touched per MoE layer by ``tokens`` tokens (vectorised)."""
    t = np.asarray(tokens, dtype=float)
    if skew == 0.0:
        return num_experts * (1.0 - (1.0 - top_k / num_experts) ** t)
    p_pick = np.minimum(1.0, top_k * expert_popularity(num_experts, skew))
    escape = (1.0 - p_pick) ** t[..., None]
    return (1.0 - escape).sum(axis=-1)
