"""The flags a deployment cannot take together, or that its engine or GPU does not have:
each a user error naming the flag typed (engine/setup.py calls ``check_deployment_flags``
before it fits memory)."""

from __future__ import annotations

from capsim.catalog.engine_schema import Engine
from capsim.catalog.gpu_schema import GPU
from capsim.engine.config import PredictConfig
from capsim.engine.disaggregated_setup import check_disaggregation_flags
from capsim.errors import CapsimUserError


def check_deployment_flags(config: PredictConfig, engine: Engine, gpu: GPU) -> None:
    """Every combination of flags the engine (``engine``, resolved for the model) or the GPU
    refuses, or capsim does not model, as a user error."""
    refuse_flags_the_engine_lacks(config, engine.name)
    refuse_async_scheduling_before_its_release(config, engine)
    if config.flash_attention is not None and engine.flash_attention_flag is None:
        raise CapsimUserError(
            f"--flash-attn is llama.cpp's; {engine.name} always runs fused attention "
            "kernels (FlashAttention, FlashInfer), which keep the scores on chip",
            hint="leave --flash-attn out, or use --engine llama.cpp",
        )
    check_disaggregation_flags(config, engine)
    check_pipeline_flags(config, engine.name)
    if config.scheduler_recv_interval > 1 and engine.name != "sglang":
        raise sglang_flag_error(
            "--scheduler-recv-interval", engine.name, "takes new requests every step", "at 1"
        )
    if config.host_memory_bandwidth_gbs and not config.cpu_moe_layers:
        raise CapsimUserError(
            "--host-memory-bandwidth applies to --n-cpu-moe",
            hint="add --n-cpu-moe N (MoE layers whose experts stay in system RAM)",
        )
    if config.host_link_gbs and not (
        config.cpu_moe_layers
        or config.cpu_offload_gb
        or config.kv_offloading_gb
        or config.hierarchical_cache
    ):
        raise CapsimUserError(
            "--host-link-bandwidth applies to --n-cpu-moe, --cpu-offload-gb and "
            "--kv-offloading-size",
            hint="add --n-cpu-moe N (llama.cpp) or --cpu-offload-gb G (vLLM, SGLang)",
        )
    if config.kv_offloading_gb:
        check_kv_offloading(config, engine.name, gpu)
    check_hierarchical_cache(config, engine.name, gpu)
    if config.cpu_offload_gb and engine.name == "llama.cpp":
        raise CapsimUserError(
            "--cpu-offload-gb is vLLM's and SGLang's; llama.cpp keeps layers in system RAM "
            "with -ngl and experts with --n-cpu-moe",
            hint="use --n-cpu-moe N with llama.cpp, or --engine vllm",
        )


def check_flags_as_predict(engine: Engine, gpu: GPU, **fields) -> None:
    """The combinations predict refuses, refused alike where a command (fit, explain)
    takes the same flags without simulating: ``fields`` are PredictConfig's."""
    config = PredictConfig(gpu=gpu.name, model="(checked)", engine=engine.name, **fields)
    check_deployment_flags(config, engine, gpu)


def check_kv_offloading(config: PredictConfig, engine: str, gpu: GPU) -> None:
    """Where vLLM's --kv-offloading-size cannot apply, a user error."""
    if engine != "vllm":
        raise CapsimUserError(
            f"--kv-offloading-size is vLLM's (its CPU KV offloading); {engine} "
            + (
                "keeps its tier in system RAM with --enable-hierarchical-cache"
                if engine == "sglang"
                else "has no KV tier in system RAM"
            ),
            hint="use --engine vllm"
            + (", or --enable-hierarchical-cache with SGLang" if engine == "sglang" else "")
            + ", or leave --kv-offloading-size out",
        )
    if not config.prefix_caching:
        raise CapsimUserError(
            "--kv-offloading-size keeps prefix-cache blocks, and --no-prefix-caching turns "
            "the prefix cache off",
            hint="leave one of them out",
        )
    if gpu.unified_memory:
        raise CapsimUserError(
            f"{gpu.name} shares one memory between its CPU and GPU, so --kv-offloading-size "
            "moves no KV anywhere else",
            hint="leave --kv-offloading-size out",
        )


def check_token_budget(batched_tokens: int, seqs: int, given_seqs: bool) -> None:
    """vLLM refuses a step's token budget below its sequence limit (every running sequence
    takes at least one token a step; vllm/config/scheduler.py ``_verify_args``:
    "max_num_batched_tokens ({}) must be greater than or equal to max_num_seqs ({})")."""
    if batched_tokens >= seqs:
        return
    where = "" if given_seqs else " (vLLM's default for this GPU)"
    raise CapsimUserError(
        f"--max-num-batched-tokens {batched_tokens:,} is below --max-num-seqs {seqs:,}{where}: "
        "vLLM refuses a token budget smaller than its sequence limit",
        hint=f"raise --max-num-batched-tokens to {seqs:,} or more, or lower --max-num-seqs to "
        f"{batched_tokens:,} or less",
    )


