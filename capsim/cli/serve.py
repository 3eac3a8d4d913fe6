"""capsim serve: an OpenAI-compatible HTTP server that behaves like the predicted
deployment (tokens stream at the simulated step times, with batching, KV pressure,
preemption and queueing)."""

from __future__ import annotations

import math
from typing import Annotated

import typer

from capsim.cli.common import (
    KV_DTYPE_FLAGS,
    QUANT_FLAGS,
    AttentionBackendOption,
    AttentionRanksOption,
    CpuOffloadOption,
    DbOption,
    DpAttentionOption,
    EnforceEagerOption,
    EngineOption,
    ExpertParallelOption,
    FlashAttnOption,
    HicacheRatioOption,
    HicacheSizeOption,
    HierarchicalCacheOption,
    HostLinkOption,
    HostMemoryBandwidthOption,
    KvOffloadingOption,
    KvTransferBandwidthOption,
    MaxModelLenOption,
    MaxNumBatchedTokensOption,
    MaxNumSeqsOption,
    NCpuMoeOption,
    PowerLimitOption,
    PpOption,
    PrefillReplicasOption,
    PrefillTpOption,
    ProfileOption,
    SpecAcceptanceOption,
    SpecOption,
    TpOption,
    catalog,
    dp_fields,
    err_console,
    flash_attention_choice,
    hicache_fields,
    predict_config,
    print_notices,
    refuse_flags_of_other_engines,
    resolve_models,
    spec_config,
)
from capsim.cli.predict import split_list
from capsim.errors import CapsimUserError

SHUTDOWN_GRACE_S = 0.5
"""Seconds the server waits on requests in flight once told to stop (it waited until each
had streamed its last token: 8 s, or forever at --speedup 1, after SIGTERM)."""


def quiet_shutdown(record) -> bool:
    """A logging filter for uvicorn's error log: False (drop) for what stopping the server
    on purpose logs, the requests cut off after the grace period (a CancelledError or
    KeyboardInterrupt traceback each, and 'Cancel N running task(s)'), and h11's protocol
    error after a malformed request was answered 400; everything else passes."""
    import asyncio

    kind = record.exc_info[0] if record.exc_info else None
    if kind is not None and issubclass(kind, (asyncio.CancelledError, KeyboardInterrupt)):
        return False
    if kind is not None and kind.__name__ == "LocalProtocolError":
        # h11's, when a malformed request (a bad chunk size) was already answered 400 by
        # uvicorn and the app's reply then finds the connection closing: the client got
        # its 400, the log got a traceback for it
        return False
    return not str(record.msg).startswith("Cancel ")


MIN_SPEEDUP = 0.001
"""Slowest time scale served: a 10 ms step takes 10 s (--speedup 1e-300 was accepted and
every request then waited forever)."""

MAX_SPEEDUP = 1000.0
"""Beyond this the host's timer (about a millisecond) is a large share of a step."""


