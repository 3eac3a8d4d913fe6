"""How a model is served (parallelism, formats, power, engine options) and the efficiency
priors a deployment starts from: what the step-time model (physics/step.py) is built for."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from capsim.catalog.engine_schema import Engine
from capsim.catalog.gpu_schema import GPU
from capsim.catalog.loader import Catalog
from capsim.catalog.model_schema import QuantFormat
from capsim.physics.efficiency import EfficiencyParams
from capsim.physics.speculative import SpecConfig
from capsim.physics.tensor_throttle import throttle_ratio, throttled


class Deployment(BaseModel):
    """How a model is served: parallelism, formats, power and engine options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp: int = Field(1, ge=1, description="Tensor-parallel size (GPUs per replica)")
    quant: str | None = Field(None, description="Weight format; None = the model's release")
    weight_only: bool = Field(
        False,
        description="The engine multiplies this format's dequantised weights with 16-bit "
        "activations (Engine.weight_only_formats), whatever tensor cores the GPU has",
    )
    kv_dtype: str = Field("auto", description="KV cache dtype")
    power_limit_w: float | None = Field(None, gt=0, description="Board power cap, W")
    interconnect: str = Field("auto", description="auto, nvlink, pcie or infinity-fabric")
    custom_allreduce: bool = Field(
        True, description="False = --disable-custom-all-reduce (NCCL for every all-reduce)"
    )
    async_scheduling: bool = Field(
        True,
        description="The engine schedules step n+1 while the GPU runs step n (vLLM's "
        "default since PR 27614; with EAGLE/MTP since PR 31998). Has no effect in eager "
        "mode or with n-gram or draft-model speculation, where vLLM runs it serially",
    )
    cuda_graphs: bool = Field(True, description="False = --enforce-eager")
    max_num_seqs: int = Field(
        256, ge=1, description="The engine's sequence limit (sets its CUDA-graph sizes)"
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="The engine's token budget (caps its CUDA-graph sizes)"
    )
    spec: SpecConfig | None = None
    engine: str = Field("vllm", description="The serving engine (hardware_db/engines/)")
    graph_capture: str = Field(
        "vllm", description="The engine's CUDA-graph sizes: vllm, sglang, single-token, none"
    )
    cuda_graph_max_batch: int | None = Field(
        None, ge=0, description="Largest batch the engine captures a graph for (SGLang)"
    )
    eager_outside_graphs: bool = Field(
        False,
        description="Steps no CUDA graph holds run PyTorch operator by operator (SGLang, "
        "vLLM V0); False: compiled code (vLLM V1's torch.compile, llama.cpp)",
    )
    cpu_moe_layers: int = Field(
        0,
        ge=0,
        description="MoE layers whose routed experts stay in system RAM (llama.cpp's "
        "--n-cpu-moe N: the first N layers)",
    )
    host_memory_bandwidth_gbs: float | None = Field(
        None, gt=0, description="System RAM read bandwidth the CPU reaches, GB/s (measured)"
    )
    weights_in_host_share: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Share of the weights vLLM/SGLang keep in pinned system RAM "
        "(--cpu-offload-gb over the weights a GPU would hold): every pass reads that share "
        "of what it reads over the host link instead of from GPU memory",
    )
    host_link_gbs: float | None = Field(
        None,
        gt=0,
        description="Host-to-GPU link, GB/s per direction; None: the GPU's PCIe link",
    )
    expert_parallel: bool = Field(
        False,
        description="Routed experts split whole over the TP group, num_experts / tp a GPU "
        "(vLLM's --enable-expert-parallel; SGLang's --ep-size equal to --tp), instead of a "
        "1/tp slice of every expert on each GPU",
    )
    ubatch_tokens: int | None = Field(
        None,
        ge=1,
        description="Physical batch, tokens: a larger step runs as several passes, each "
        "reading the weights (llama.cpp's n_ubatch); None = one pass",
    )
    pp: int = Field(
        1,
        ge=1,
        description="Pipeline stages (--pipeline-parallel-size), each a TP group holding its "
        "share of the layers; a step passes them all (physics/pipeline.py)",
    )
    dp_attention: int = Field(
        1,
        ge=1,
        description="Data-parallel attention ranks inside the TP group (SGLang's "
        "--enable-dp-attention with --dp-size N): each rank of tp / N GPUs runs attention "
        "for its own share of the sequences, with its own KV cache and the attention "
        "weights split over its tp / N GPUs only; the MLP and MoE layers stay split over "
        "all tp GPUs. 1: plain tensor parallelism",
    )

    dense_in_ranks: bool = Field(
        False,
        description="With data-parallel attention: the dense MLP layers and shared experts "
        "are whole on each rank too (vLLM's --data-parallel-size with "
        "--enable-expert-parallel); False: split over the TP group (SGLang's)",
    )
    attention_backend: str | None = Field(
        None,
        description="The attention backend asked for (SGLang's and vLLM's "
        "--attention-backend); None: the engine's choice for the model "
        "(physics/attention_backend.py)",
    )
    flash_attention: bool = Field(
        True,
        description="Whether attention runs fused kernels that keep the scores on chip; "
        "False: llama.cpp without flash attention (-fa off, the default of its builds "
        "before b6327), whose scores go through memory (physics/score_terms.py)",
    )
    triton_attention: bool = Field(
        False,
        description="Whether the step's attention runs a Triton backend's kernels (resolved "
        "from attention_backend and the engine's defaults by build_step_model)",
    )

    @property
    def attention_tp(self) -> int:
        """GPUs one attention rank splits its heads over: tp / dp_attention."""
        return self.tp // self.dp_attention


