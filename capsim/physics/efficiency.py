"""Efficiency parameters of the step-time model: every fudge factor, named, with units.

These are the knobs calibration fits. Defaults live in data, not code: the field defaults
below are the generic values, and ``hardware_db/efficiency/<hardware_class>.yaml`` overrides
them per hardware class (a GPU's ``hardware_class`` picks its file). A calibration profile
overrides them again.

Groups (``EfficiencyParams.groups``) tell calibration which parameters belong together.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

EAGER_LAUNCH_SOURCES = (
    "vllm-project/vllm-omni issue 7960 (2026-09-22), Qwen2.5-Omni-7B thinker (a 28-layer "
    "Qwen2.5-7B) on A800: '| text | ~23 -> ~13 ms (1.8x) |' (TPOT eager -> graph). An eager "
    "step bound by its launches costs host work + launches; the graph step, host work + GPU "
    "work (> 0), so the launches take 10-23 ms: 360-820 us a layer.",
    "local-inference-lab/vllm PR 314 (2026-08-14), Qwen3.8-27B-K4 on one RTX 5090, C=1/4/8: "
    "'| eager MTP0 | 23.97 | 88.93 | 182.24 |' and '| graph MTP0 | 62.46 | 227.79 | 450.19 |' "
    "(output tok/s). Eager steps take 41.7, 45.0 and 43.9 ms whatever the batch (bound by "
    "launches); graph steps 16.0 ms, so the launches take 25.7-41.7 ms: 400-650 us a layer "
    "(64 layers, as Qwen3.5-27B; the source warns its eager run had other context limits).",
)
"""Where the prior of ``layer_overhead_eager_us`` comes from: the overlap of the two ranges
is 400-650 us, and the prior is its middle (525 us)."""


MAX_EFFICIENCY_MAGNITUDE = 1e7
"""Largest magnitude an efficiency parameter takes, from --set or a catalog file: none comes
near ten million in its unit (microseconds, nanoseconds, tokens or a share), and 1e308 made
every figure NaN or 80 digits long (bare NaN in --json, which is not JSON)."""


MIN_SHARE = 1e-3
"""Smallest value of an efficiency that is a share of a peak (bandwidth, FLOP/s, a link;
each such field's lower bound): 0.1%, ten times below the smallest any hardware class or
engine sets (0.011). A share of 1e-300 from --set or a profile ran, and printed
throughputs of 1e-298 tok/s."""

MAX_POWER_EXPONENT = 3.0
"""Largest exponent of the power-limit scaling: dynamic power grows about as the cube of
the clock (f x V^2, the voltage following the clock), so the clock a power share allows
falls no faster than that share to the power 1/3, and no kernel's rate falls faster than
the share cubed. An exponent of 1e7 from --set divided by zero."""


class EfficiencyParams(BaseModel):
    """Named efficiency factors and overheads; units in each description."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # --- memory bandwidth
    bandwidth_efficiency: float = Field(
        0.80,
        ge=MIN_SHARE,
        le=1,
        description="Fraction of peak DRAM bandwidth dense GEMV/GEMM weight reads achieve",
    )
    moe_bandwidth_efficiency: float = Field(
        0.55,
        ge=MIN_SHARE,
        le=1,
        description="Fraction of peak bandwidth the fused-MoE kernels achieve reading routed "
        "expert weights (many small matrices per layer, so lower than dense reads)",
    )
    kv_bandwidth_efficiency: float = Field(
        0.70,
        ge=MIN_SHARE,
        le=1,
        description="Fraction of peak bandwidth attention kernels achieve reading KV cache",
    )
    attention_score_bytes: float = Field(
        20.0,
        ge=0,
        le=1000,
        description="Bytes each attention score (one query-key cell of one head and layer) "
        "moves through memory where attention runs without a fused kernel (llama.cpp "
        "without flash attention; physics/score_terms.py): written in F32 by the K x Q "
        "product (4), read and written by the soft-max (4 + 4), converted to F16 for the "
        "V product on CUDA (4 + 2) and read by it (2). Unused with fused attention",
    )
    mla_decode_row_tile: int = Field(
        1,
        ge=1,
        le=1024,
        description="Query rows an MLA decode kernel's MMA tile holds (the heads a GPU "
        "holds x the tokens a sequence decodes fill it; a partly empty tile costs what a "
        "full one does): 64 for FlashMLA on Hopper, so DeepSeek's 16 heads a GPU at TP 8 "
        "cost the FLOPs of 64. 1: no tile (the attention FLOPs as counted)",
    )
    triton_attention_kv_share: float = Field(
        1.0,
        ge=MIN_SHARE,
        le=1,
        description="Share of kv_bandwidth_efficiency an attention backend of Triton "
        "kernels reaches reading the KV cache, against the engine's default kernels "
        "(FlashInfer, FA3, trtllm-gen); set per engine from backend A/B benchmarks "
        "(physics/attention_backend.py). 1: no different",
    )
    elementwise_bandwidth_efficiency: float = Field(
        0.45,
        ge=MIN_SHARE,
        le=1,
        description="Fraction of peak DRAM bandwidth the layers' elementwise kernels "
        "(fused add-RMSNorm, SiLU-and-multiply, rotary, MoE sums) achieve at large token "
        "counts. Fitted to 0.45 on an H100's decode and prefill layers with the fused "
        "kernels vLLM's torch.compile generates (calibration/kernels/"
        "h100-sxm-fused-layers.json; its profiles time the add-RMSNorms at 0.66-0.71 of peak "
        "and SiLU-and-multiply at 0.40-0.46); other classes assume the same share",
    )
    # --- compute
    compute_efficiency: float = Field(
        0.60,
        ge=MIN_SHARE,
        le=1,
        description="Fraction of dense tensor peak decode-shaped GEMMs (up to 512 rows) "
        "achieve; larger ones approach prefill_compute_efficiency",
    )
    prefill_compute_efficiency: float | None = Field(
        None,
        ge=MIN_SHARE,
        le=1,
        description="Fraction of dense tensor peak GEMMs of 8,192 rows or more (prefill "
        "chunks) achieve; log-linear from compute_efficiency at 512 rows. None: no more than "
        "compute_efficiency (no measurement says more). Set per class from measured large "
        "matmuls: the best BF16 matmul reaches 80% of peak on H100 SXM, 86% on A100 SXM, 60% "
        "on MI300X (ml-engineering's MAMF table); a model's own shapes reach less",
    )
    roofline_sharpness: float = Field(
        3.0,
        ge=1,
        le=64,
        description="Exponent p of the smooth roofline (t_mem^p + t_flop^p)^(1/p) per kernel "
        "class: near the ridge point memory and compute overlap imperfectly (p = 3 costs a "
        "balanced kernel 26% more than the plain max; 64 and above is the max). Engineering "
        "prior; calibration decides",
    )
    moe_compute_efficiency: float | None = Field(
        None,
        ge=MIN_SHARE,
        le=1,
        description="Fraction of the format's dense tensor peak that the fused-MoE grouped "
        "expert GEMMs reach once compute-bound (they gather and scatter token rows per "
        "expert and run many small GEMMs, so they stay well below a dense GEMM's share). "
        "None: expert GEMMs run like dense ones (gemm_efficiency). Set per class from "
        "grouped-GEMM kernel benchmarks",
    )
    moe_compute_efficiency_8bit: float | None = Field(
        None,
        ge=MIN_SHARE,
        le=1,
        description="Fraction of the 8-bit (FP8/INT8) tensor peak that W8A8 experts' grouped "
        "GEMMs reach once compute-bound (the Triton fused-MoE kernel quantises each token "
        "group's activations and rescales per block in its inner loop, and gets far less of "
        "the doubled peak than a 16-bit kernel of the 16-bit one). None: "
        "moe_compute_efficiency. Set per class from fused-MoE timings at prefill batches",
    )
    moe_gemm_half_width: float | None = Field(
        None,
        gt=0,
        le=100_000,
        description="Per-GPU expert slice width (columns: the expert's intermediate size "
        "over the TP size, whole under expert parallelism) at which the grouped expert GEMMs "
        "reach half of moe_compute_efficiency: a slice of w columns runs at w / (w + this) of "
        "it, since narrow slices fill few output tiles and leave short main loops (TP 8 "
        "shards). None: no width term. Set per class and engine from fused-MoE timings",
    )
    moe_gemm_half_rows: float | None = Field(
        None,
        gt=0,
        le=100_000,
        description="Rows an expert gets (token-expert pairs over the experts touched) at "
        "which its grouped GEMM reaches half of its rate: m rows run at m / (m + this), the "
        "padding of partly filled row tiles and the per-expert pipeline fill. None: no rows "
        "term. Set per class and engine from fused-MoE timings",
    )
    block_fp8_gemm_tile_columns: float | None = Field(
        None,
        gt=0,
        le=100_000,
        description="Output columns one thread block of the engine's block-FP8 dense GEMM "
        "computes, for a checkpoint with block-scaled FP8 weights (Model.fp8_weight_block), "
        "where the kernel has one tile shape and splits neither K nor the batch (vLLM's "
        "CUTLASS SM90 blockwise kernel, 128 x 128): a GEMM of N columns and M rows runs "
        "ceil(N / this) x ceil(M / 128) blocks, one a multiprocessor (GPU.sm_count), so its "
        "weights stream at blocks / (multiprocessors x waves) of the bandwidth share. None: "
        "the kernels fill the GPU (split-K, swap-AB or DeepGEMM). Set per engine release",
    )
    moe_dequant_compute_efficiency: float | None = Field(
        None,
        ge=MIN_SHARE,
        le=1,
        description="Fraction of the 16-bit tensor peak that routed experts of a format this "
        "GPU has no tensor cores for (MXFP4 or NVFP4 on Hopper, FP8 on Ampere) reach in the "
        "MoE kernel that dequantises them in its inner loop (OpenAI's triton_kernels for "
        "gpt-oss on Hopper), in place of moe_compute_efficiency x weight_only_compute_factor. "
        "None: that product. Set per class and engine from fused-MoE timings",
    )
    moe_dequant_bandwidth_efficiency: float | None = Field(
        None,
        ge=MIN_SHARE,
        le=1,
        description="moe_bandwidth_efficiency for such experts (their packed weights and "
        "scales read and unpacked in the kernel). None: moe_bandwidth_efficiency",
    )
    weight_only_int8_gemm_efficiency: float | None = Field(
        None,
        ge=MIN_SHARE,
        le=1,
        description="Fraction of the GPU's int8 tensor peak that a weight-only format's dense "
        "GEMMs reach when the engine quantises their activations to 8 bits and multiplies "
        "on int8 tensor cores (llama.cpp's MMQ kernels on NVIDIA) instead of dequantising "
        "the weights to 16 bits. None, or a GPU without an int8 tensor rate: the 16-bit "
        "path (compute_efficiency x weight_only_compute_factor). Routed experts keep their "
        "own rate (moe_compute_efficiency). Set per engine and class from kernel benchmarks",
    )
    fp16_accumulate_speedup: float = Field(
        1.0,
        ge=1,
        le=4,
        description="How much faster than the catalog's 16-bit tensor peak (FP16 with FP32 "
        "accumulate) the engine's FP16 GEMMs run because they accumulate in FP16 (llama.cpp's "
        "cuBLAS path, CUBLAS_COMPUTE_16F), on a GPU whose FP16-accumulate rate is higher "
        "(GeForce: twice). Applies to FP16 weights on the 16-bit path, not to BF16 (cuBLAS "
        "accumulates BF16 in FP32) or the int8 path. 1: no such speedup",
    )
    attention_compute_efficiency: float = Field(
        0.45, ge=MIN_SHARE, le=1, description="Fraction of tensor peak prefill attention achieves"
    )
    linear_attention_compute_efficiency: float | None = Field(
        None,
        ge=MIN_SHARE,
        le=1,
        description="Fraction of the 16-bit tensor peak that the chunked Gated DeltaNet "
        "prefill kernels reach (FLA's Triton chain: cumsum, KKT, triangular solve, WY, "
        "state recurrence and output, mostly latency- and memory-bound), for the tokens "
        "a step processes beyond one per sequence. None: they run at the attention rate. "
        "Set per class from kernel benchmarks",
    )
    linear_attention_prefill_token_ns: float | None = Field(
        None,
        ge=0,
        description="Nanoseconds a chunked Gated DeltaNet prefill spends per token and "
        "layer whatever its heads: the state recurrence walks a sequence's 64-token chunks "
        "one after another, a latency chain that more heads run beside rather than behind. "
        "Added to the FLOPs at linear_attention_compute_efficiency (then the rate of each "
        "added head). None: 0. Set per class from kernel benchmarks",
    )
    linear_attention_state_bandwidth_efficiency: float | None = Field(
        None,
        ge=MIN_SHARE,
        le=1,
        description="Fraction of peak DRAM bandwidth at which the recurrent (decode and "
        "verify) linear-attention kernel streams each sequence's state, read once and "
        "written once per token a step: 8-column float32 tiles, one warp each. None: "
        "kv_bandwidth_efficiency. Set per class from kernel benchmarks",
    )
    weight_only_compute_factor: float = Field(
        0.75,
        ge=MIN_SHARE,
        le=1,
        description="Compute-rate multiplier for weight-only formats (W4A16, W8A16): "
        "dequantising in the GEMM costs ALU time when the step is compute-bound. Published "
        "kernel rates at prefill sizes span 0.5-1.0 of the 16-bit GEMM by kernel (Marlin on "
        "an H100 0.57-0.61, with FP8 weights 0.47-0.49; Marlin on an A100 about 0.9-1.0 by "
        "its paper; vLLM's legacy AWQ path the 16-bit GEMM plus a dequantisation pass); 0.75 "
        "lies inside it (docs/dev/weight-only-gemm-sources.md)",
    )
    non_native_bandwidth_factor: float = Field(
        0.90,
        ge=MIN_SHARE,
        le=1,
        description="Bandwidth-efficiency multiplier when a format has no native tensor-core "
        "path on this GPU and runs weight-only (e.g. FP8 through Marlin on Ampere)",
    )
    # --- MoE
    moe_routing_skew: float = Field(
        0.0,
        ge=0,
        le=3,
        description="Zipf exponent of expert popularity (0 = uniform routing); skew makes "
        "a batch touch fewer distinct experts",
    )
    l2_reuse_strength: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of the L2-resident part of a layer's touched expert bytes that "
        "is served from L2 instead of DRAM (0 = no L2 reuse; calibration decides)",
    )
    # --- overheads
    step_overhead_us: float = Field(
        400.0,
        ge=0,
        description="Fixed cost per engine step: scheduling, input preparation, sampling "
        "launch (microseconds)",
    )
    per_sequence_overhead_us: float = Field(
        12.0, ge=0, description="Per scheduled sequence per step: bookkeeping, sampling (us)"
    )
    async_host_overlap: float = Field(
        0.8,
        ge=0,
        le=1,
        description="With async scheduling, the share of the host's per-step work "
        "(scheduling, input preparation) that runs while the GPU executes the previous "
        "step (vLLM PR 19970, after NanoFlow); the rest (the sync on sampled tokens, output "
        "handling) stays serial. Engineering prior; calibration decides",
    )
    layer_overhead_graph_us: float = Field(
        20.0,
        ge=0,
        description="GPU-side gaps between one decoder layer's kernels per step, with or "
        "without CUDA graphs (us)",
    )
    layer_overhead_eager_us: float = Field(
        525.0,
        ge=0,
        description="CPU time to launch one decoder layer's kernels in eager mode (us); "
        "launches overlap the GPU's work, so a step takes the longer of the two. Prior: "
        "the overlap of two published eager-vs-graph decode measurements of vLLM-based "
        "servers (EAGER_LAUNCH_SOURCES), 400-650 us a layer",
    )
    layer_overhead_compiled_us: float = Field(
        80.0,
        ge=0,
        description="CPU time to launch one decoder layer's kernels for a step above the "
        "largest CUDA graph, which runs vLLM's torch.compile'd (fused) code without a graph "
        "(us); overlaps the GPU's work like eager launches. Engineering prior: no published "
        "figure separates it",
    )
    layer_overhead_eager_mla_us: float = Field(
        1350.0,
        ge=0,
        description="CPU time to launch one multi-head-latent-attention decoder layer's "
        "kernels in eager mode (us), in place of layer_overhead_eager_us: a DeepSeek-V3 "
        "layer launches several times a dense layer's kernels (MLA's low-rank projections "
        "and norms, an activation-quantisation kernel before each block-FP8 GEMM, grouped "
        "top-k routing, routed and shared experts). Prior: SGLang PR 12160's DeepSeek-V3 "
        "trace, an eager prefill forward of one new token at 82.6 ms against 23.1 ms in a "
        "CUDA graph, over 61 layers",
    )
    mla_attention_eager_us: float = Field(
        0.0,
        ge=0,
        description="CPU time to launch one MLA layer's attention op outside the CUDA "
        "graphs (us) in a step the graphs otherwise hold: vLLM V1's piecewise graphs "
        "(the default before 0.11) leave the attention op of every layer out of the graph "
        "and run it from Python; the launches overlap the GPU's work like eager ones. Set "
        "by the vLLM generations that ran piecewise decode (hardware_db/engines/vllm.yaml: "
        "216 us before 0.9, 149 us from it, vLLM PR 17668's profile); 0 where decode "
        "replays one full graph",
    )
    launch_overlap: float = Field(
        1.0,
        ge=0,
        le=1,
        description="How far eager kernel launches overlap the device's work: 1 = launches "
        "are asynchronous and run ahead (GPUs; a step takes the longer of the two), 0 = "
        "the dispatching thread runs each operator itself (the CPU backend; they add up)",
    )
    mla_layer_overhead_us: float = Field(
        0.0,
        ge=0,
        description="Extra GPU time per MLA decoder layer per step (us) in the first "
        "DeepSeek-V3/R1 kernel stacks (early 2025: Triton MLA decode with absorbed-weight "
        "bmms, unfused grouped top-k routing, an activation-quantisation kernel before "
        "each block-FP8 GEMM, Triton block-FP8 fused MoE), on top of the layer floor; set "
        "by the engine generations that ran them (hardware_db/engines/), 0 for current "
        "releases",
    )
    mla_layer_floor_share: float = Field(
        0.75,
        ge=0,
        le=5,
        description="The kernels a multi-head-latent-attention block runs beyond a GQA "
        "block's, as a share of the class's per-layer floor (layer_overhead_graph_us) an "
        "MLA layer pays more a step, inside CUDA graphs. Prior: InferenceX's profile of "
        "SGLang 0.5.9 decoding DeepSeek-R1 FP8 at TP8 on an H200 (issue 1004, 8 steps at "
        "16 clients): the MLA block runs 13 kernels a layer (fused q_a/kv_a, q_b and o "
        "GEMMs, two absorbed-weight bmms, three FP8 activation quantisations, two latent "
        "norms, RoPE, the latent-cache store, the attention) in 64.8 us, 16 us of it the "
        "weight and latent-KV reads the roofline counts; the other 48.8 us against the 22 "
        "us that a GQA block's 7 kernels take of a dense layer's 36 us floor "
        "(calibration/kernels/h100-sxm-fused-layers.json) is 27 us, 0.75 of the floor. "
        "0 in the first DeepSeek stacks, whose mla_layer_overhead_us holds it",
    )
    triton_attention_layer_us: float = Field(
        0.0,
        ge=0,
        description="Extra GPU time a Triton attention backend's decode costs an attention "
        "layer each step, us (its split-KV kernel and the reduction after it, where the "
        "default backend runs one kernel); set per engine from backend A/B benchmarks",
    )
    moe_layer_overhead_us: float = Field(
        15.0, ge=0, description="Extra per MoE layer per step: routing, token permutation (us)"
    )
    moe_replaced_ffn_floor_us: float = Field(
        0.0,
        ge=0,
        description="Part of layer_overhead_graph_us that a dense FFN's kernels (gate/up GEMM, "
        "SiLU-and-multiply, down GEMM) take beyond the router GEMM an MoE layer runs "
        "instead (us): an MoE layer's floor drops by it, and its fused-experts call's fixed "
        "cost (moe_layer_overhead_us) comes in its place. 0 where not measured",
    )
    moe_expert_overhead_us: float = Field(
        0.0,
        ge=0,
        description="GPU time per routed expert a step touches, per MoE layer, beyond its "
        "weight read (us): each touched expert's tiles fill and drain their pipelines, so "
        "many small expert slices (hundreds of experts, TP shards) read slower than a few "
        "large ones. 0 where no kernel timing sets it",
    )
    cuda_graph_max_tokens: int = Field(
        512,
        ge=0,
        description="Ceiling on vLLM's largest CUDA-graph capture size on this platform "
        "(tokens; 512, as vLLM 0.24 on every GPU, 1,024 on datacenter Blackwell from 0.28; 0 "
        "without CUDA graphs). The engine's "
        "max_num_seqs lowers it; steps above the largest captured size run eager "
        "(see physics/cuda_graphs.py)",
    )
    moe_padding_routed: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of CUDA-graph padding tokens that run through the MoE router "
        "and touch experts like real tokens (1 in vLLM by default; 0 with "
        "VLLM_MOE_SKIP_PADDING=1)",
    )
    # --- communication
    allreduce_efficiency: float = Field(
        0.70, ge=MIN_SHARE, le=1, description="Fraction of link bandwidth an all-reduce achieves"
    )
    allreduce_latency_us: float = Field(
        15.0, ge=0, description="Fixed cost of one all-reduce call (NCCL launch, sync) (us)"
    )
    allreduce_eager_launch_us: float = Field(
        30.0,
        ge=0,
        description="CPU time to launch each all-reduce in eager mode (PyTorch dispatch and "
        "NCCL launch; CUDA graphs capture it), overlapping the GPU's work like the layer "
        "launches (us)",
    )
    custom_allreduce_latency_us: float = Field(
        7.0,
        ge=0,
        description="Fixed cost of one one-shot custom all-reduce inside a CUDA graph on "
        "GPUs joined all-to-all (us). Prior: vLLM PR 37756, B300 'ca_1stage' 7-9 us for "
        "16-256 KiB; vLLM PR 24532, H100 TP=4 0.5 MB in 10 us; SGLang PR 2904, H100 TP 2-8 "
        "small messages 3.7-5.9 us (its kernel) and 8.7-11.8 us (vLLM's, without graphs)",
    )
    two_shot_allreduce_latency_us: float = Field(
        13.0,
        ge=0,
        description="Fixed cost of one two-shot custom or symmetric-memory all-reduce (us). "
        "Prior: vLLM PR 37756 (B300) symm_mem_multimem 13-15 us and ca_2stage 19-22 us for "
        "16-256 KiB; vLLM PR 24111 (H100 TP=6) multimem 0.5 MB in 13 us",
    )
    hop_latency_nvlink_us: float = Field(2.0, ge=0, description="Per ring hop over NVLink (us)")
    hop_latency_pcie_us: float = Field(6.0, ge=0, description="Per ring hop over PCIe (us)")
    sampler_logit_passes: float = Field(
        3.0,
        ge=0,
        le=20,
        description="Passes over the float32 logits per sampled position (vocab x 4 bytes "
        "each): the lm_head writes them, softmax/penalties and top-k/top-p read them. "
        "Negligible for one sequence, a few hundred microseconds a step for hundreds of "
        "sequences of a 150-250K vocabulary. Engineering prior",
    )
    host_read_efficiency: float = Field(
        0.88,
        ge=MIN_SHARE,
        le=1,
        description="Share of the host's measured read bandwidth (--host-memory-bandwidth, "
        "a hosts/ preset) that llama.cpp's CPU matrix-vector products reach streaming "
        "weights from system RAM (experts under --n-cpu-moe). Prior: llama.cpp issue 26484 "
        "(Raspberry Pi 5, 4 threads, five quantizations of one dense model) measured decode at "
        "84-91% of the board's 4-thread read-only bandwidth (11.59 GB/s); the median, 0.88. "
        "Chosen with the corpus's offload runs in view (calibration/priors_in_view.yaml)",
    )
    host_link_efficiency: float = Field(
        0.8,
        ge=MIN_SHARE,
        le=1,
        description="Share of the host-to-GPU link's per-direction bandwidth that copying "
        "experts kept in system RAM reaches (llama.cpp's op offload of a prompt's ubatch). "
        "Engineering prior (pinned copies over PCIe 4.0 x16 reach about 25 of 31.5 GB/s); "
        "calibration decides",
    )
    # --- disaggregated prefill and decode (physics/kv_transfer.py)
    kv_transfer_efficiency: float = Field(
        0.75,
        ge=MIN_SHARE,
        le=1,
        description="Share of the link's per-direction bandwidth that moving a prompt's KV "
        "from a prefill to a decode instance over RDMA (a NIC, or the PCIe link given as "
        "one) reaches. Prior: Mooncake's vLLM 1P1D runs (Qwen3-8B, H800, 8x ConnectX-7 RoCE) "
        "move 32,768 tokens' KV at '142.25' GB/s, '71.1%' of 200 GB/s, and its SGLang runs "
        "(H20-3e) at 164.3 GB/s, '82.2% bandwidth utilization'; NIXL over UCX reaches '85% "
        "of NIC line rate' (ai-dynamo/nixl PR 1647). Their middle",
    )
    kv_transfer_nvlink_efficiency: float = Field(
        0.11,
        ge=MIN_SHARE,
        le=1,
        description="The same share over NVLink inside one server, where a transfer is "
        "bound by its many small pages (a 16-token block of one layer is tens of KiB), not "
        "by the link. Prior: LMCache's PD benchmark post (2025-04-29): 'Dynamo's delay to "
        "transfer the KV cache of a 7500-token input through NVLink - 20ms, if page size is "
        "16 tokens - 8ms, if page size is 128 tokens' (Llama-3.1-8B, 983 MB: 49 GB/s of an "
        "H100's 450 at vLLM's default 16-token blocks)",
    )
    kv_transfer_latency_ms: float = Field(
        1.0,
        ge=0,
        description="Fixed cost of one request's KV transfer (ms): the transfer's setup and "
        "the decode side's notice that it is done. Prior: the intercepts of transfer time "
        "against size in Mooncake's 1P1D tables, about 0.5 ms (vLLM, H800) and 1.7 ms "
        "(SGLang, H20-3e). The decode server's own front end (frontend_request_ms and "
        "tokenizing the prompt again) is added apart",
    )
    # --- front end (API server, tokenizer, streaming)
    frontend_request_ms: float = Field(
        10.0,
        ge=0,
        description="Latency a request spends outside the engine's steps, per request (ms): "
        "HTTP and request validation in the API server, chat-template rendering, the hop to "
        "the engine core, detokenising and streaming the first chunk. Added to TTFT and "
        "end-to-end latency. Engineering prior (per engine in hardware_db/engines/)",
    )
    api_server_ms_per_request: float = Field(
        0.0,
        ge=0,
        description="CPU time the API server spends on each request in series (ms), a part "
        "of frontend_request_ms: vLLM's API server is one process, so its per-request work "
        "(parsing, template, tokenising, setting up the output stream) is done one request at "
        "a time and requests that arrive together queue for it before reaching the engine; "
        "one request alone sees only frontend_request_ms (which caps it). 0: not modelled "
        "(no source measures it on GPU servers); calibration fits it where TTFT grows with a burst",
    )
    api_server_us_per_stream_chunk: float = Field(
        0.0,
        ge=0,
        description="CPU time the API server spends on one streamed chunk of one request "
        "(us): receiving the engine's output, detokenising, building and sending the SSE "
        "event. One API-server process serves every stream in turn, so a client sees its "
        "last token, and its next request reaches the engine, about one round over the "
        "running streams later (streams x this). Per engine (hardware_db/engines/); 0: not "
        "modelled",
    )
    tokenize_us_per_token: float = Field(
        1.0,
        ge=0,
        description="Tokenizer time per prompt token before the request reaches the "
        "engine (us; a Rust fast tokenizer encodes on the order of a million tokens a "
        "second on one core). Added to TTFT and end-to-end latency, and serial: vLLM's API "
        "server tokenizes on a one-thread executor (vLLM issue 25301), so requests that "
        "arrive together reach the engine a tokenization apart",
    )
    # --- power
    compute_power_exponent: float = Field(
        0.8,
        ge=0,
        le=MAX_POWER_EXPONENT,
        description="Compute scales as (power_limit / TDP) ** exponent below TDP",
    )
    bandwidth_power_exponent: float = Field(
        0.2,
        ge=0,
        le=MAX_POWER_EXPONENT,
        description="Achieved bandwidth scales as (power_limit / TDP) ** exponent below TDP",
    )
    # --- speculative decoding
    drafter_layer_cost: float = Field(
        1.0,
        ge=0,
        description="Cost of one MTP/EAGLE drafting pass in decoder-layer equivalents "
        "(plus its lm_head)",
    )
    ngram_lookup_us: float = Field(
        20.0, ge=0, description="CPU cost of n-gram drafting per sequence per step (us)"
    )

    groups: dict[str, list[str]] = Field(
        default_factory=lambda: {
            "bandwidth": [
                "bandwidth_efficiency",
                "moe_bandwidth_efficiency",
                "moe_dequant_bandwidth_efficiency",
                "block_fp8_gemm_tile_columns",
                "kv_bandwidth_efficiency",
                "linear_attention_state_bandwidth_efficiency",
                "elementwise_bandwidth_efficiency",
                "non_native_bandwidth_factor",
                "triton_attention_kv_share",
            ],
            "compute": [
                "compute_efficiency",
                "prefill_compute_efficiency",
                "moe_compute_efficiency",
                "moe_compute_efficiency_8bit",
                "moe_gemm_half_width",
                "moe_gemm_half_rows",
                "moe_dequant_compute_efficiency",
                "roofline_sharpness",
                "attention_compute_efficiency",
                "linear_attention_compute_efficiency",
                "linear_attention_prefill_token_ns",
                "mla_decode_row_tile",
                "weight_only_compute_factor",
                "weight_only_int8_gemm_efficiency",
                "fp16_accumulate_speedup",
            ],
            "moe": ["moe_routing_skew", "l2_reuse_strength"],
            "frontend": [
                "frontend_request_ms",
                "api_server_ms_per_request",
                "api_server_us_per_stream_chunk",
                "tokenize_us_per_token",
            ],
            "overhead": [
                "step_overhead_us",
                "per_sequence_overhead_us",
                "async_host_overlap",
                "layer_overhead_graph_us",
                "layer_overhead_eager_us",
                "layer_overhead_eager_mla_us",
                "layer_overhead_compiled_us",
                "launch_overlap",
                "moe_layer_overhead_us",
                "moe_expert_overhead_us",
                "moe_replaced_ffn_floor_us",
                "triton_attention_layer_us",
            ],
            "communication": [
                "allreduce_efficiency",
                "allreduce_latency_us",
                "allreduce_eager_launch_us",
                "custom_allreduce_latency_us",
                "two_shot_allreduce_latency_us",
                "hop_latency_nvlink_us",
                "hop_latency_pcie_us",
            ],
            "disaggregation": [
                "kv_transfer_efficiency",
                "kv_transfer_nvlink_efficiency",
                "kv_transfer_latency_ms",
            ],
            "power": ["compute_power_exponent", "bandwidth_power_exponent"],
            "speculation": ["drafter_layer_cost", "ngram_lookup_us"],
        },
        description="Parameter groups for calibration (not a physical parameter)",
    )

    def with_overrides(self, overrides: dict[str, float]) -> EfficiencyParams:
        """A copy with some parameters replaced (validated)."""
        unknown = sorted(set(overrides) - set(type(self).model_fields) - {"groups"}, key=str)
        if unknown:
            raise ValueError(f"unknown efficiency parameter(s): {unknown}")
        for name, value in overrides.items():
            if isinstance(value, bool):  # pydantic reads True as 1.0
                raise ValueError(f"{name} is {value}: an efficiency parameter is a number")
            if isinstance(value, int | float) and not abs(value) <= MAX_EFFICIENCY_MAGNITUDE:
                raise ValueError(
                    f"{name} is {value!r}; an efficiency parameter is a finite number of at "
                    f"most {MAX_EFFICIENCY_MAGNITUDE:,.0f} in its unit"
                )
        return type(self).model_validate({**self.model_dump(), **overrides})


def override_problem(overrides: dict) -> tuple[str, list[str]] | None:
    """What is wrong with efficiency ``overrides`` laid over the defaults (an unknown name,
    a boolean, a value outside the parameter's range, NaN), as (a line naming the
    parameter and its limit, close names for an unknown one), or None."""
    from pydantic import ValidationError

    from capsim.errors import close_matches

    known = [n for n in EfficiencyParams.model_fields if n != "groups"]
    for name in overrides:
        if name not in known:
            close = close_matches(name, known) if isinstance(name, str) else []
            return f"unknown efficiency parameter {name!r}", close
    try:
        EfficiencyParams().with_overrides(overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        msg = first["msg"][:1].lower() + first["msg"][1:]
        return f"{first['loc'][0]}={first['input']!r}: {msg}", []
    except ValueError as exc:
        return str(exc), []
    return None