def sglang_flag_error(flag: str, engine: str, behaviour: str, leave: str = "out"):
    """The error for one of SGLang's flags given with another ``engine`` (which does
    ``behaviour`` instead)."""
    return CapsimUserError(
        f"{flag} is SGLang's flag; {engine} {behaviour}",
        hint=f"add --engine sglang, or leave {flag} {leave}",
    )


def refuse_async_scheduling_before_its_release(config: PredictConfig, engine: Engine) -> None:
    """--async-scheduling with a release older than the one that added it (vLLM 0.10.0,
    SGLang 0.3.4): that server had no way to run so, and a prediction with it would
    describe no server."""
    from capsim.catalog.engine_schema import parse_engine_version

    since = engine.async_scheduling_since
    if not config.async_scheduling or since is None or engine.version is None:
        return
    version, first = parse_engine_version(engine.version), parse_engine_version(since)
    if version is not None and first is not None and version < first:
        raise CapsimUserError(
            f"--async-scheduling: {engine.name} {engine.version} has no async scheduling; "
            f"it came in {since}",
            hint=f"leave --async-scheduling out, or name {engine.name}@{since} or later",
        )


def refuse_flags_the_engine_lacks(config: PredictConfig, engine: str) -> None:
    """A flag of another engine is an error, not a term quietly applied (issue 47:
    --ubatch-size with vLLM quadrupled a prefill step; --gpu-memory-utilization and
    --kv-dtype fp8 with llama.cpp resized a KV cache llama.cpp sizes by its context)."""
    if engine == "llama.cpp":
        lacks = {
            "--gpu-memory-utilization": (
                config.gpu_memory_utilization is not None,
                "sizes its KV cache by its context (-c), not by a share of memory",
            ),
            "--async-scheduling / --no-async-scheduling": (
                config.async_scheduling is not None,
                "runs its host work between steps",
            ),
            "--disable-custom-all-reduce": (
                config.custom_allreduce is not None,
                "has no custom all-reduce kernel to turn off",
            ),
            "--enable-expert-parallel": (
                config.expert_parallel,
                "splits tensors or layers over GPUs (-sm row, -sm layer), never the experts",
            ),
            f"--kv-dtype {config.kv_dtype}": (
                config.kv_dtype.lower().startswith("fp8"),
                "has no FP8 KV cache (its -ctk/-ctv types are f16, bf16, q8_0, q4_0, ...)",
            ),
        }
        for flag, (given, instead) in lacks.items():
            if given:
                raise CapsimUserError(
                    f"{flag} is not llama.cpp's; llama.cpp {instead}",
                    hint=f"leave {flag.split(' /')[0].split(' ')[0]} out with --engine llama.cpp",
                )
    elif config.ubatch_tokens is not None:
        raise CapsimUserError(
            f"--ubatch-size is llama.cpp's (-ub, its physical batch); {engine} runs a step's "
            "tokens in one pass",
            hint="add --engine llama.cpp, or leave --ubatch-size out",
        )


def check_pipeline_flags(config: PredictConfig, engine: str) -> None:
    """What --pipeline-parallel-size does not combine with here, as user errors."""
    if config.pp == 1:
        return
    if engine == "llama.cpp":
        raise CapsimUserError(
            "--pipeline-parallel-size: llama.cpp splits layers over GPUs (-sm layer) but runs "
            "one batch through them at a time, which capsim does not model",
            hint="use --engine vllm or sglang, or leave the flag out",
        )
    combined = [
        flag
        for flag, given in (
            ("--prefill-replicas", config.prefill_replicas),
            ("--enable-expert-parallel", config.expert_parallel),
            ("--enable-dp-attention", config.dp_attention > 1),
            ("--n-cpu-moe", config.cpu_moe_layers),
        )
        if given
    ]
    if combined:
        raise CapsimUserError(
            f"--pipeline-parallel-size with {' and '.join(combined)} is not modelled",
            hint="leave one of them out",
        )


def check_hierarchical_cache(config: PredictConfig, engine: str, gpu: GPU) -> None:
    """SGLang's HiCache flags, where they cannot apply, as user errors."""
    sized = config.hicache_size_gb or config.hicache_ratio != 2.0
    if not config.hierarchical_cache:
        if sized:
            raise CapsimUserError(
                "--hicache-ratio and --hicache-size size SGLang's hierarchical cache, and "
                "--enable-hierarchical-cache is not given",
                hint="add --enable-hierarchical-cache",
            )
        return
    if engine != "sglang":
        raise CapsimUserError(
            f"--enable-hierarchical-cache is SGLang's; {engine} "
            + (
                "keeps a tier in system RAM with --kv-offloading-size"
                if engine == "vllm"
                else "has none"
            ),
            hint="use --engine sglang"
            + (", or --kv-offloading-size G with vLLM" if engine == "vllm" else ""),
        )
    if not config.prefix_caching:
        raise CapsimUserError(
            "--enable-hierarchical-cache extends the radix (prefix) cache, and "
            "--no-prefix-caching turns it off",
            hint="leave one of them out",
        )
    if gpu.unified_memory:
        raise CapsimUserError(
            f"{gpu.name} shares one memory between its CPU and GPU, so a host KV pool adds no room",
            hint="leave --enable-hierarchical-cache out",
        )
