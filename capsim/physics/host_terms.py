"""What the host adds to a step and the front end to a request: the CPU's per-step and
per-sequence work, eager kernel launches, the per-layer kernel floor, async scheduling's
overlap of host and device, and the API server's latency (serial and parallel parts).

``HostTerms`` is mixed into ``StepModel`` (physics/step.py) and reads its parameters,
deployment and CUDA-graph sizes.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np


class HostTerms:
    """Host, launch and front-end terms (mixed into ``StepModel``)."""

    def frontend_seconds(self, prompt_tokens: float | np.ndarray) -> float | np.ndarray:
        """Latency a request spends outside the engine's steps (API server, tokenizer,
        streaming) when nothing else is in flight, seconds; it adds to the request's TTFT
        and end-to-end time. The API server's serial share of it (api_server_seconds) is
        part of it, not added to it."""
        p = self.params
        return p.frontend_request_ms * 1e-3 + p.tokenize_us_per_token * 1e-6 * prompt_tokens

    def api_server_seconds(self, prompt_tokens: float | np.ndarray = 0.0) -> float | np.ndarray:
        """The API server's serial work on a request of ``prompt_tokens``, seconds:
        requests queue for it one at a time before they reach the engine. It is the part
        of the front end's latency that cannot overlap between requests: its per-request
        share (api_server_ms_per_request, capped at frontend_request_ms) and tokenizing the
        prompt (tokenize_us_per_token), which vLLM's API server runs on one thread (a
        ThreadPoolExecutor with max_workers=1, vLLM issue 25301). So requests sent at the
        same instant reach the engine a tokenization apart, as on a real server, where the
        first of a burst starts an idle engine's step alone."""
        p = self.params
        per_request = min(p.api_server_ms_per_request, p.frontend_request_ms) * 1e-3
        return per_request + p.tokenize_us_per_token * 1e-6 * prompt_tokens

    def frontend_parallel_seconds(self, prompt_tokens: float | np.ndarray) -> float | np.ndarray:
        """The rest of the front end's latency once its serial part (api_server_seconds,
        simulated as a queue before the engine) is taken out, seconds: the simulation adds
        it to each client-side first token and finish."""
        return self.frontend_seconds(prompt_tokens) - self.api_server_seconds(prompt_tokens)

    def stream_round_seconds(self, streams: float) -> float:
        """One round of the API server over ``streams`` streaming requests, seconds: each
        stream's chunk costs ``api_server_us_per_stream_chunk`` of the one API-server
        process. A finished request's last chunk waits about half a round to be sent and
        the client's next request about half a round to be taken in: a closed-loop
        client's slot stands empty about one round (it adds to TTFT and end-to-end time).
        When the round outlasts an engine step, a stream's tokens wait and go out together
        (vLLM merges the outputs a stream has not yet sent), so the round, not a growing
        queue, bounds the wait."""
        return float(streams) * self.params.api_server_us_per_stream_chunk * 1e-6

    def kernel_floor_us(self, tokens: float) -> float:
        """GPU-side per-layer costs of one step (gaps between a layer's kernels, MoE
        routing kernels), us, with or without CUDA graphs. Eager launches are
        ``dispatch_seconds``. An MoE layer runs the fused-experts call (its fixed cost,
        moe_layer_overhead_us) in place of a dense FFN's kernels (moe_replaced_ffn_floor_us
        off the layer floor), unless it has shared experts: those are a dense FFN beside
        the routed ones (vLLM's SharedFusedMoE runs their gate/up GEMM, activation and down
        GEMM as a dense layer does), so their kernels stay in the floor. An MLA model's
        layers add mla_layer_floor_us each (their attention block's extra kernels), and a
        Triton attention backend its own (triton_attention_floor_us)."""
        p = self.params
        moe_spec = self.model.moe
        replaced = 0.0 if moe_spec and moe_spec.num_shared_experts else p.moe_replaced_ffn_floor_us
        moe = p.moe_layer_overhead_us - replaced
        mla = self.layers * self.mla_layer_floor_us
        floor = max(0.0, self.layers * p.layer_overhead_graph_us + self.moe_layers * moe) + mla
        return floor + self.triton_attention_floor_us

    @cached_property
    def triton_attention_floor_us(self) -> float:
        """What a Triton attention backend's kernels add to a step beyond the default
        backend's, us: triton_attention_layer_us for each softmax-attention layer
        (physics/attention_backend.py); 0 on the default kernels."""
        if not self.deployment.triton_attention:
            return 0.0
        layers = self.full_layers + self.sliding_layers  # WorkCounts' softmax layers
        return layers * self.params.triton_attention_layer_us

    @property
    def dispatch_layer(self) -> tuple[float, str]:
        """How a step no CUDA graph holds launches each layer: (CPU us a layer, 'eager' or
        'compiled'), as dispatch_seconds charges it."""
        dep = self.deployment
        if not dep.cuda_graphs or not self.graph_sizes or dep.eager_outside_graphs:
            return self.eager_layer_us, "eager"
        return self.params.layer_overhead_compiled_us, "compiled"

    @property
    def eager_layer_us(self) -> float:
        """CPU time to launch one of this model's layers op by op, us: an MLA layer's
        (layer_overhead_eager_mla_us, many more kernels) or another's
        (layer_overhead_eager_us)."""
        p = self.params
        mla = self.model.mla is not None
        return p.layer_overhead_eager_mla_us if mla else p.layer_overhead_eager_us

    @property
    def mla_layer_floor_us(self) -> float:
        """What one MLA layer of this model pays a step beyond a GQA layer's floor, us:
        its attention block's extra kernels (mla_layer_floor_share of the class's
        layer_overhead_graph_us) and, in the first DeepSeek kernel stacks,
        mla_layer_overhead_us; 0 for a model without MLA attention."""
        if self.model.mla is None:
            return 0.0
        p = self.params
        return p.mla_layer_overhead_us + p.mla_layer_floor_share * p.layer_overhead_graph_us

    def host_seconds(self, sequences: int) -> float:
        """CPU work of one step that nothing overlaps (scheduling, input preparation,
        sampling): per step and per scheduled sequence, seconds."""
        p = self.params
        return (p.step_overhead_us + p.per_sequence_overhead_us * sequences) * 1e-6

    def dispatch_seconds(self, tokens: float) -> float:
        """CPU time to launch one step's kernels layer by layer, and its all-reduces,
        seconds: 0 when the step replays a CUDA graph (but for the MLA attention ops that
        piecewise graphs leave out, ``mla_attention_outside_us``);
        ``layer_overhead_eager_us`` a layer in eager mode (``--enforce-eager``, a platform
        without graphs, or a step above the largest captured size on an engine that runs
        those op by op: SGLang, vLLM V0);
        ``layer_overhead_compiled_us`` for such a step on an engine that runs compiled
        (fused) code without a graph (vLLM V1). The GPU works while the CPU launches, so a
        step takes the longer of this and its GPU time."""
        mla_outside = self.mla_attention_outside_us
        if tokens <= self.graph_max_tokens:
            return mla_outside * 1e-6
        p = self.params
        per_layer, kind = self.dispatch_layer
        if kind == "eager":  # the eager layer's launches hold its attention's
            mla_outside = 0.0
        allreduces = self.allreduces_per_step if self.link is not None else 0
        launches = self.layers * per_layer + allreduces * p.allreduce_eager_launch_us
        return (launches + mla_outside) * 1e-6

    @property
    def mla_attention_outside_us(self) -> float:
        """CPU time a step spends launching its MLA layers' attention ops outside the CUDA
        graphs (``mla_attention_eager_us`` a layer; vLLM V1's piecewise graphs before
        0.11), us; 0 without MLA, without graphs, or where decode replays a full graph."""
        us = self.params.mla_attention_eager_us
        if not us or self.model.mla is None or not self.deployment.cuda_graphs:
            return 0.0
        return self.layers * us

    def _overlapped(self, gpu, dispatch):
        """A step's GPU work and eager launches together (s, scalars or arrays): the longer
        of the two where launches run ahead of the device (``launch_overlap`` 1), their
        sum where the dispatching thread runs each operator itself (0, the CPU backend)."""
        serial = (1.0 - self.params.launch_overlap) * np.minimum(gpu, dispatch)
        return np.maximum(gpu, dispatch) + serial

    def _decode_only(self, tokens: float, seqs: int) -> bool:
        """Whether a step of ``tokens`` over ``seqs`` sequences only decodes (no prefill
        chunk in it: at most the decode width per sequence)."""
        return tokens <= seqs * self.decode_width

    def _with_host(self, host, device, decode_only: bool = True):
        """A step's duration from its host work and its device work (GPU kernels or their
        launches, and drafting), seconds, scalars or arrays. Without async scheduling they
        add up; with it the CPU prepares the next step while the GPU runs this one, so the
        share ``async_host_overlap`` of the host's work hides under the device's. vLLM's
        async scheduling overlaps decode steps only: a step with prefill tokens runs its
        host work serially (vLLM PR 27914: 'only optimizes the decode stage and has no
        effect on the prefill stage')."""
        if not self.async_host or not decode_only:
            return host + device
        hidden = self.params.async_host_overlap * host
        return np.maximum(device, hidden) + (host - hidden)
