"""The smooth roofline of a kernel class, causal attention's query-key pairs, and the
breakdown of one step's bytes, FLOPs and times that ``capsim explain`` prints."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


def roofline(t_mem, t_flop, sharpness: float):
    """Smooth roofline of a kernel class, seconds: (t_mem^p + t_flop^p)^(1/p) with p =
    ``sharpness`` (scalars or arrays). Never less than the larger of the two, at most
    2^(1/p) times it (where they are equal); monotone in both."""
    hi = np.maximum(t_mem, t_flop)
    if sharpness >= 64:
        return hi
    lo = np.minimum(t_mem, t_flop)
    ratio = np.divide(lo, hi, out=np.zeros_like(hi, dtype=float), where=hi > 0)
    return hi * (1.0 + ratio**sharpness) ** (1.0 / sharpness)


def roofline_scalar(t_mem: float, t_flop: float, sharpness: float) -> float:
    """``roofline`` for two floats, without numpy (the simulation's hot path)."""
    hi, lo = (t_mem, t_flop) if t_mem >= t_flop else (t_flop, t_mem)
    if hi <= 0.0 or sharpness >= 64:
        return hi
    return hi * (1.0 + (lo / hi) ** sharpness) ** (1.0 / sharpness)


def causal_pairs(context: np.ndarray, new: np.ndarray, window: float | None = None) -> np.ndarray:
    """Query-key pairs of causal attention for ``new`` queries after ``context`` keys,
    each query seeing at most ``window`` keys: sum_{p=c+1}^{c+n} min(p, window)."""
    c = context.astype(float)
    n = new.astype(float)
    if window is None:
        return n * c + n * (n + 1) / 2
    below = np.clip(window - c, 0, n)  # queries whose position is still <= window
    return below * c + below * (below + 1) / 2 + (n - below) * window


@dataclass(frozen=True)
class StepBreakdown:
    """One step's costs. Bytes and FLOPs per GPU; times in seconds."""

    sequences: int
    tokens: int
    graph_tokens: int
    logits_tokens: int
    weight_bytes: float
    expert_bytes: float
    experts_touched_per_layer: float
    kv_read_bytes: float
    kv_write_bytes: float
    state_bytes: float
    linear_flops: float
    attention_flops: float
    comm_bytes: float
    t_dense_memory: float
    t_dense_compute: float
    t_expert_memory: float
    t_expert_compute: float
    t_attention_memory: float
    t_attention_compute: float
    t_memory: float
    t_compute: float
    t_communication: float
    t_overhead: float
    t_dispatch: float  # eager kernel launches (CPU); overlaps the GPU's work
    t_draft: float
    t_total: float
    bound: str
    sampler_bytes: float = 0.0  # the sampler's passes over the logits (in t_dense_memory)
    activation_bytes: float = 0.0  # the elementwise kernels' activation traffic
    t_elementwise: float = 0.0  # their time (norms, rotary, activation, MoE sums; in t_memory)
    score_bytes: float = 0.0  # attention scores through DRAM without a fused kernel
    t_scores: float = 0.0  # their time (in t_memory; physics/score_terms.py)
    # block-FP8 dense GEMMs' idle multiprocessors (in t_dense_memory; physics/gemm_tiles.py)
    t_block_fp8_tiles: float = 0.0
    t_host: float = 0.0  # the host's per-step work (part of t_overhead)
    t_host_hidden: float = 0.0  # of which async scheduling hides under the device's work
    allreduce_algorithm: str = ""  # what the TP group's all-reduces run (empty at TP=1)
    expert_gemm_flops_per_s: float = 0.0  # rate the routed experts' grouped GEMMs run at
    gdn_prefill_flops_per_s: float = 0.0  # rate the chunked Gated DeltaNet prefill runs at
    gdn_chunked_tokens: float = 0.0  # tokens through the chunked Gated DeltaNet kernels
    gdn_prefill_token_seconds: float = 0.0  # their serial chunk walk, per token and layer
    t_state: float = 0.0  # the recurrent state stream (in t_attention_memory)
    state_bytes_per_s: float = 0.0  # the rate it streams at
    t_offload: float = 0.0  # experts in system RAM: read by the CPU or copied to the GPU
    offload_path: str = ""  # "cpu" (a small pass) or "copy" (op offload), empty without
    # expert parallelism: whole experts the busiest GPU runs a layer, and its token-expert
    # pairs over the group's mean (0 and 1 without)
    ep_busiest_experts: float = 0.0
    ep_pair_load: float = 1.0

    @property
    def bytes_total(self) -> float:
        return (
            self.weight_bytes
            + self.expert_bytes
            + self.kv_read_bytes
            + self.kv_write_bytes
            + self.state_bytes
            + self.activation_bytes
            + self.score_bytes
        )

    @property
    def flops_total(self) -> float:
        return self.linear_flops + self.attention_flops

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved from DRAM (the roofline x-axis)."""
        return self.flops_total / self.bytes_total if self.bytes_total else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            bytes_total=self.bytes_total,
            flops_total=self.flops_total,
            arithmetic_intensity=self.arithmetic_intensity,
            units="bytes and FLOPs per GPU; times in seconds",
        )
        return d
