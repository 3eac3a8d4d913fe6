"""Tensor-parallel communication: ring all-reduce over NVLink, PCIe or Infinity Fabric.

Each decoder layer does two all-reduces in a TP group (after the attention output
projection and after the FFN down projection), each of tokens x hidden x 2 bytes.
A ring all-reduce over n GPUs moves 2 (n - 1) / n of the buffer over each link
(reduce-scatter then all-gather) in 2 (n - 1) hops:

    t = latency + 2 (n - 1) x hop_latency + 2 (n - 1) / n x bytes / (link_bw x efficiency)

Source: Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations" (J. Parallel Distrib. Comput., 2009); NCCL's ring algorithm.
"""

from __future__ import annotations

import numpy as np

from capsim.catalog.schemas import GPU, Interconnect
from capsim.errors import CapsimUserError

ALLREDUCES_PER_LAYER = 2
"""Attention output and FFN output (Megatron-style tensor parallelism)."""


def choose_interconnect(gpu: GPU, tp: int, requested: str = "auto") -> Interconnect | None:
    """The link a TP group of ``tp`` GPUs all-reduces over.

    ``auto`` takes the fastest link that can join ``tp`` GPUs (a consumer NVLink bridge
    joins only two, so TP=4 on RTX 3090s runs its ring over PCIe). None when tp == 1.
    """
    if tp == 1:
        return None
    usable = [
        ic
        for ic in gpu.interconnects
        if ic.kind != "none"
        and ic.bandwidth_gb_s_per_direction
        and (ic.max_gpus is None or ic.max_gpus >= tp)
    ]
    if requested != "auto":
        named = [ic for ic in gpu.interconnects if ic.kind == requested]
        if not named:
            have = ", ".join(ic.kind for ic in gpu.interconnects) or "none"
            raise CapsimUserError(
                f"{gpu.name} has no {requested} interconnect (it has: {have})",
                hint="use --interconnect auto or one the GPU has",
            )
        if named[0] not in usable:
            raise CapsimUserError(
                f"{gpu.name}'s {requested} joins at most {named[0].max_gpus} GPUs, not {tp}",
                hint="use a smaller --tp or --interconnect pcie",
            )
        return named[0]
    if not usable:
        raise CapsimUserError(
            f"{gpu.name} lists no interconnect that can join {tp} GPUs for tensor parallelism",
            hint="use --tp 1 (and data-parallel replicas) or add an interconnect to the catalog",
        )
    return max(usable, key=lambda ic: ic.bandwidth_gb_s_per_direction or 0)


def ring_allreduce_seconds(
    nbytes: float | np.ndarray,
    n: int,
    link_gb_s: float,
    efficiency: float,
    latency_us: float,
    hop_latency_us: float,
) -> np.ndarray:
    """Time of one ring all-reduce of ``nbytes`` over ``n`` GPUs, seconds."""
    if n <= 1:
        return np.zeros_like(np.asarray(nbytes, dtype=float))
    volume = 2.0 * (n - 1) / n * np.asarray(nbytes, dtype=float)
    fixed = (latency_us + 2 * (n - 1) * hop_latency_us) * 1e-6
    return fixed + volume / (link_gb_s * 1e9 * efficiency)
