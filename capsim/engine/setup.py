"""A deployment made ready to simulate (``Setup``): the model, format and parameters
resolved, the memory fit, the engine's limits and flags, the step-time model."""

from __future__ import annotations

from dataclasses import dataclass

from capsim.catalog.engine_schema import Engine, formats_hold
from capsim.catalog.gpu_schema import GPU
from capsim.catalog.loader import Catalog, load_catalog
from capsim.catalog.model_schema import Model, QuantFormat
from capsim.catalog.resolve import looks_like_model_reference, resolve_into
from capsim.engine.config import PredictConfig
from capsim.engine.disaggregated_setup import decode_replicas, with_prefill_pool
from capsim.engine.flag_checks import (
    check_deployment_flags,
    check_token_budget,
    sglang_flag_error,
)
from capsim.engine.scheduler import SchedulerConfig
from capsim.errors import CapsimUserError
from capsim.physics.deployment import Deployment, default_efficiency
from capsim.physics.drafter_memory import drafter_for
from capsim.physics.efficiency import EfficiencyParams
from capsim.physics.kv_layout import BLOCK_SIZE_TOKENS
from capsim.physics.kv_transfer import KVTransfer
from capsim.physics.memory import (
    AUTO_FORMAT_ORDER,
    MemoryFit,
    auto_format,
    check_attention_split,
    fit_hint,
    memory_fit,
    require_fit,
)
from capsim.physics.speculative import SpecConfig
from capsim.physics.step import StepModel, build_step_model


@dataclass
class Setup:
    """A deployment ready to simulate: physics, memory fit and engine limits."""

    config: PredictConfig
    gpu: GPU
    model: Model
    fmt: QuantFormat
    step_model: StepModel
    fit: MemoryFit
    scheduler: SchedulerConfig
    num_blocks: int
    dp: int
    max_model_len: int
    quant_reason: str = ""
    profile: object = None  # the calibration Profile applied, if any
    base_params: EfficiencyParams | None = None  # before overrides: what a worker is given
    engine_generation: str | None = None  # the older release's generation simulated, if any
    # disaggregated prefill (config.prefill_replicas > 0): the prefill instances' own
    # deployment, and the KV transfer from them to the decode replicas (dp of them)
    prefill: Setup | None = None
    kv_transfer: KVTransfer | None = None
    kv_transfer_handoff: str | None = None  # Engine.disaggregation_handoff

    @property
    def engines(self) -> int:
        """Engines the replicas run as: a replica of pp pipeline stages keeps pp batches
        in flight, simulated as pp engines sharing its KV cache (physics/pipeline.py)."""
        return self.dp * self.config.pp

    @property
    def instances(self) -> int:
        """Engine instances that run steps: the replicas' engines, and the prefill
        instances."""
        return self.engines + (self.config.prefill_replicas if self.prefill is not None else 0)

    @property
    def gpus(self) -> int:
        """GPUs of the whole deployment."""
        gpus = self.dp * self.config.tp * self.config.pp
        if self.prefill is not None:
            gpus += self.config.prefill_replicas * self.prefill.config.tp
        return gpus


def loadable_formats(cat: Catalog, engine: Engine | None) -> dict[str, QuantFormat]:
    """The catalog's weight formats that ``engine`` loads (every one where it states none,
    or with no engine), by name."""
    formats = cat.quant_formats.entries
    if engine is None or engine.weight_formats is None:
        return formats
    return {k: v for k, v in formats.items() if engine.loads(k)}