def default_efficiency(
    gpu: GPU, catalog: Catalog | None = None, engine: Engine | None = None
) -> EfficiencyParams:
    """Generic efficiency parameters overlaid with the GPU's hardware-class file, then what
    was measured on the GPU itself (its YAML's ``efficiency``), then the serving engine's
    priors for that class (hardware_db/engines/). The class's and the engine's compute
    efficiencies, measured on the class's reference GPU, are rescaled to a GPU whose tensor
    cores are throttled against its other units (physics/tensor_throttle.py); the ones
    measured on the GPU itself are kept."""
    params = EfficiencyParams()
    if catalog is not None and gpu.hardware_class in catalog.efficiency.entries:
        where = catalog.efficiency.origin.get(gpu.hardware_class), "params"
        params = _laid_over(params, catalog.efficiency.entries[gpu.hardware_class].params, where)
    if gpu.efficiency:
        where = (catalog.gpus.origin.get(gpu.name) if catalog else None), "efficiency"
        params = _laid_over(params, gpu.efficiency, where)
    if engine is not None:
        engine.check_backend_runs_on(gpu.vendor)
        extra = engine.efficiency_overrides(gpu.hardware_class)
        if extra:
            where = (catalog.engines.origin.get(engine.name) if catalog else None), "params"
            params = _laid_over(params, extra, where)
    ratio = tensor_throttle_ratio(gpu, catalog)
    if ratio is not None and ratio != 1.0:
        params = throttled(params, ratio, keep=set(gpu.efficiency))
    return params


def tensor_throttle_ratio(gpu: GPU, catalog: Catalog | None) -> float | None:
    """The GPU's tensor-to-vector balance over its class reference's (physics/
    tensor_throttle.py): None where the class names no reference or a rate is unknown."""
    if catalog is None or gpu.hardware_class not in catalog.efficiency.entries:
        return None
    reference = catalog.efficiency.entries[gpu.hardware_class].reference_gpu
    if reference is None or reference not in catalog.gpus.entries:
        return None
    return throttle_ratio(gpu, catalog.gpus.entries[reference])


def _laid_over(params: EfficiencyParams, overrides: dict, where: tuple) -> EfficiencyParams:
    """``params.with_overrides(overrides)``; a value it refuses is a catalog error naming
    the file that set it (``where``: its path, or None, and the field) and the problem (an
    unknown name or a value out of range was a ValueError traceback, issue 47)."""
    try:
        return params.with_overrides(overrides)
    except ValueError as exc:
        from capsim.errors import CatalogError, close_matches

        path, field = where
        errors = getattr(exc, "errors", None)
        if errors:
            first = errors()[0]
            name = ".".join(str(p) for p in first["loc"])
            problem = f"{name}: {first['msg'][:1].lower() + first['msg'][1:]}"
        else:
            problem = str(exc)
        known = [n for n in EfficiencyParams.model_fields if n != "groups"]
        unknown = [k for k in overrides if k not in known]
        raise CatalogError(
            f"{path or 'the catalog'}: {field}: {problem}",
            hint='the parameters and their units: capsim explain --json ("efficiency")',
            suggestions=close_matches(unknown[0], known) if unknown else (),
        ) from None


def compute_dtype_for(gpu: GPU, fmt: QuantFormat) -> tuple[str, bool]:
    """(tensor dtype the GEMMs run in, whether the format runs natively on this GPU).

    A weight-only format (W4A16) computes in 16-bit. A W8A8/FP4 format whose compute type
    the GPU lacks falls back to weight-only dequantisation into 16-bit (vLLM's Marlin path
    for FP8 on Ampere), which is 'not native'.
    """
    sixteen = "bf16" if gpu.tensor_tflops.bf16 else "fp16"
    if fmt.weight_only:
        return sixteen, True
    wanted = fmt.compute_dtype
    if wanted in gpu.native_formats and getattr(gpu.tensor_tflops, wanted, None):
        return wanted, True
    return sixteen, wanted in ("bf16", "fp16")