def serve_cmd(
    ctx: typer.Context,
    gpu: Annotated[str, typer.Option("--gpu", help="GPU name")],
    model: Annotated[str, typer.Option("--model", help="Model name or Hugging Face id")],
    quant: Annotated[str | None, typer.Option(*QUANT_FLAGS, help="Weight format")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs in total")] = None,
    tp: TpOption = 1,
    pp: PpOption = 1,
    kv_dtype: Annotated[str, typer.Option(*KV_DTYPE_FLAGS, help="auto or fp8")] = "auto",
    max_num_seqs: MaxNumSeqsOption = None,
    max_num_batched_tokens: MaxNumBatchedTokensOption = None,
    max_model_len: MaxModelLenOption = None,
    spec: SpecOption = None,
    spec_acceptance: SpecAcceptanceOption = None,
    power_limit: PowerLimitOption = None,
    enforce_eager: EnforceEagerOption = False,
    attention_backend: AttentionBackendOption = None,
    flash_attn: FlashAttnOption = None,
    enable_expert_parallel: ExpertParallelOption = False,
    dp: AttentionRanksOption = None,
    enable_dp_attention: DpAttentionOption = False,
    n_cpu_moe: NCpuMoeOption = 0,
    host_memory_bandwidth: HostMemoryBandwidthOption = None,
    host_link_bandwidth: HostLinkOption = None,
    cpu_offload_gb: CpuOffloadOption = 0.0,
    kv_offloading_size: KvOffloadingOption = 0.0,
    enable_hierarchical_cache: HierarchicalCacheOption = False,
    hicache_ratio: HicacheRatioOption = None,
    hicache_size: HicacheSizeOption = None,
    prefill_replicas: PrefillReplicasOption = 0,
    prefill_tp: PrefillTpOption = None,
    kv_transfer_bandwidth: KvTransferBandwidthOption = None,
    engine: EngineOption = "vllm",
    profile: ProfileOption = "auto",
    host: Annotated[str, typer.Option("--host", help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="TCP port")] = 8000,
    speedup: Annotated[
        float,
        typer.Option(
            "--speedup",
            help="Run simulated time this many times faster than the wall clock",
        ),
    ] = 1.0,
    served_model_name: Annotated[
        str | None,
        typer.Option(
            "--served-model-name",
            help="Model name(s) the API answers to, comma-separated (default: the model's "
            "Hugging Face id and its catalog name)",
        ),
    ] = None,
    override_generation_config: Annotated[
        str | None,
        typer.Option(
            "--override-generation-config",
            help="vLLM's flag, as JSON: '{\"max_new_tokens\": N}' caps what a request "
            "without max_tokens generates (default: up to max_model_len, as vLLM; with no "
            "end-of-sequence token here that can take many minutes). Other keys change no "
            "timing",
        ),
    ] = None,
    db: DbOption = None,
) -> None:
    """Serve the OpenAI API with the predicted deployment's timing: point an agent
    framework, a dashboard or capsim probe at it before buying the hardware. Generated
    text is filler; the timing is the simulation's."""
    import math

    if not (math.isfinite(speedup) and MIN_SPEEDUP <= speedup <= MAX_SPEEDUP):
        raise CapsimUserError(
            f"--speedup must be from {MIN_SPEEDUP:g} to {MAX_SPEEDUP:g}, not {speedup:g}",
            hint="1 runs in real time; 10 runs ten times faster",
        )
    if tp < 1 or (gpus is not None and gpus < 1):
        raise CapsimUserError("--tp and --gpus must be at least 1")
    if max_model_len is not None and max_model_len < 2:
        raise CapsimUserError(
            f"--max-model-len {max_model_len} leaves no room for any request (a prompt of one "
            "token and one generated token take 2)",
            hint="leave it out for the model's own context length, or give at least 2",
        )
    default_max_tokens = max_new_tokens_of(override_generation_config)
    cat, (ref,) = resolve_models(catalog(db), [model])
    refuse_flags_of_other_engines(ctx, cat.engine(engine).name)
    config = predict_config(
        gpu=gpu,
        model=ref.name,
        quant=quant or ref.quant,
        gpus=gpus,
        tp=tp,
        pp=pp,
        kv_dtype=kv_dtype,
        workload="closed",
        concurrency=[1],
        requests=1,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        spec=spec_config(spec, spec_acceptance),
        power_limit_w=power_limit,
        enforce_eager=enforce_eager,
        attention_backend=attention_backend,
        flash_attention=flash_attention_choice(flash_attn),
        expert_parallel=enable_expert_parallel,
        **dp_fields(engine, enable_expert_parallel, enable_dp_attention, dp),
        cpu_moe_layers=n_cpu_moe,
        host_memory_bandwidth_gbs=host_memory_bandwidth,
        host_link_gbs=host_link_bandwidth,
        cpu_offload_gb=cpu_offload_gb,
        kv_offloading_gb=kv_offloading_size,
        **hicache_fields(enable_hierarchical_cache, hicache_ratio, hicache_size),
        prefill_replicas=prefill_replicas,
        prefill_tp=prefill_tp,
        kv_transfer_gbs=kv_transfer_bandwidth,
        engine=engine,
        profile=profile,
    )
    from capsim.calibration.applied import calibrated_setup
    from capsim.serve.live import LIMITS

    setup = calibrated_setup(config, cat)
    # served names are matched as written (vLLM's are case-sensitive): 'A,a' are two
    names = (
        split_list(served_model_name, "--served-model-name", key=str) if served_model_name else []
    )
    unprintable = next((n for n in names if not n.isprintable()), None)
    if unprintable is not None:
        # a terminal escape in the banner and in every /v1/models answer
        raise CapsimUserError(
            f"--served-model-name {unprintable!r} holds a control character",
            hint="name the model with printable characters",
        )
    if not names:
        names = list(dict.fromkeys([setup.model.hf_id, setup.model.name, model]))
    check_listen(host, port)
    port = port or free_port(host)  # --port 0: one the system hands out, shown as it is
    print_notices()
    err_console.print(
        f"capsim serve: {setup.model.name} ({setup.fmt.name}) on {setup.gpus}x "
        f"{setup.gpu.name} (TP{setup.config.tp} x {setup.dp} "
        + ("decode " if setup.prefill is not None else "")
        + "replicas"
        + (
            f", {setup.config.prefill_replicas} prefill instance(s) of TP{setup.prefill.config.tp}"
            if setup.prefill is not None
            else ""
        )
        + (
            f", data-parallel attention x{setup.config.dp_attention}"
            if setup.config.dp_attention > 1
            else ""
        )
        + (
            f", experts of {setup.config.cpu_moe_layers} layers in system RAM"
            if setup.config.cpu_moe_layers
            else ""
        )
        + "), "
        f"max_model_len {setup.max_model_len:,}, KV cache "
        f"{setup.num_blocks * setup.scheduler.block_size:,} tokens, speedup {speedup:g}x; "
        f"serving {', '.join(names)} at {base_url(host, port)}/v1\n"
        f"simulated, not a model: {LIMITS}; a chat request without max_tokens generates "
        + (
            f"at most {default_max_tokens:,} tokens (--override-generation-config)"
            if default_max_tokens
            else "up to max_model_len (vLLM's default; cap it with --override-generation-config "
            "'{\"max_new_tokens\": N}'), a completion without it 16"
        ),
        highlight=False,
        soft_wrap=True,
    )
    run_server(setup, names, speedup, host, port, default_max_tokens)


GENERATION_CONFIG_KEYS = (
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
)
"""The generation-config keys vLLM takes as default sampling parameters
(ModelConfig.get_diff_sampling_param); it reads no other key of the override."""


def max_new_tokens_of(text: str | None) -> int | None:
    """``--override-generation-config``'s max_new_tokens (None where not given), checked:
    a JSON object, max_new_tokens a whole number from 1; exit 2 otherwise."""
    if text is None:
        return None
    import json

    from capsim.files import loads_json

    flag = "--override-generation-config"
    try:
        value = loads_json(text)
    except (json.JSONDecodeError, ValueError, RecursionError) as exc:
        raise CapsimUserError(
            f"{flag} is not JSON ({str(exc).splitlines()[0][:120]})",
            hint=f"""e.g. {flag} '{{"max_new_tokens": 512}}'""",
        ) from None
    if not isinstance(value, dict):
        raise CapsimUserError(f"{flag} must be a JSON object, not {type(value).__name__}")
    from capsim.errors import close_matches

    for key, v in value.items():
        if key not in GENERATION_CONFIG_KEYS:
            raise CapsimUserError(
                f"{flag}: {key!r} is not a generation setting vLLM reads",
                hint="one of " + ", ".join(GENERATION_CONFIG_KEYS),
                suggestions=close_matches(str(key), list(GENERATION_CONFIG_KEYS)),
            )
        if key != "max_new_tokens" and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise CapsimUserError(f"{flag}: {key} must be a number, not {v!r}"[:300])
    odd = next((k for k, v in value.items() if isinstance(v, float) and not math.isfinite(v)), None)
    if odd is not None:  # NaN or Infinity, which JSON does not have: no sampler takes it
        raise CapsimUserError(f"{flag}: {odd} must be a finite number, not {value[odd]!r}")
    from capsim.serve.requests import ApiError, check_sampling

    try:  # the ranges a request's own values meet (vLLM's SamplingParams): the defaults
        # would meet them in every request ('repetition_penalty': -1 was taken)
        check_sampling({k: v for k, v in value.items() if k != "max_new_tokens"}, chat=False)
    except ApiError as exc:
        raise CapsimUserError(
            f"{flag}: {exc.message.rstrip('.')}",
            hint="vLLM uses these as the default sampling parameters of every request",
        ) from None
    tokens = value.get("max_new_tokens")
    if tokens is None:
        return None
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= 10**9:
        raise CapsimUserError(
            f"{flag}: max_new_tokens must be a whole number from 1 to 1e9, not {tokens!r}"[:300]
        )
    return tokens


def check_listen(host: str, port: int) -> None:
    """A CapsimUserError (exit 2) when ``host`` does not resolve to an address of this
    machine or ``port`` cannot be bound there (taken, or privileged), before the server is
    started."""
    import socket

    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise CapsimUserError(
            f"--host '{host}' is not an address capsim can listen on ({exc})",
            hint="use 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or ::",
        ) from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            import errno

            not_here = exc.errno == errno.EADDRNOTAVAIL  # an address of another machine
            raise CapsimUserError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                hint="--host must be an address of this machine: 127.0.0.1, 0.0.0.0 or ::"
                if not_here
                else "pick another --port, or stop what is listening there",
            ) from None