def refuse_unloadable(
    engine: Engine | None, fmt: QuantFormat, engines: list[Engine] | tuple = ()
) -> None:
    """A CapsimUserError (exit 2) when ``engine`` does not load checkpoints in ``fmt``
    (llama.cpp and an AWQ checkpoint), naming those of ``engines`` (the catalog's) that
    do, and the engine's own older releases that did (vLLM and GGUF before 0.24)."""
    if engine is None or engine.loads(fmt.name):
        return
    takers = [e.name for e in engines if e.name != engine.name and e.loads(fmt.name)]
    where = f"--engine {' or '.join(takers)}" if takers else "another --engine"
    older = [  # the newest release: its older ones that loaded the format
        gen.versions
        for gen in (engine.generations if engine.version is None else ())
        if gen.weight_formats and formats_hold(gen.weight_formats, fmt.name)
    ]
    if older:
        where += f" (or --engine {engine.name}@VERSION of a release {' or '.join(older)})"
    raise CapsimUserError(
        f"{engine.name} does not load {fmt.name} checkpoints (it loads "
        f"{', '.join(engine.weight_formats or [])})",
        hint=f"pick a format it loads with --quant (capsim quants), or {where} for {fmt.name}",
    )


def resolve_format(
    cat: Catalog,
    gpu: GPU,
    model: Model,
    quant: str | None,
    tp: int,
    engine: Engine | None = None,
    **fit_options,
) -> tuple[QuantFormat, str, MemoryFit]:
    """The weight format a deployment runs (``quant``, or with None or "auto" the release
    format if it fits, else the first that does), why, and its memory fit
    (``fit_options`` as memory_fit's)."""
    if quant in (None, "auto"):
        check_attention_split(model, tp, fit_options.get("dp_attention", 1))
        order = AUTO_FORMAT_ORDER
        if engine is not None and engine.auto_formats is not None:
            order = tuple(engine.auto_formats)
        formats = loadable_formats(cat, engine)
        fmt, reason = auto_format(gpu, model, formats, tp, order, **fit_options)
    else:
        fmt, reason = cat.quant(quant), "as requested"
        refuse_unloadable(engine, fmt, cat.engines)
    return fmt, reason, memory_fit(gpu, model, fmt, tp=tp, **fit_options)


OFFLINE_OVERRIDES = {
    "frontend_request_ms": 0.0,
    "api_server_ms_per_request": 0.0,
    "tokenize_us_per_token": 0.0,
}
"""What an offline run (no API server) sets: no front-end latency."""


def resolve_params(
    cat: Catalog,
    gpu: GPU,
    overrides: dict[str, float | None] | None = None,
    params: EfficiencyParams | None = None,
    engine: Engine | None = None,
    offline: bool = False,
    profile=None,
) -> EfficiencyParams:
    """The efficiency parameters a prediction uses: ``params`` if given, else the
    calibration ``profile``'s (a Profile, resolved by the calibration layer), else the
    class defaults with the engine's priors laid over them; ``overrides`` laid over
    whichever it was, and with ``offline`` no front-end latency."""
    if params is None and profile is not None:
        params = profile.params(cat, gpu.name, engine)
    params = params or default_efficiency(gpu, cat, engine)
    if overrides:
        params = params.with_overrides(overrides)
    if offline:
        params = params.with_overrides(OFFLINE_OVERRIDES)
    return params


