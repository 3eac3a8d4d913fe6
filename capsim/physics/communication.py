"""Tensor-parallel communication: which all-reduce algorithm a TP group runs, and its time.

Each decoder layer does two all-reduces in a TP group (after the attention output
projection and after the FFN down projection), each of tokens x hidden x 2 bytes.

Algorithms (times for one all-reduce of S bytes over n GPUs with link bandwidth B per
direction, achieved efficiency e):

* **NCCL ring** (Patarasuk and Yuan, J. Parallel Distrib. Comput., 2009): 2 (n - 1) / n of
  the buffer crosses each link in 2 (n - 1) hops::

      t_ring = allreduce_latency_us + 2 (n - 1) x hop_latency + 2 (n - 1) / n x S / (B e)

* **One-shot custom all-reduce** (vLLM PR 2192; SGLang and TensorRT-LLM have the same
  kernel): every GPU reads its n - 1 peers' buffers over peer-to-peer links and reduces
  locally, inside the CUDA graph, in one kernel::

      t_1shot = custom_allreduce_latency_us + (n - 1) x S / (B e)

* **Two-shot custom all-reduce / symmetric memory** (vLLM PRs 20759, 24111, 24532):
  reduce-scatter then all-gather through peer memory (or NVSwitch multimem reduction)::

      t_2shot = two_shot_allreduce_latency_us + 2 (n - 1) / n x S / (B e)

vLLM dispatches on message size to the fastest of these on GPUs joined all-to-all (an
NVSwitch, or MI300X-style xGMI links to every peer); the time here is the minimum of the
three, which is what that dispatch achieves. The custom paths need peer-to-peer access:
they are used on 'switch' and 'mesh' topologies, not through a PCIe host bridge or a
two-card NVLink bridge (where vLLM falls back to NCCL on most consumer boards), and
not with ``--disable-custom-all-reduce``.

Priors (H100 SXM, NVSwitch; ms per all-reduce as the PRs print them):
SGLang PR 2904, vLLM custom all-reduce without CUDA graph, TP 2/4/8: 512 B
'0.0095/0.0091/0.0101', 1 MB '0.0266/0.0402/0.0450'; vLLM PR 24532, TP=4: '(32, 8192)
0.50 MB 0.010 (ca_1stage) ... 0.021 (pynccl)', '(256, 8192) 4.00 MB ... 0.038 (ca_1stage)';
vLLM PR 37756 (B300): '16 KiB | **0.007** ... 0.029 (pynccl)'. So about 7 us for a small
one-shot call, 13-17 us for the two-shot/multimem paths and 20-25 us for NCCL, with a
slope near 70% of NVLink bandwidth.
"""

from __future__ import annotations

import numpy as np

from capsim.catalog.gpu_schema import GPU, Interconnect
from capsim.errors import CapsimUserError

ALLREDUCES_PER_LAYER = 2
"""Attention output and FFN output (Megatron-style tensor parallelism)."""


INTERCONNECT_CHOICES = ("auto", "nvlink", "pcie", "infinity-fabric", "xe-link", "nvlink-c2c")
"""What --interconnect may name: auto, or a link kind of the catalog's GPU schema."""


def check_interconnect(requested: str) -> str:
    """``requested`` if --interconnect may name it, else a user error with the kinds."""
    if requested not in INTERCONNECT_CHOICES:
        import difflib

        raise CapsimUserError(
            f"--interconnect {requested!r} is not a kind of GPU link",
            hint="one of " + ", ".join(INTERCONNECT_CHOICES),
            suggestions=difflib.get_close_matches(requested, INTERCONNECT_CHOICES, n=2),
        )
    return requested


def choose_interconnect(gpu: GPU, tp: int, requested: str = "auto") -> Interconnect | None:
    """The link a TP group of ``tp`` GPUs all-reduces over.

    ``auto`` takes the fastest link that can join ``tp`` GPUs (a consumer NVLink bridge
    joins only two, so TP=4 on RTX 3090s runs its ring over PCIe). None when tp == 1.
    """
    check_interconnect(requested)
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


def topology_of(link: Interconnect) -> str:
    """A link's topology: as the catalog states it, else inferred (an NVLink joining 4+
    GPUs is an NVSwitch; Infinity Fabric links every peer; a 2-GPU NVLink is a bridge;
    PCIe goes through the host)."""
    if link.topology:
        return link.topology
    if link.kind in ("nvlink", "xe-link"):
        return "switch" if (link.max_gpus or 0) >= 4 else "bridge"
    if link.kind == "infinity-fabric":
        return "mesh"
    return "host"


def group_bandwidth_gb_s(link: Interconnect, n: int) -> float:
    """Bandwidth one GPU of an n-GPU group drives toward its peers, GB/s per direction. A
    switch gives each GPU its whole bandwidth whatever the group; a mesh (MI300X-style
    xGMI: one link to each of max_gpus - 1 peers, ``bandwidth_gb_s_per_direction`` their
    sum) lends a group of n only its n - 1 links; a bridge or the host link is what it is."""
    bw = link.bandwidth_gb_s_per_direction or 0.0
    if topology_of(link) == "mesh" and link.max_gpus and link.max_gpus > 2:
        return bw * min(n - 1, link.max_gpus - 1) / (link.max_gpus - 1)
    return bw


def custom_allreduce_usable(link: Interconnect | None, enabled: bool = True) -> bool:
    """Whether vLLM's custom (peer-to-peer) all-reduce runs over this link."""
    return enabled and link is not None and topology_of(link) in ("switch", "mesh")


def one_shot_allreduce_seconds(
    nbytes: float | np.ndarray, n: int, link_gb_s: float, efficiency: float, latency_us: float
) -> np.ndarray:
    """One-shot custom all-reduce: each GPU reads its n - 1 peers' buffers, seconds."""
    volume = (n - 1) * np.asarray(nbytes, dtype=float)
    return latency_us * 1e-6 + volume / (link_gb_s * 1e9 * efficiency)


def two_shot_allreduce_seconds(
    nbytes: float | np.ndarray, n: int, link_gb_s: float, efficiency: float, latency_us: float
) -> np.ndarray:
    """Two-shot custom / symmetric-memory all-reduce (reduce-scatter + all-gather through
    peer memory), seconds."""
    volume = 2.0 * (n - 1) / n * np.asarray(nbytes, dtype=float)
    return latency_us * 1e-6 + volume / (link_gb_s * 1e9 * efficiency)


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
