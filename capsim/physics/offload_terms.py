"""Routed experts kept in system RAM (llama.cpp's ``--n-cpu-moe N``): how a step reads
them. ``OffloadTerms`` is mixed into ``StepModel`` (physics/step.py).

llama.cpp places the expert tensors of the first N MoE layers in host memory. A pass of
fewer than ``OP_OFFLOAD_MIN_BATCH`` tokens multiplies them on the CPU, which streams each
touched expert from system RAM; a larger pass (a prompt's ubatch) copies the touched
experts to the GPU and multiplies them there (the scheduler's "op offload"), so the copy
over the host link is the cost. Either way the rest of the layer waits: the term adds to
the step. ``offload_past_weights`` says where vLLM's and SGLang's ``--cpu-offload-gb``
asks for more than a GPU's weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from capsim.errors import CapsimUserError

if TYPE_CHECKING:
    from capsim.physics.memory import MemoryFit

OP_OFFLOAD_MIN_BATCH = 32
"""Tokens from which llama.cpp runs an op whose weights sit in host memory on the GPU
(copying the weights over) rather than on the CPU: ggml-cuda.cu,
``ggml_backend_cuda_device_offload_op``: ``get_op_batch_size(op) >=
dev_ctx->op_offload_min_batch_size``, with ``GGML_OP_OFFLOAD_MIN_BATCH`` defaulting to 32
(ggml-org/llama.cpp PR 18535; the hard-coded 32 before it, PR 6083). For MUL_MAT_ID the
batch is the op's tokens (``op->ne[2]``). Since PR 15346 only the experts the batch uses
are copied."""


class OffloadTerms:
    """Experts in system RAM (mixed into ``StepModel``)."""

    def _init_offload(self) -> None:
        dep = self.deployment
        self.cpu_moe_layers = min(dep.cpu_moe_layers, self.moe_layers) if self.moe_layers else 0
        self.host_memory_bw = 0.0
        self.host_link_bw = 0.0
        self.weights_in_host_share = dep.weights_in_host_share
        if self.weights_in_host_share:
            self.host_link_bw = self.host_link_bytes_per_s()
        if not self.cpu_moe_layers:
            return
        if dep.host_memory_bandwidth_gbs is None:
            raise CapsimUserError(
                "--n-cpu-moe needs --host-memory-bandwidth (GB/s of system RAM read)",
                hint="dual-channel DDR5 measures about 60-95 GB/s, quad-channel DDR4 about "
                "100 (docs/physics.md, experts in system RAM)",
            )
        # what the CPU's matrix-vector products stream of the measured read bandwidth
        self.host_memory_bw = dep.host_memory_bandwidth_gbs * 1e9 * self.params.host_read_efficiency
        self.host_link_bw = self.host_link_bytes_per_s()

    def host_link_bytes_per_s(self) -> float:
        """What copying from pinned system RAM to the GPU reaches, bytes/s: the host link
        (--host-link-bandwidth, else the GPU's PCIe link) x host_link_efficiency."""
        dep = self.deployment
        link = dep.host_link_gbs
        if link is None:
            pcie = self.gpu.interconnect("pcie")
            link = pcie.bandwidth_gb_s_per_direction if pcie else None
        if not link:
            raise CapsimUserError(
                f"{self.gpu.name} has no PCIe link in the catalog to copy weights over",
                hint="give --host-link-bandwidth (GB/s, host to GPU)",
            )
        return link * 1e9 * self.params.host_link_efficiency

    def weights_in_host_seconds(self, weight_bytes: float) -> float:
        """The share of a pass's ``weight_bytes`` kept in system RAM (vLLM's and SGLang's
        --cpu-offload-gb), read over the host link, seconds."""
        if not self.weights_in_host_share:
            return 0.0
        return weight_bytes * self.weights_in_host_share / self.host_link_bw

    def offload_terms(self, routed_per_pass: float, touched: float, passes: int):
        """(seconds, share of the routed experts' GPU work left on the GPU) for a step of
        ``passes`` passes of ``routed_per_pass`` routed tokens touching ``touched`` experts
        a layer. Below OP_OFFLOAD_MIN_BATCH the CPU streams the touched experts of the
        offloaded layers from system RAM and the GPU does the other layers' experts;
        from it the touched experts are copied over the host link and the GPU does all."""
        if not self.cpu_moe_layers or not touched:
            return 0.0, 1.0
        nbytes = passes * self.cpu_moe_layers * touched * self.expert_slice_bytes
        if self.offload_path(routed_per_pass) == "cpu":
            return nbytes / self.host_memory_bw, 1.0 - self.cpu_moe_layers / self.moe_layers
        return nbytes / self.host_link_bw, 1.0

    def offload_path(self, tokens_per_pass: float) -> str:
        """How a pass of ``tokens_per_pass`` tokens reaches the experts in system RAM: the
        CPU multiplies them ("cpu") or they are copied to the GPU ("copy")."""
        return "cpu" if tokens_per_pass < OP_OFFLOAD_MIN_BATCH else "copy"


def offload_past_weights(asked: float, fit: MemoryFit) -> str | None:
    """Where --cpu-offload-gb asks for more GiB than a GPU's weights: all of them are kept
    in system RAM (vLLM offloads parameters until the size is reached or none are left, so
    it takes the value; predict, fit and capacity say so)."""
    kept = fit.weights_in_system_ram_bytes / 2**30
    if not asked or asked <= kept + 1e-6:
        return None
    return (
        f"--cpu-offload-gb {asked:g} is more than a GPU's {kept:.2f} GiB of weights: all of "
        f"them are read from system RAM each pass (0 to {kept:.2f} keeps a part on the GPU)"
    )