def engine_deployment(
    engine: Engine,
    gpu: GPU,
    *,
    tp: int,
    quant: str,
    kv_dtype: str = "auto",
    power_limit_w: float | None = None,
    interconnect: str = "auto",
    enforce_eager: bool = False,
    spec: SpecConfig | None = None,
    async_scheduling: bool | None = None,
    custom_allreduce: bool | None = None,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int | None = None,
    ubatch_tokens: int | None = None,
    cpu_moe_layers: int = 0,
    host_memory_bandwidth_gbs: float | None = None,
    host_link_gbs: float | None = None,
    expert_parallel: bool = False,
    dp_attention: int = 1,
    pp: int = 1,
    weights_in_host_share: float = 0.0,
    dense_in_ranks: bool = False,
    attention_backend: str | None = None,
    flash_attention: bool | None = None,
) -> Deployment:
    """The Deployment of a model served by ``engine`` on a TP group of ``gpu``: its CUDA-
    graph scheme and sizes, physical batch, and the async-scheduling and custom-all-reduce
    defaults the flags (None) leave to it."""
    row = engine.batch_limits(gpu.name, gpu.memory_gb)
    graph_batch = row.cuda_graph_max_batch
    if tp >= 4 and row.cuda_graph_max_batch_tp4 is not None:
        graph_batch = row.cuda_graph_max_batch_tp4
    return Deployment(
        tp=tp,
        quant=quant,
        weight_only=quant in engine.weight_only_formats,
        kv_dtype=kv_dtype,
        power_limit_w=power_limit_w,
        interconnect=interconnect,
        cuda_graphs=not enforce_eager,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        spec=spec,
        async_scheduling=engine.async_scheduling if async_scheduling is None else async_scheduling,
        custom_allreduce=engine.custom_allreduce if custom_allreduce is None else custom_allreduce,
        engine=engine.name,
        graph_capture=engine.graph_capture,
        cuda_graph_max_batch=graph_batch,
        eager_outside_graphs=engine.outside_graphs == "eager",
        ubatch_tokens=ubatch_tokens or engine.ubatch_tokens,
        cpu_moe_layers=cpu_moe_layers,
        host_memory_bandwidth_gbs=host_memory_bandwidth_gbs,
        host_link_gbs=host_link_gbs,
        expert_parallel=expert_parallel,
        dp_attention=dp_attention,
        pp=pp,
        weights_in_host_share=weights_in_host_share,
        dense_in_ranks=dense_in_ranks,
        attention_backend=attention_backend,
        flash_attention=engine.flash_attention if flash_attention is None else flash_attention,
    )


def dense_in_ranks(config: PredictConfig, engine: str) -> bool:
    """Whether a deployment's attention ranks hold the dense layers and shared experts
    whole: vLLM's data parallelism with expert parallelism (each DP rank a model replica
    but for the routed experts); SGLang's DP attention splits them over the group."""
    return engine == "vllm" and config.dp_attention > 1


