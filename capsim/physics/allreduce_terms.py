"""The tensor-parallel all-reduces of a step: which algorithm a TP group runs for a message
(NCCL's ring, or vLLM's one-shot and two-shot custom all-reduce where peer-to-peer works)
and how long the step's all-reduces take (physics/communication.py holds the formulas and
their sources).

``AllReduceTerms`` is mixed into ``StepModel`` (physics/step.py) and reads its deployment,
parameters and interconnect (``link``, ``link_gb_s``, ``hop_latency_us``,
``custom_allreduce``, ``allreduces_per_step``), set by ``_init_communication``.
"""

from __future__ import annotations

import numpy as np

from capsim.physics.communication import (
    ALLREDUCES_PER_LAYER,
    choose_interconnect,
    custom_allreduce_usable,
    group_bandwidth_gb_s,
    one_shot_allreduce_seconds,
    ring_allreduce_seconds,
    topology_of,
    two_shot_allreduce_seconds,
)
from capsim.physics.dtypes import ACTIVATION_BYTES


class AllReduceTerms:
    """A step's all-reduce time (mixed into ``StepModel``)."""

    def _init_communication(self) -> None:
        """The TP group's interconnect, its bandwidth (GB/s) and hop latency (us), whether
        custom all-reduce can run, and the all-reduces a step makes (2 a layer)."""
        gpu, dep, p = self.gpu, self.deployment, self.params
        self.link = choose_interconnect(gpu, dep.tp, dep.interconnect)
        self.custom_allreduce = custom_allreduce_usable(self.link, dep.custom_allreduce)
        self.link_gb_s = 0.0
        if self.link is not None:
            self.link_gb_s = group_bandwidth_gb_s(self.link, dep.tp)
            # a hop through the host's PCIe root costs more than one over a GPU link
            through_host = topology_of(self.link) == "host"
            hop = p.hop_latency_pcie_us if through_host else p.hop_latency_nvlink_us
            if self.link.latency_us is not None:
                hop = self.link.latency_us
            self.hop_latency_us = hop
        # vLLM's data parallelism with expert parallelism: a rank's attention all-reduces
        # only over its own attention_tp GPUs (none at one GPU a rank), and the MoE layer's
        # dispatch and combine over the group, with vLLM's default all2all backend
        # ("allgather_reducescatter": an all-gather and a reduce-scatter), move what one
        # all-reduce of the group's tokens does. SGLang's DP attention keeps two all-reduces
        # of the group's tokens a layer (its gather onto the group, then the MLP's)
        self.dp_ep_collectives = dep.dense_in_ranks and dep.dp_attention > 1
        self.rank_allreduces = self.dp_ep_collectives and dep.attention_tp > 1
        per_layer = ALLREDUCES_PER_LAYER
        if self.dp_ep_collectives and not self.rank_allreduces:
            per_layer = 1
        self.allreduces_per_step = per_layer * self.model.num_layers

    def communication_scalar(self, tokens: float) -> float:
        """communication_seconds for one token count, with the hand-offs between pipeline
        stages (PipelineTerms), seconds."""
        handoffs = self.pipeline_seconds(tokens)
        if self.link is None:
            return handoffs
        return float(self.communication_seconds(tokens)) + handoffs

    def communication_seconds(self, tokens: float | np.ndarray) -> np.ndarray:
        """All-reduce time of one step with ``tokens`` tokens (0 when TP = 1)."""
        t = np.asarray(tokens, dtype=float)
        if self.link is None:
            return np.zeros_like(t)
        message = t * self.model.hidden_size * ACTIVATION_BYTES
        dep = self.deployment
        if not self.dp_ep_collectives:
            return self.allreduces_per_step * self.allreduce_seconds(message)
        layers = self.model.num_layers
        group = layers * self.allreduce_seconds(message)  # the MLP or MoE layer's
        if not self.rank_allreduces:
            return group
        # each rank's attention over its GPUs, on its share of the tokens (in parallel)
        rank = self.allreduce_seconds(message / dep.dp_attention, dep.attention_tp)
        return group + layers * rank

    def _allreduce_times(
        self, nbytes: float | np.ndarray, gpus: int | None = None
    ) -> dict[str, np.ndarray]:
        """Time of one all-reduce of ``nbytes`` by each algorithm this TP group (or
        ``gpus`` of it) can run, seconds: NCCL's ring, and where peer-to-peer custom
        all-reduce runs its one-shot and two-shot kernels (physics/communication.py)."""
        p = self.params
        n = gpus or self.deployment.tp
        bw = self.link_gb_s if n == self.deployment.tp else group_bandwidth_gb_s(self.link, n)
        eff = p.allreduce_efficiency
        times = {
            "NCCL ring": ring_allreduce_seconds(
                nbytes, n, bw, eff, p.allreduce_latency_us, self.hop_latency_us
            )
        }
        if self.custom_allreduce:
            times["one-shot custom"] = one_shot_allreduce_seconds(
                nbytes, n, bw, eff, p.custom_allreduce_latency_us
            )
            times["two-shot custom"] = two_shot_allreduce_seconds(
                nbytes, n, bw, eff, p.two_shot_allreduce_latency_us
            )
        return times

    def allreduce_algorithm(self, nbytes: float) -> str:
        """Which all-reduce this TP group runs for ``nbytes``: the fastest of
        ``_allreduce_times`` ('NCCL ring', 'one-shot custom' or 'two-shot custom')."""
        if self.link is None:
            return ""
        times = self._allreduce_times(nbytes)
        return min(times, key=lambda name: float(times[name]))

    def allreduce_seconds(self, nbytes: float | np.ndarray, gpus: int | None = None) -> np.ndarray:
        """One all-reduce of ``nbytes`` in this TP group (or over ``gpus`` of it), seconds:
        the fastest algorithm (``_allreduce_times``)."""
        times = list(self._allreduce_times(nbytes, gpus).values())
        best = times[0]
        for t in times[1:]:
            best = np.minimum(best, t)
        return best
