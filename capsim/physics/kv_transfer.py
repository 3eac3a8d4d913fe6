"""Disaggregated prefill and decode: moving a prompt's KV cache from the prefill instance
that computed it to the decode instance that continues it.

vLLM's P/D connectors (NixlConnector, P2pNcclConnector, LMCache) and SGLang's PD
disaggregation (Mooncake, NIXL transfer backends) both send each GPU's shard of the
prompt's KV, layer by layer, GPU to GPU (NVLink inside a server, GPUDirect RDMA between
servers). The time of one request's transfer, seconds::

    t = kv_transfer_latency_ms / 1e3 + prompt_tokens x busiest_bytes_per_token
                                       / (link_gb_s x 1e9 x efficiency)

with ``kv_transfer_nvlink_efficiency`` over NVLink inside one server (bound by the many
small pages a transfer moves) and ``kv_transfer_efficiency`` over a network path.

``busiest_bytes_per_token`` is the most one GPU sends or receives: a decode GPU receives
the KV it holds (``kv_bytes_per_token`` of its TP layout); a prefill GPU sends the decode
group's KV over its own TP size (the same amount when the TP sizes are equal; with a
replicated latent cache (MLA), each decode GPU's copy). The transfers of one decode
instance share its GPUs' links, one after another (a first-in-first-out queue per
decode instance).
"""

from __future__ import annotations

from dataclasses import dataclass

from capsim.catalog.gpu_schema import GPU
from capsim.errors import CapsimUserError
from capsim.physics.communication import topology_of

SERVER_NIC_GB_S_PER_GPU = 50.0
"""GB/s per direction of the RDMA NIC each GPU of an NVLink-switched 8-GPU server has (400
Gb/s): NVIDIA's DGX BasePOD reference architecture (core components) lists for DGX
H100/H200 "Four OSFP ports serving eight single-port NVIDIA ConnectX-7 VPI ... up to 400
Gb/s InfiniBand/Ethernet" and for DGX B200 "4x OSFP ports serving 8x single-port NVIDIA
ConnectX-7 VPI", and the DGX H100 user guide's network-module table maps one ConnectX-7 to
each GPU. Clusters built with fewer NICs exist (Mooncake's H800 and H20-3e runs had 200
Gb/s per GPU): --kv-transfer-bandwidth gives yours."""


@dataclass(frozen=True)
class KVLink:
    """The link a KV transfer crosses, GB/s per direction per GPU, what it is, and
    whether it is NVLink inside one server (kind 'nvlink') or a network path ('network')."""

    gb_s: float
    name: str
    kind: str = "network"


def kv_transfer_link(gpu: GPU, total_gpus: int, requested_gb_s: float | None = None) -> KVLink:
    """The link between prefill and decode GPUs: ``requested_gb_s`` (the user's
    --kv-transfer-bandwidth, a network path) if given; else the GPU's NVLink switch when
    every GPU of the deployment fits in one NVLink domain; else, for a GPU of NVLink-
    switched servers, the server's RDMA NIC (SERVER_NIC_GB_S_PER_GPU); else its PCIe link
    (GPUs on PCIe alone, in one host or with a NIC no faster than their slot)."""
    if requested_gb_s is not None:
        # named by what it is: explain says "over {name} at {gb_s} GB/s", which read
        # "over 5 GB/s as given at 5 GB/s"
        return KVLink(requested_gb_s, "the link given by --kv-transfer-bandwidth")
    switch = [
        link
        for link in gpu.interconnects
        if link.kind == "nvlink"
        and link.bandwidth_gb_s_per_direction
        and topology_of(link) == "switch"
    ]
    if switch:
        link = switch[0]
        if link.max_gpus is None or link.max_gpus >= total_gpus:
            return KVLink(link.bandwidth_gb_s_per_direction, "NVLink", "nvlink")
        return KVLink(SERVER_NIC_GB_S_PER_GPU, "a 400 Gb/s RDMA NIC per GPU")
    pcie = gpu.interconnect("pcie")
    if pcie is None or not pcie.bandwidth_gb_s_per_direction:
        raise CapsimUserError(
            f"{gpu.name} lists no link in the catalog that prefill and decode instances "
            "could move KV over",
            hint="give --kv-transfer-bandwidth (GB/s per GPU, one direction)",
        )
    return KVLink(pcie.bandwidth_gb_s_per_direction, "PCIe")


@dataclass(frozen=True)
class KVTransfer:
    """One request's KV transfer from a prefill instance to a decode instance."""

    busiest_bytes_per_token: float  # bytes one GPU sends or receives per prompt token
    link: KVLink
    efficiency: float  # share of the link's bandwidth a transfer reaches
    latency_s: float  # fixed cost per request (s)

    @property
    def seconds_per_token(self) -> float:
        """Link time per prompt token (s)."""
        return self.busiest_bytes_per_token / (self.link.gb_s * 1e9 * self.efficiency)

    def seconds(self, prompt_tokens: float) -> float:
        """Time from the prefill's last chunk to the decode instance holding the KV (s)."""
        return self.latency_s + prompt_tokens * self.seconds_per_token

    def link_seconds(self, prompt_tokens: float) -> float:
        """The part of ``seconds`` that occupies the link (s): transfers queue for it."""
        return prompt_tokens * self.seconds_per_token


def busiest_bytes_per_token(decode_gpu_bytes: float, decode_tp: int, prefill_tp: int) -> float:
    """Bytes per prompt token the busiest GPU of a transfer moves: a decode GPU receives
    ``decode_gpu_bytes`` (its own KV layout), and the prefill group's GPUs send the
    decode group's ``decode_gpu_bytes x decode_tp`` among ``prefill_tp`` of them."""
    return max(decode_gpu_bytes, decode_gpu_bytes * decode_tp / prefill_tp)


def kv_transfer(
    gpu: GPU,
    *,
    decode_gpu_bytes: float,
    decode_tp: int,
    prefill_tp: int,
    total_gpus: int,
    params,
    requested_gb_s: float | None = None,
) -> KVTransfer:
    """The KV transfer of a disaggregated deployment of ``total_gpus`` ``gpu`` GPUs, with
    the efficiencies and fixed cost of ``params`` (EfficiencyParams)."""
    link = kv_transfer_link(gpu, total_gpus, requested_gb_s)
    efficiency = (
        params.kv_transfer_nvlink_efficiency
        if link.kind == "nvlink"
        else params.kv_transfer_efficiency
    )
    return KVTransfer(
        busiest_bytes_per_token(decode_gpu_bytes, decode_tp, prefill_tp),
        link,
        efficiency,
        params.kv_transfer_latency_ms / 1e3,
    )