def host_kv_blocks(config: PredictConfig, fit: MemoryFit, device_blocks: int) -> int:
    """Blocks of a replica's KV tier in system RAM: vLLM's --kv-offloading-size GiB over
    the KV bytes a block takes on all of its GPUs (vLLM sums the size over the TP ranks);
    SGLang's HiCache --hicache-size GB a GPU over one GPU's bytes a block, else
    --hicache-ratio times the ``device_blocks`` ("the ratio of the size of host KV cache
    memory pool to the size of device pool", Mooncake's HiCache docs)."""
    block_bytes = BLOCK_SIZE_TOKENS * fit.kv_bytes_per_token
    if config.kv_offloading_gb:
        return int(config.kv_offloading_gb * 2**30 // (block_bytes * config.tp))
    if config.hierarchical_cache:
        if config.hicache_size_gb:
            return int(config.hicache_size_gb * 1e9 // block_bytes)
        return int(config.hicache_ratio * device_blocks)
    return 0


def weights_in_host_share(fit: MemoryFit) -> float:
    """Share of a GPU's weights --cpu-offload-gb keeps in system RAM."""
    kept = fit.weights_in_system_ram_bytes
    total = kept + fit.weight_bytes
    return min(kept / total, 0.999999) if total and kept else 0.0


def engine_fit_options(
    engine: Engine,
    gpu: GPU,
    prefix_caching: bool = True,
    async_scheduling: bool | None = None,
    **options,
) -> dict:
    """memory_fit options with the engine's defaults where ``options`` leave them None:
    its memory share, its default token budget and sequence limit for this GPU, and where
    it keeps hybrid models' recurrent state (a state pool of its own holds one slot per
    request without prefix caching, and with it as many as the engine keeps with its
    overlap scheduler on or, ``async_scheduling`` False, off; None: the engine's default)."""
    if options.get("cpu_moe_layers") and engine.name != "llama.cpp":
        raise CapsimUserError(
            f"--n-cpu-moe is llama.cpp's (experts of the first N MoE layers in system RAM), "
            f"not {engine.name}'s",
            hint="add --engine llama.cpp (vLLM's and SGLang's own is --cpu-offload-gb G)",
        )
    vllm_dp_ep = engine.name == "vllm" and options.get("expert_parallel")
    if options.get("dp_attention", 1) > 1 and engine.name != "sglang" and not vllm_dp_ep:
        raise CapsimUserError(
            f"--enable-dp-attention is SGLang's (attention data-parallel inside the TP "
            f"group), not {engine.name}'s",
            hint="add --engine sglang"
            + (
                " (vLLM's own is --data-parallel-size N with --enable-expert-parallel)"
                if engine.name == "vllm"
                else ""
            ),
        )
    row = engine.batch_limits(gpu.name, gpu.memory_gb)
    if engine.name == "vllm":
        check_token_budget(
            options.get("max_num_batched_tokens") or row.max_num_batched_tokens,
            options.get("max_num_seqs") or row.max_num_seqs,
            given_seqs=options.get("max_num_seqs") is not None,
        )
    options.pop("expert_parallel", None)
    utilization = options.pop("gpu_memory_utilization", None)
    pool = engine.state_pool
    slots = pool.slots_per_sequence
    overlap = engine.async_scheduling if async_scheduling is None else async_scheduling
    if not overlap and pool.slots_per_sequence_without_overlap is not None:
        slots = pool.slots_per_sequence_without_overlap
    return dict(
        options,
        gpu_memory_utilization=engine.memory_utilization if utilization is None else utilization,
        default_limits=(row.max_num_batched_tokens, row.max_num_seqs),
        state_layout=pool.layout,
        state_share=pool.state_share,
        state_slots_per_sequence=slots if prefix_caching else 1,
        sliding_window_pool=engine.sliding_window_pool,
        sliding_window_pages=engine.sliding_window_pages,
    )


def vllm_data_parallel_experts(config: PredictConfig, model: Model, engine: str) -> PredictConfig:
    """vLLM's --data-parallel-size N with --enable-expert-parallel on an MoE model: one
    expert-parallel group of tp x N GPUs whose attention runs in N data-parallel ranks of
    --tp GPUs (vLLM: "the expert parallel size is TP x DP"; each DP rank has its own
    scheduler and KV cache), simulated as data-parallel attention inside a TP group of tp x
    N GPUs. Other configurations come back as they are."""
    if engine != "vllm" or not config.expert_parallel or model.moe is None:
        return config
    if config.dp_attention > 1 or config.prefill_replicas:
        return config
    ranks = replica_count(config)
    if config.dp is not None and config.gpus is not None and config.dp != ranks:
        raise CapsimUserError(
            f"--gpus {config.gpus} holds {ranks} data-parallel rank(s) of --tp {config.tp}, "
            f"not the --data-parallel-size {config.dp} given with --enable-expert-parallel",
            hint=f"--gpus {config.tp * config.dp}, or leave --gpus out",
        )
    if ranks < 2:
        return config
    group = config.tp * ranks
    if group > MAX_EP_GROUP_IN_A_SERVER:
        raise CapsimUserError(
            f"--data-parallel-size {ranks} with --enable-expert-parallel makes one "
            f"expert-parallel group of {group} GPUs, beyond one server's "
            f"{MAX_EP_GROUP_IN_A_SERVER}: expert parallelism across servers (all-to-all over "
            "the network) is not modelled",
            hint=f"at most {MAX_EP_GROUP_IN_A_SERVER // config.tp} ranks of --tp {config.tp}, "
            "or replicas without --enable-expert-parallel",
        )
    return config.model_copy(update={"tp": group, "dp_attention": ranks, "dp": None, "gpus": None})


MAX_EP_GROUP_IN_A_SERVER = 8
"""The most GPUs one expert-parallel group spans here: one 8-GPU server (HGX boards join 8
through NVSwitch, and the largest PCIe servers hold 8); beyond it vLLM's dispatch and
combine run all-to-all over the network (DeepEP, pplx), which capsim does not model."""


def replica_count(config: PredictConfig) -> int:
    """The data-parallel replicas a configuration serves with: --gpus over --tp where
    --gpus is given, else --dp (1 without either); disaggregated, its decode replicas."""
    if config.prefill_replicas:
        return decode_replicas(config)
    group = config.tp * config.pp
    return config.gpus // group if config.gpus is not None else (config.dp or 1)


def build_setup(
    config: PredictConfig,
    catalog: Catalog | None = None,
    params: EfficiencyParams | None = None,
    profile=None,
) -> Setup:
    """Resolve names, fit memory and build the step model; reject what vLLM would reject.

    ``params`` replaces the GPU's default efficiency parameters, else the calibration
    ``profile``'s do (a Profile the calibration layer resolved from ``config.profile``;
    the engine does not look profiles up); ``config.efficiency_overrides`` then apply on
    top."""
    cat = catalog or load_catalog()
    if cat.models.find(config.model) is None and looks_like_model_reference(config.model):
        cat, resolved = resolve_into(cat, [config.model])
        config = config.model_copy(update={"model": resolved[0].name})
    gpu = cat.gpu(config.gpu)
    model = cat.model(config.model)
    config = vllm_data_parallel_experts(config, model, cat.engine(config.engine).name)
    tp = config.tp
    dp = replica_count(config)
    if config.gpus is not None:
        group = tp * config.pp
        if config.gpus % group and not config.prefill_replicas:
            what = (
                f"--tp {tp}"
                if config.pp == 1
                else f"--tp {tp} x --pipeline-parallel-size {config.pp}"
            )
            raise CapsimUserError(
                f"--gpus {config.gpus} is not a multiple of {what}",
                hint=f"each data-parallel replica is {group} GPUs",
            )
        if config.dp is not None and config.dp != dp:
            raise CapsimUserError(
                f"--gpus {config.gpus} with --tp {tp} makes {dp} "
                f"{'decode ' if config.prefill_replicas else ''}replicas, not --dp {config.dp}"
            )
    spec = config.spec
    # the server's max_model_len: the flag's, else the model's context (vLLM's default)
    engine = cat.engine(config.engine).for_model_len(
        config.max_model_len or model.max_position_embeddings, mla=model.mla is not None
    )
    check_deployment_flags(config, engine, gpu)
    reserve = engine.admission_reserve
    if config.schedule_conservativeness is not None:
        if reserve is None:
            raise sglang_flag_error(
                "--schedule-conservativeness",
                engine.name,
                "admits a request when its prompt fits and reserves nothing for later tokens",
            )
        scaled = min(reserve.init_ratio * config.schedule_conservativeness, 1.0)
        reserve = reserve.model_copy(update={"init_ratio": scaled})
    if config.mixed_chunk and engine.mixes_prefill_and_decode:
        raise sglang_flag_error(
            "--enable-mixed-chunk",
            engine.name,
            "always carries prefill chunks and decodes in one step",
        )
    fit_options = engine_fit_options(
        engine,
        gpu,
        prefix_caching=config.prefix_caching,
        async_scheduling=config.async_scheduling,
        kv_dtype=config.kv_dtype,
        gpu_memory_utilization=config.gpu_memory_utilization,
        max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        enforce_eager=config.enforce_eager,
        drafter=drafter_for(cat, spec, config.quant, model),
        cpu_moe_layers=config.cpu_moe_layers,
        dp_attention=config.dp_attention,
        expert_parallel=config.expert_parallel,
        pp=config.pp,
        cpu_offload_gb=config.cpu_offload_gb,
        dense_in_ranks=dense_in_ranks(config, engine.name),
    )
    fmt, quant_reason, fit = resolve_format(
        cat, gpu, model, config.quant, tp, engine, **fit_options
    )
    if not fit.fits:
        loadable = list(loadable_formats(cat, engine).values())
        require_fit(fit, fit_hint(fit, gpu, model, fmt, loadable, tp, **fit_options))
    capacity = config.kv_capacity_tokens or fit.kv_capacity_tokens
    # a pipeline's batches in flight share its cache and sequence limit in equal parts
    num_blocks = capacity // BLOCK_SIZE_TOKENS // config.pp
    if params is None and profile is not None:
        params = profile.params(cat, gpu.name, engine)
    base_params = params
    params = resolve_params(
        cat, gpu, config.efficiency_overrides, base_params, engine, config.offline
    )
    dep = engine_deployment(
        engine,
        gpu,
        tp=tp,
        quant=fmt.name,
        kv_dtype=config.kv_dtype,
        power_limit_w=config.power_limit_w,
        interconnect=config.interconnect,
        enforce_eager=config.enforce_eager,
        spec=spec,
        async_scheduling=config.async_scheduling,
        custom_allreduce=config.custom_allreduce,
        max_num_seqs=fit.max_num_seqs,
        max_num_batched_tokens=fit.max_num_batched_tokens,
        ubatch_tokens=config.ubatch_tokens,
        cpu_moe_layers=config.cpu_moe_layers,
        host_memory_bandwidth_gbs=config.host_memory_bandwidth_gbs,
        host_link_gbs=config.host_link_gbs,
        expert_parallel=config.expert_parallel,
        dp_attention=config.dp_attention,
        pp=config.pp,
        weights_in_host_share=weights_in_host_share(fit),
        dense_in_ranks=dense_in_ranks(config, engine.name),
        attention_backend=config.attention_backend,
        flash_attention=config.flash_attention,
    )
    step_model = build_step_model(cat, gpu, model, dep, params)
    sched = SchedulerConfig(
        max_num_seqs=max(fit.max_num_seqs // config.pp, 1),
        max_num_batched_tokens=fit.max_num_batched_tokens,
        block_size=BLOCK_SIZE_TOKENS,
        decode_width=step_model.decode_width,
        decode_advance=step_model.decode_advance,
        state_blocks=fit.state_blocks_per_sequence,
        recv_interval_steps=config.scheduler_recv_interval,
        mixes_prefill_and_decode=engine.mixes_prefill_and_decode or config.mixed_chunk,
        # vLLM V0 turns async output processing off with --enforce-eager and speculation
        outputs_a_step_late=engine.outputs_a_step_late
        and not config.enforce_eager
        and spec is None,
        reserve=reserve,
        # data-parallel attention: a prompt runs on its own rank, in the rank's chunks
        host_kv_blocks=host_kv_blocks(config, fit, num_blocks),
        host_load_s_per_token=(
            fit.kv_bytes_per_token / step_model.host_link_bytes_per_s()
            if config.kv_offloading_gb or config.hierarchical_cache
            else 0.0
        ),
        request_chunk_tokens=(
            max(fit.max_num_batched_tokens // config.dp_attention, 1)
            if config.dp_attention > 1
            else None
        ),
    )
    max_len = config.max_model_len or fit.max_model_len
    setup = Setup(
        config,
        gpu,
        model,
        fmt,
        step_model,
        fit,
        sched,
        num_blocks,
        dp,
        max_len,
        quant_reason,
        profile,
        base_params,
        engine.generation,
    )
    return with_prefill_pool(setup, cat, base_params)


def measured_setup(
    step_model,
    kv_capacity_tokens: int,
    max_model_len: int,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 2048,
    config: PredictConfig | None = None,
) -> Setup:
    """A deployment whose step times come from measurement (see
    capsim.calibration.step_table) rather than from the catalog's physics."""
    cfg = config or PredictConfig(gpu="(measured)", model="(measured)")
    sched = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=BLOCK_SIZE_TOKENS,
        decode_width=step_model.decode_width,
        decode_advance=step_model.decode_advance,
    )
    return Setup(
        cfg,
        None,
        None,
        None,
        step_model,
        None,
        sched,
        kv_capacity_tokens // BLOCK_SIZE_TOKENS,
        1,
        max_model_len,
        "measured step times",
    )