def base_url(host: str, port: int) -> str:
    """The URL a client on this machine reaches the server at: a wildcard address as the
    loopback one, an IPv6 address in brackets ('http://[::1]:8000'). A wildcard is known by
    its address, not its spelling: '--host 0' (0.0.0.0) was shown as 'http://0:8000'."""
    import ipaddress
    import socket

    local = host
    try:
        address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]
        wildcard = ipaddress.ip_address(address.split("%")[0])
    except (OSError, UnicodeError, ValueError):
        wildcard = None
    if host == "" or (wildcard is not None and wildcard.is_unspecified):
        local = "::1" if wildcard is not None and wildcard.version == 6 else "127.0.0.1"
    if ":" in local and not local.startswith("["):
        local = f"[{local}]"
    return f"http://{local}:{port}"


def free_port(host: str) -> int:
    """A TCP port the system hands out on ``host`` now (for --port 0, so the banner and
    /v1/models name the port clients must use; another process could take it in the
    moment before the server binds it, which then fails with a message)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host or "0.0.0.0", 0))
        return int(sock.getsockname()[1])


def run_server(
    setup,
    names: list[str],
    speedup: float,
    host: str,
    port: int,
    default_max_tokens: int | None = None,
) -> None:
    """Serve until interrupted (Ctrl-C stops it cleanly) on ``host``:``port``, checked
    by check_listen and a port of its own (not 0)."""
    import uvicorn

    from capsim import __version__
    from capsim.serve.app import create_app
    from capsim.serve.live import LiveDeployment
    from capsim.serve.transport import stamped_protocol

    # serve_cmd checked the address (check_listen) and gave --port 0 a port (free_port)
    self_url = base_url(host, port)
    app = create_app(
        LiveDeployment(setup, speedup), names, __version__, self_url, default_max_tokens
    )
    import logging

    logging.getLogger("uvicorn.error").addFilter(quiet_shutdown)
    import signal

    # uvicorn stops on SIGINT or SIGTERM and raises the signal again once it has shut down,
    # into the handler it found: this one notes it, so the command exits 130 or 143 as
    # every other interrupted command does (it exited 0, like a normal end)
    stopped_by: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, frame: stopped_by.append(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level="warning",
            http=stamped_protocol() or "auto",
            # Ctrl-C or SIGTERM stops the server within about a second: requests still
            # streaming are cut off (a client sees its stream end), never waited for
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        )
    except SystemExit as exc:  # uvicorn exits 3 when its start-up fails (it printed why)
        if exc.code in (0, None):
            raise
        raise CapsimUserError(
            f"capsim serve could not start on {host}:{port}",
            hint="pick another --port or --host",
        ) from None
    except OSError as exc:  # the port is taken, or the address cannot be bound
        raise CapsimUserError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="pick another --port, or stop what is listening there",
        ) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stopped_by:
        raise typer.Exit(143 if stopped_by[-1] == signal.SIGTERM else 130)
