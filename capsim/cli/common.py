"""Pieces shared by the CLI modules: consoles, options, error handling, helpers."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from capsim.catalog import ENV_VAR
from capsim.engine.limits import MAX_ENGINE_COUNT, MAX_TP
from capsim.errors import CapsimUserError, TooSmallToRead, plain_float

if TYPE_CHECKING:
    from capsim.catalog.loader import Catalog
    from capsim.catalog.resolve import ResolvedModel

EXIT_USER_ERROR = 2


class CommandGroup(TyperGroup):
    """A command group whose plain --help lists each command with its first sentence
    whole, wrapped to the width (click would cut it to one line with '...')."""

    def format_commands(self, ctx, formatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


PLAIN_HELP: dict[str, Any] = {"rich_markup_mode": None, "cls": CommandGroup}
"""Typer settings of every capsim command group: click's plain --help, which wraps the
descriptions and keeps every option name whole at any width (typer's rich help panel
cuts long names such as --spec-acceptance to '--spec-acceptan…' at 80 columns)."""

# markup off: what is printed quotes names, paths and values the user typed, which rich
# would read as markup ('[/x]' a MarkupError traceback); styled lines ask for it and escape
MIN_COLUMNS = 20
"""Narrowest COLUMNS honoured: rich lays every line out within it, and COLUMNS=0 printed
nothing at all, errors included (a value below this, or not a number, is ignored)."""


def _sane_columns() -> None:
    """Drop a COLUMNS that is not a whole number of at least MIN_COLUMNS (rich would lay
    the output out in it, or fail); the terminal's own width is used instead."""
    import os

    value = os.environ.get("COLUMNS")
    if value is not None and not (value.strip().isdigit() and int(value) >= MIN_COLUMNS):
        del os.environ["COLUMNS"]


_sane_columns()
console = Console(markup=False, emoji=False)
err_console = Console(stderr=True, markup=False, emoji=False)

DbOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--db",
        help=f"Extra catalog directory laid over the built-in one (repeatable; also ${ENV_VAR}).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
ForceOption = Annotated[
    bool, typer.Option("--force", help="Overwrite the files this command writes if they exist")
]
PLOT_FORMATS = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp")
"""Image formats matplotlib's Agg backend writes, by suffix (plot_path_written)."""


PLOT_HELP = (
    "Write {what}: PNG, or PDF, SVG and the other formats matplotlib writes by the file's "
    "suffix (a name with none of them gets .png added: out.txt writes out.txt.png)"
)


def check_plot_target(path: Path | None, force: bool) -> None:
    """Refuse, before any work, a --plot target that exists (without --force), names a
    folder, a device or nothing, or lies in a folder that does not exist."""
    if path is not None:
        from capsim.files import refuse_overwrite

        refuse_overwrite([path], "--plot", True)  # a folder, a device, no name: never
        refuse_overwrite([plot_path_written(path, PLOT_FORMATS)], "--plot", force)
        parent = path.parent
        if not parent.is_dir():
            raise CapsimUserError(f"--plot '{path}': the folder '{parent}' does not exist")


TP_FLAGS = ("--tp", "--tensor-parallel-size", "--tp-size")
"""The tensor-parallel flag and the engines' own names for it (vLLM's, SGLang's)."""
DP_FLAGS = ("--dp", "--data-parallel-size", "--dp-size")
"""The data-parallel flag and the engines' own names for it."""
KV_DTYPE_FLAGS = ("--kv-dtype", "--kv-cache-dtype")
"""The KV-cache dtype flag and vLLM's and SGLang's name for it."""
QUANT_FLAGS = ("--quant", "--quantization")
"""The weight-format flag and vLLM's name for it (its values are the formats' aliases)."""
TpOption = Annotated[int, typer.Option(*TP_FLAGS, help="Tensor-parallel size")]
PP_FLAGS = ("--pp", "--pipeline-parallel-size", "--pp-size")
"""The pipeline-parallel flag and the engines' own names for it (vLLM's, SGLang's)."""
PpOption = Annotated[
    int,
    typer.Option(
        *PP_FLAGS,
        min=1,
        max=MAX_TP,
        help="Pipeline stages per replica, each a TP group of --tp GPUs holding its share of "
        "the layers (vLLM --pipeline-parallel-size, SGLang --pp-size)",
    ),
]

MaxNumSeqsOption = Annotated[
    int | None,
    typer.Option(
        "--max-num-seqs",
        "--max-running-requests",
        help="Default: vLLM's for the GPU",
        min=1,
        max=MAX_ENGINE_COUNT,
    ),
]
MaxNumBatchedTokensOption = Annotated[
    int | None,
    typer.Option(
        "--max-num-batched-tokens",
        "--chunked-prefill-size",
        help="Tokens a step takes (SGLang's --chunked-prefill-size) [default: the engine's "
        "for the GPU]",
        min=1,
        max=MAX_ENGINE_COUNT,
    ),
]
MaxModelLenOption = Annotated[
    int | None,
    typer.Option(
        "--max-model-len",
        "--context-length",
        help="Longest sequence in tokens (SGLang's --context-length) [default: auto]",
        min=1,
        max=MAX_ENGINE_COUNT,
    ),
]
GpuMemoryUtilizationOption = Annotated[
    float | None,
    typer.Option(
        "--gpu-memory-utilization",
        "--mem-fraction-static",
        help="Fraction of GPU memory the engine takes (SGLang's --mem-fraction-static) "
        "[default: the engine's, 0.9 for vLLM]",
    ),
]
EnforceEagerOption = Annotated[
    bool,
    typer.Option(
        "--enforce-eager",
        help="No CUDA graphs: every step's kernels launched from the host (vLLM's flag; "
        "SGLang's --disable-cuda-graph)",
    ),
]
AttentionBackendOption = Annotated[
    str | None,
    typer.Option(
        "--attention-backend",
        help="Attention kernels the server runs (SGLang's and vLLM's flag: triton, fa3, "
        "flashinfer, trtllm_mha, ... for SGLang; TRITON_ATTN, FLASH_ATTN, FLASHINFER, ... "
        "for vLLM). Default: the engine's choice for the model (SGLang runs Gemma 4 on "
        "triton off SM100 Blackwell). A Triton backend reads the KV cache slower "
        "(capsim explain shows the term)",
        show_default=False,
    ),
]
FlashAttnOption = Annotated[
    str | None,
    typer.Option(
        "--flash-attn",
        help="llama.cpp's -fa: on, off or auto (its build's default: off before b6327, on "
        "since). Off writes every attention score to memory and back, which slows long "
        "prompts (capsim explain shows the term)",
        show_default=False,
    ),
]


def flash_attention_choice(value: str | None) -> bool | None:
    """--flash-attn as the deployment takes it: True (on, 1), False (off, 0), None (auto or
    not given: the engine's default for its release); anything else a user error."""
    if value is None:
        return None
    choices = {"on": True, "1": True, "off": False, "0": False, "auto": None}
    key = value.strip().lower()
    if key not in choices:
        from capsim.errors import close_matches

        raise CapsimUserError(
            f"--flash-attn {value!r} is not on, off or auto",
            hint="llama.cpp's -fa takes on, off or auto (older builds: 1 or 0)",
            suggestions=close_matches(key, ["on", "off", "auto"]),
        )
    return choices[key]


InputTokensOption = Annotated[
    str,
    typer.Option(
        "--input-tokens",
        help="Prompt tokens per request: N or a distribution (uniform:A,B, normal:MEAN,SD, "
        "lognormal:MEDIAN,SIGMA, file:PATH)",
    ),
]
OutputTokensOption = Annotated[
    str,
    typer.Option(
        "--output-tokens", help="Output tokens per request: N or a distribution, as above"
    ),
]
MinAgentTokSOption = Annotated[
    float | None,
    typer.Option("--min-agent-tok-s", help="Objective: each agent gets at least this (tok/s)"),
]
MaxTtftP90Option = Annotated[
    float | None,
    typer.Option(
        "--max-ttft-p90-s",
        "--max-ttft-p90",
        help="Objective: TTFT 90th percentile at most this (seconds)",
    ),
]
MaxTpotOption = Annotated[
    float | None,
    typer.Option(
        "--max-tpot-ms",
        "--max-tpot",
        help="Objective: mean time per output token at most this (milliseconds)",
    ),
]
MaxE2eP90Option = Annotated[
    float | None,
    typer.Option(
        "--max-e2e-p90-s",
        "--max-e2e-p90",
        help="Objective: end-to-end latency p90 at most this (seconds)",
    ),
]
"""The service-level objectives capacity, plan and predict take. A flag's name carries its
unit (the shorter names stay accepted): TTFT and end-to-end latency in seconds, the time
per output token in milliseconds, as the tables show them."""
OBJECTIVE_FLAGS = {
    "min_agent_tok_s": "--min-agent-tok-s",
    "max_ttft_p90_s": "--max-ttft-p90-s",
    "max_tpot_ms": "--max-tpot-ms",
    "max_e2e_p90_s": "--max-e2e-p90-s",
}
"""Each field of planner.capacity.Objectives and the flag that sets it."""


def objectives_from_flags(**values: float | None):
    """The Objectives the SLO flags give (``values`` by Objectives' field names), or a user
    error naming the flag whose value is out of its range."""
    from pydantic import ValidationError

    from capsim.planner.capacity import Objectives

    try:
        return Objectives(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = OBJECTIVE_FLAGS[first["loc"][0]]
        # pydantic's own words carry the bound that failed (greater than 0, at most N)
        said = first["msg"].lower().removeprefix("value error, ")
        raise CapsimUserError(f"{flag} {first['input']!r}: {said}") from None


AsyncSchedulingOption = Annotated[
    bool | None,
    typer.Option(
        "--async-scheduling/--no-async-scheduling",
        help="Schedule the next step while the GPU runs this one (default: the engine's; "
        "on for vLLM and SGLang)",
        show_default=False,
    ),
]
SpecOption = Annotated[
    str | None,
    typer.Option(
        "--spec",
        "--speculative-config",
        help="Speculative decoding, e.g. mtp:2, ngram:4, or vLLM's JSON "
        '\'{"method": "mtp", "num_speculative_tokens": 2}\'',
    ),
]
SpecAcceptanceOption = Annotated[
    str | None, typer.Option("--spec-acceptance", help="Rate, or one per position")
]
PowerLimitOption = Annotated[float | None, typer.Option("--power-limit", help="Board power cap, W")]
ProfileOption = Annotated[
    str, typer.Option("--profile", help="Calibration profile: auto, none, NAME or PATH")
]
EngineOption = Annotated[
    str,
    typer.Option(
        "--engine",
        help="Serving engine: vllm, sglang or llama.cpp (list: capsim engines), with a "
        "release (vllm@0.7.3, llama.cpp@b6918) and for llama.cpp a backend "
        "(llama.cpp:vulkan; default the GPU vendor's own). Sets the batch defaults, "
        "CUDA-graph sizes and kernel priors",
    ),
]
ExpertParallelOption = Annotated[
    bool,
    typer.Option(
        "--enable-expert-parallel",
        help="MoE: split the routed experts whole over the TP group, num_experts / tp a GPU "
        "(vLLM's flag; SGLang's --ep-size equal to --tp) instead of a slice of each on every "
        "GPU",
    ),
]
AttentionRanksOption = Annotated[
    int | None,
    typer.Option(*DP_FLAGS, help="With --enable-dp-attention: attention ranks in the TP group"),
]
"""--dp where it counts only attention ranks (fit, explain, capacity, serve: --gpus sets
the replicas there)."""
DpAttentionOption = Annotated[
    bool,
    typer.Option(
        "--enable-dp-attention",
        help="SGLang: attention data-parallel inside the TP group, --dp ranks of tp / dp "
        "GPUs, each with its own sequences and KV cache; the MLP and MoE layers stay split "
        "over all tp GPUs. With it --dp counts attention ranks on the same GPUs, as SGLang's "
        "--dp-size does, not replicas",
    ),
]


def vllm_ep_ranks(
    engine: str, enable_expert_parallel: bool, enable_dp_attention: bool, dp: int | None
) -> int | None:
    """The data-parallel ranks of vLLM's ``--data-parallel-size N --enable-expert-parallel``
    (one expert-parallel group of tp x N GPUs, attention in N ranks), or None where the
    flags do not ask for it."""
    if dp is None or enable_dp_attention or not enable_expert_parallel:
        return None
    if engine.split("@")[0].strip().lower() != "vllm":
        return None
    return dp


def vllm_ep_group(tp: int, ranks: int) -> int:
    """The GPUs of vLLM's expert-parallel group of ``ranks`` data-parallel ranks of ``tp``
    GPUs; refused beyond one 8-GPU server, as predict refuses it."""
    from capsim.engine.setup import MAX_EP_GROUP_IN_A_SERVER

    group = tp * ranks
    if group > MAX_EP_GROUP_IN_A_SERVER:
        raise CapsimUserError(
            f"--data-parallel-size {ranks} with --enable-expert-parallel makes one "
            f"expert-parallel group of {group} GPUs, beyond one server's "
            f"{MAX_EP_GROUP_IN_A_SERVER}: expert parallelism across servers is not modelled",
            hint=f"at most {MAX_EP_GROUP_IN_A_SERVER // tp} ranks of --tp {tp}",
        )
    return group


def dp_fields(
    engine: str, enable_expert_parallel: bool, enable_dp_attention: bool, dp: int | None
) -> dict:
    """PredictConfig's ``dp`` and ``dp_attention`` for a command whose --gpus sets the
    replicas (capacity, serve): vLLM's DP+EP ranks as ``dp``, SGLang's DP-attention ranks
    as ``dp_attention``, and --dp alone refused (attention_ranks)."""
    ranks = vllm_ep_ranks(engine, enable_expert_parallel, enable_dp_attention, dp)
    attention = attention_ranks(enable_dp_attention, dp, replicas=False, vllm_ep=ranks is not None)
    return {"dp": ranks, "dp_attention": attention}


def attention_ranks(
    enable_dp_attention: bool, dp: int | None, replicas: bool = True, vllm_ep: bool = False
) -> int:
    """The data-parallel attention ranks ``--enable-dp-attention`` with ``--dp`` asks for
    (1 without the flag). SGLang turns DP attention off at dp 1 (its server_args), so the
    flag needs --dp above 1. ``replicas``: whether the command reads --dp without the flag
    as replicas (predict); where it does not (fit, explain, capacity, serve: --gpus sets
    them), --dp without the flag is refused rather than ignored, unless it is vLLM's
    data-parallel size beside --enable-expert-parallel (``vllm_ep``)."""
    if dp is not None and dp < 1:
        raise CapsimUserError(f"--dp must be at least 1, not {dp}")
    if not enable_dp_attention:
        if dp is not None and not replicas and not vllm_ep:
            raise CapsimUserError(
                f"--dp {dp} applies here only with --enable-dp-attention (attention ranks "
                "inside the TP group)",
                hint="add --enable-dp-attention (SGLang), or give replicas as --gpus N",
            )
        return 1
    if dp is None or dp < 2:
        raise CapsimUserError(
            "--enable-dp-attention needs --dp N above 1 (attention ranks inside the TP group)",
            hint="e.g. --tp 8 --dp 8 --enable-dp-attention: attention on every GPU alone; "
            "SGLang disables DP attention at dp 1",
        )
    return dp


NCpuMoeOption = Annotated[
    int,
    typer.Option(
        "--n-cpu-moe",
        min=0,
        max=10_000,
        help="llama.cpp: keep the routed experts of the first N MoE layers in system RAM "
        "(its --n-cpu-moe; needs --host-memory-bandwidth)",
    ),
]
HostMemoryBandwidthOption = Annotated[
    float | None,
    typer.Option(
        "--host-memory-bandwidth",
        min=0.001,
        max=100_000,
        help="With --n-cpu-moe: GB/s the CPU reads system RAM at (measured: dual-channel "
        "DDR5 about 60-95, quad-channel DDR4 about 100; see docs/physics.md)",
    ),
]
RouterLatencyOption = Annotated[
    float,
    typer.Option(
        "--router-latency-ms",
        min=0,
        max=60_000,
        help="Latency a gateway or router adds to each request, ms (a KV-aware gateway's "
        "scoring, a proxy hop) [default: 0]",
    ),
]
RouterCapacityOption = Annotated[
    float | None,
    typer.Option(
        "--router-capacity-rps",
        min=0.001,
        max=1e9,
        help="Requests a second the gateway or router passes, one at a time (a queue forms "
        "in front of it beyond) [default: unlimited]",
    ),
]
KvOffloadingOption = Annotated[
    float,
    typer.Option(
        "--kv-offloading-size",
        min=0,
        max=100_000,
        help="vLLM: GiB of system RAM a replica keeps prefix-cache blocks in besides the "
        "GPU's cache, loaded back over the host link on a hit (its --kv-offloading-size) "
        "[default: 0]",
    ),
]
HierarchicalCacheOption = Annotated[
    bool,
    typer.Option(
        "--enable-hierarchical-cache",
        help="SGLang's HiCache: a host KV pool beside the GPU's that keeps prefix-cache "
        "blocks, loaded back over the host link on a hit",
    ),
]
HicacheRatioOption = Annotated[
    float | None,
    typer.Option(
        "--hicache-ratio",
        min=0.001,
        max=1_000,
        help="With --enable-hierarchical-cache: host pool over device pool [default: 2, SGLang's]",
    ),
]
HicacheSizeOption = Annotated[
    float | None,
    typer.Option(
        "--hicache-size",
        min=0,
        max=100_000,
        help="With --enable-hierarchical-cache: the host pool in GB a GPU, over the ratio "
        "[default: 0, the ratio]",
    ),
]


def hicache_fields(enabled: bool, ratio: float | None, size: float | None) -> dict[str, Any]:
    """The PredictConfig fields of --enable-hierarchical-cache, --hicache-ratio and
    --hicache-size (None: not given, SGLang's defaults). A size given without the cache is
    refused at any value: the configuration's own check could not tell SGLang's default
    ratio of 2 typed from 2 by default, and took '--hicache-ratio 2' without the cache, or
    with vLLM, without a word (issue 47, round 5)."""
    if not enabled and (ratio is not None or size is not None):
        raise CapsimUserError(
            "--hicache-ratio and --hicache-size size SGLang's hierarchical cache, and "
            "--enable-hierarchical-cache is not given",
            hint="add --enable-hierarchical-cache",
        )
    return {
        "hierarchical_cache": enabled,
        "hicache_ratio": 2.0 if ratio is None else ratio,
        "hicache_size_gb": 0.0 if size is None else size,
    }


CpuOffloadOption = Annotated[
    float,
    typer.Option(
        "--cpu-offload-gb",
        min=0,
        max=100_000,
        help="vLLM/SGLang: GiB of each GPU's weights kept in pinned system RAM, read over "
        "the host link every pass (their --cpu-offload-gb) [default: 0]",
    ),
]
HostLinkOption = Annotated[
    float | None,
    typer.Option(
        "--host-link-bandwidth",
        min=0.001,
        max=100_000,
        help="With --n-cpu-moe or --cpu-offload-gb: GB/s per direction from host to GPU "
        "[default: the GPU's "
        "PCIe link in the catalog]",
    ),
]
MAX_PREFILL_REPLICAS = 1024
"""The most prefill instances a command takes: each is simulated as an engine of its own,
so capacity's search of a deployment past a thousand of them ran for minutes (no published
disaggregated deployment is near it; llm-d's guides run tens)."""
PrefillReplicasOption = Annotated[
    int,
    typer.Option(
        "--prefill-replicas",
        min=0,
        max=MAX_PREFILL_REPLICAS,
        help="Disaggregated prefill/decode: N instances of --prefill-tp GPUs only prefill "
        "and send each prompt's KV to the --dp decode replicas (vLLM --kv-transfer-config, "
        "SGLang --disaggregation-mode) [default: 0, not disaggregated]",
    ),
]
PrefillTpOption = Annotated[
    int | None,
    typer.Option(
        "--prefill-tp",
        min=1,
        max=MAX_TP,
        help="With --prefill-replicas: TP size of each prefill instance [default: --tp]",
    ),
]
KvTransferBandwidthOption = Annotated[
    float | None,
    typer.Option(
        "--kv-transfer-bandwidth",
        min=0.001,
        max=100_000,
        help="With --prefill-replicas: GB/s per GPU, one direction, that prompts' KV "
        "crosses from prefill to decode [default: NVLink where every GPU fits in one "
        "NVLink domain, else the GPU's PCIe link; a 400 Gb/s NIC is 50]",
    ),
]
UbatchOption = Annotated[
    int | None,
    typer.Option(
        "--ubatch-size",
        min=1,
        max=2**20,  # 10**30 was taken; no engine's pass is a million tokens
        help="Tokens per forward pass of a large batch (llama.cpp's -ub; default: the "
        "engine's, 512 for llama.cpp, none for vLLM)",
    ),
]
RecvIntervalOption = Annotated[
    int,
    typer.Option(
        "--scheduler-recv-interval",
        min=1,
        max=10_000,
        help="SGLang: decode steps between the scheduler's polls for new requests "
        "(its --scheduler-recv-interval; a new request waits up to this many steps)",
    ),
]
ConservativenessOption = Annotated[
    float | None,
    typer.Option(
        "--schedule-conservativeness",
        min=0,
        max=100,
        help="SGLang: scales the KV tokens reserved for running requests' later output "
        "(its --schedule-conservativeness; default 1, lower admits more and retracts more)",
    ),
]
MixedChunkOption = Annotated[
    bool,
    typer.Option(
        "--enable-mixed-chunk",
        help="SGLang: prefill chunks share a step with the decodes (its --enable-mixed-chunk; "
        "by default SGLang runs prefill batches apart and decodes wait)",
    ),
]
DisableCustomAllReduceOption = Annotated[
    bool, typer.Option("--disable-custom-all-reduce", help="NCCL for every all-reduce")
]
PriorWeightOption = Annotated[
    float,
    typer.Option(
        "--prior-weight",
        min=0.0,
        max=1000.0,
        help="Pull each fitted parameter towards its prior: moving it across its whole "
        "range costs like one point this far off in log units (default 0, off; at most "
        "1000, which holds every parameter at its prior)",
    ),
]
AcceptFailuresOption = Annotated[
    bool,
    typer.Option(
        "--accept-failures",
        help="Use probe-run levels where more requests failed than calibration allows "
        "(their ok requests only; the refusal names the share); refused by default",
    ),
]
SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="Efficiency parameter NAME=VALUE laid over the defaults and any profile "
        "(repeatable), e.g. layer_overhead_eager_us=400",
        show_default=False,
    ),
]


def parse_overrides(values: list[str] | None) -> dict[str, float]:
    """``--set NAME=VALUE`` items as efficiency overrides, checked against
    EfficiencyParams: unknown names get did-you-mean, values their field's limits."""
    from pydantic import ValidationError

    from capsim.errors import close_matches
    from capsim.physics.efficiency import MAX_EFFICIENCY_MAGNITUDE as MAX_SET_VALUE
    from capsim.physics.efficiency import EfficiencyParams

    fields = [n for n in EfficiencyParams.model_fields if n != "groups"]
    overrides: dict[str, float] = {}
    for item in values or []:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise CapsimUserError(f"malformed --set '{item}'", hint="use NAME=VALUE")
        if name not in fields:
            raise CapsimUserError(
                f"unknown efficiency parameter '{name}'",
                hint='the parameters and their units: capsim explain --json ("efficiency")',
                suggestions=close_matches(name, fields),
            )
        if name in overrides:  # the last one took over without a word
            raise CapsimUserError(
                f"--set {name} is given more than once", hint="give each parameter once"
            )
        try:
            overrides[name] = plain_float(text)
        except ValueError as exc:
            why = f" ({exc})" if isinstance(exc, TooSmallToRead) else ""
            raise CapsimUserError(f"--set {name} needs a number, not '{text}'{why}") from None
        if not math.isfinite(overrides[name]):
            raise CapsimUserError(f"--set {name} needs a finite number, not '{text.strip()}'")
        if abs(overrides[name]) > MAX_SET_VALUE:
            raise CapsimUserError(
                f"--set {name}={text.strip()} is beyond any value the physics takes",
                hint=f"efficiency parameters are at most {MAX_SET_VALUE:,.0f} in their units "
                "(us, ns, tokens, shares); capsim explain --json lists them",
            )
    try:
        EfficiencyParams().with_overrides(overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise CapsimUserError(
            f"--set {first['loc'][0]}={first['input']}: {first['msg'].lower()}"
        ) from None
    return overrides


UNIT_SUFFIXES = ("_w", "_s", "_ms", "_usd")
"""Unit suffixes of config fields that their flags leave out (power_limit_w: --power-limit)."""


FIELD_FLAGS = {
    "dp_attention": "--dp (with --enable-dp-attention)",
    "batch_rounds": "--rounds",
    "rates": "--rate",
    "flash_attention": "--flash-attn",
    "custom_allreduce": "--disable-custom-all-reduce",
    "ubatch_tokens": "--ubatch-size",
    "expert_parallel": "--enable-expert-parallel",
    "kv_transfer_gbs": "--kv-transfer-bandwidth",
    "cpu_moe_layers": "--n-cpu-moe",
    "kv_offloading_gb": "--kv-offloading-size",
    "hierarchical_cache": "--enable-hierarchical-cache",
    "hicache_size_gb": "--hicache-size",
    "host_memory_bandwidth_gbs": "--host-memory-bandwidth",
    "host_link_gbs": "--host-link-bandwidth",
    "mixed_chunk": "--enable-mixed-chunk",
}
"""Config fields whose flag is not their name with dashes (an error of
--kv-offloading-size named '--kv-offloading-gb', a flag no command has)."""


def flag_of(field: str) -> str:
    """The CLI flag of a config field, as the commands name them."""
    if field in FIELD_FLAGS:
        return FIELD_FLAGS[field]
    if field in OBJECTIVE_FLAGS:  # their names keep the unit: --min-agent-tok-s
        return OBJECTIVE_FLAGS[field]
    for suffix in UNIT_SUFFIXES:
        if field.endswith(suffix):
            field = field.removesuffix(suffix)
            break
    return "--" + field.replace("_", "-")


def validation_user_error(exc, help_command: str = "--help") -> CapsimUserError:
    """A pydantic ValidationError from a config the command built from its flags, as a
    user error naming the flag, what it must be and the value given (the hint points at
    ``help_command``)."""
    first = exc.errors()[0]
    field = next((str(part) for part in reversed(first["loc"]) if isinstance(part, str)), "")
    flag = flag_of(field) if field else "a value"
    given, said = first.get("input"), first["msg"]
    # a check of capsim's own says it in its words, units in their case ('GiB', not
    # 'value error, ... gib'); pydantic's own begin with a capital to drop
    said = said.removeprefix("Value error, ") if said.startswith("Value error, ") else said.lower()
    if isinstance(given, float) and not math.isfinite(given):
        # a range check reads nan as out of range: say what it is as well
        said = f"not a finite number ({said})"
    return CapsimUserError(f"{flag} {given!r}: {said}", hint=f"see {help_command} for {flag}")


CONTROL_CHARACTERS = {c: f"\\x{c:02x}" for c in [*range(32), 127] if chr(c) not in "\n\t"}
"""Control characters as escapes (ESC as \\x1b): an error quotes what the user typed or
a server answered, and a raw ESC sequence there would drive the user's terminal (issue
47: '--gpu $'\\e[2J'' cleared it; a served model name retitled it)."""


def printable(text: str) -> str:
    """``text`` with its control characters (but newlines and tabs) written as escapes."""
    return text.translate(CONTROL_CHARACTERS)


PATH_RUNTIME_ERRORS = ("Symlink loop", "Could not determine home directory")
"""The RuntimeErrors pathlib raises for a path the user gave (resolve, expanduser)."""


def user_errors(func):
    """Turn CapsimUserError (and a config that refuses a flag's value) into a one-line
    message and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from capsim.notices import take_notices

        take_notices()  # a command says what it inferred itself, nothing left from before
        try:
            result = func(*args, **kwargs)
            print_notices()
            return result
        except Exception as exc:
            if type(exc).__name__ == "ValidationError" and type(exc).__module__.startswith(
                "pydantic"
            ):
                exc = validation_user_error(exc)
            elif isinstance(exc, OSError) and exc.filename is not None:
                # a path the user gave that no file can have or capsim may not touch (a
                # name too long, a loop of links, no permission, a full disk): the path and
                # the system's reason, not a traceback
                exc = CapsimUserError(f"'{exc.filename}': {exc.strerror or exc}")
            elif isinstance(exc, RuntimeError) and str(exc).startswith(PATH_RUNTIME_ERRORS):
                # pathlib's own words for a path no file can be found at (Python 3.11: a
                # loop of links while resolving, '~someone' of a user who does not exist)
                exc = CapsimUserError(
                    f"a path given cannot be followed: {exc}",
                    hint="check the paths and the CAPSIM_* variables for a loop of links or "
                    "a '~user' of no user on this machine",
                )
            elif not isinstance(exc, CapsimUserError):
                raise
            print_notices()
            # the message quotes what the user typed: printed as text, not as rich markup
            # ('--gpu [/x]' was a MarkupError traceback, '[red]x' lost its brackets)
            message = escape(printable(exc.message))
            err_console.print(
                f"[bold red]error:[/] {message}", markup=True, highlight=False, soft_wrap=True
            )
            if exc.suggestions:
                err_console.print(
                    printable(f"did you mean: {', '.join(exc.suggestions)}?"),
                    markup=False,
                    highlight=False,
                    soft_wrap=True,
                )
            if exc.hint:
                hint = printable(f"hint: {exc.hint}")
                err_console.print(hint, markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_USER_ERROR) from None

    return wrapper


def predict_config(**fields):
    """A PredictConfig from CLI values; a value its schema refuses (``--max-num-seqs 0``)
    is a user error naming the flag and the limit, not a pydantic traceback."""
    from pydantic import ValidationError

    from capsim.engine.config import PredictConfig

    try:
        return PredictConfig(**fields)
    except ValidationError as exc:
        raise validation_user_error(exc, "'capsim predict --help'") from None


def print_notices() -> None:
    """What capsim inferred for the user (capsim.notices), one line each on stderr."""
    from capsim.notices import take_notices

    for text in take_notices():
        err_console.print(
            f"[dim]note:[/] {escape(text)}", markup=True, highlight=False, soft_wrap=True
        )


global_db: list[Path] = []


def catalog(db: list[Path] | None) -> Catalog:
    """The catalog with the top-level and the command's --db directories laid over it."""
    from capsim.catalog.loader import load_catalog
    from capsim.physics.published_counts import check_published_counts

    cat = load_catalog([*global_db, *(db or [])])
    check_published_counts(cat)  # an overlay's model cards against its dimensions
    return cat


def resolve_models(cat: Catalog, names: list[str]) -> tuple[Catalog, list[ResolvedModel]]:
    """Resolve ``--model`` values (see capsim.catalog.resolve.resolve_into)."""
    from capsim.catalog.resolve import resolve_into
    from capsim.cli.predict import refuse_repeats

    cat, models = resolve_into(cat, names)
    # two names of one model ('meta-llama/Llama-3.1-8B-Instruct,llama-3.1-8b')
    refuse_repeats(
        models, "--model", key=lambda m: (m.name, m.quant), shown=lambda m: f"the model '{m.name}'"
    )
    return cat, models


def file_matplotlib() -> None:
    """matplotlib, imported to draw into files (the Agg backend) whatever the environment
    says: MPLBACKEND naming no backend ended in a ValueError at import, and MATPLOTLIBRC
    naming a device (/dev/zero) was read forever. capsim's plots take no user style."""
    mplrc = os.environ.get("MATPLOTLIBRC")
    if mplrc is not None:
        import stat

        try:
            mode = os.stat(mplrc).st_mode
            usable = stat.S_ISDIR(mode) or stat.S_ISREG(mode)
        except OSError:
            usable = False
        if not usable:
            del os.environ["MATPLOTLIBRC"]
    os.environ["MPLBACKEND"] = "Agg"
    import matplotlib

    matplotlib.use("Agg")


def plot_path_written(path: Path, formats) -> Path:
    """The file a plot given as ``path`` is written to: ``path`` itself when it ends in one
    of the image ``formats`` matplotlib writes (png, pdf, svg, ...), else ``path`` with .png
    added (as matplotlib adds it to a name without a suffix)."""
    if path.suffix.lower().removeprefix(".") in formats:
        return path
    return path.with_name(path.name + ".png")


def save_figure(fig, path: Path) -> Path:
    """Write a matplotlib figure (PNG unless ``path`` names another image format) and
    close it; say on stderr which file was written and return it. An unwritable path is a
    user error."""
    import matplotlib.pyplot as plt

    written = plot_path_written(path, fig.canvas.get_supported_filetypes())
    # drawn beside it and renamed over it: a link there (--force) is replaced, not written
    # through into the file it points to, and a reader never sees half a plot
    import secrets

    drawing = written.with_name(f".{written.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
    try:
        # a new file (O_EXCL): a link already at the drawing's name is never written through
        with os.fdopen(os.open(drawing, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
            fig.savefig(f, dpi=110, format=written.suffix.removeprefix(".").lower() or "png")
        os.replace(drawing, written)
    except OSError as exc:
        drawing.unlink(missing_ok=True)
        raise CapsimUserError(f"cannot write plot '{written}': {exc.strerror}") from None
    finally:
        plt.close(fig)
    err_console.print(f"wrote {written}", highlight=False, soft_wrap=True)
    return written


def exclusive_outputs(**flags: bool) -> None:
    """Refuse two machine-output flags at once (``--json`` and ``--csv``): each prints the
    whole result on stdout in its own format. Keyword names are the flags without their
    dashes (``json=True, csv=False``)."""
    given = ["--" + name.replace("_", "-") for name, on in flags.items() if on]
    if len(given) > 1:
        raise CapsimUserError(
            f"{' and '.join(given)} cannot be combined: each prints the whole result on "
            "stdout in its own format",
            hint=f"choose one of {', '.join(given)}",
        )


def json_safe(data: Any) -> Any:
    """``data`` with every float that is not a number (NaN, infinity) as null: JSON has no
    such values, and a bare NaN breaks every parser that reads the output."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_safe(v) for v in data]
    return data


def print_json(data: Any) -> None:
    """``data`` as strict JSON on stdout (non-finite floats as null)."""
    text = json.dumps(json_safe(data), indent=2, default=str, allow_nan=False)
    sys.stdout.write(text + "\n")


def fmt_num(value: float | None, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}{unit}"


def fmt_sig(value: float | None, digits: int = 3) -> str:
    """``value`` to ``digits`` significant figures, with thousands separators from 10**digits
    up (0.00241, 12.3, 132, 2,314): a figure that may be a fraction of a second or thousands
    of tokens a second reads right either way; "—" for None or a value that is not finite."""
    if value is None or not math.isfinite(value):
        return "—"
    text = f"{value:.{digits}g}"
    if "e+" in text or abs(value) >= 10**digits:
        return f"{value:,.0f}"
    return text


def parse_acceptance(text: str | None) -> float | list[float] | None:
    """'0.7' or '0.8,0.6' (one rate per drafted position)."""
    if text is None:
        return None

    def refused(why: str) -> CapsimUserError:
        return CapsimUserError(
            f"cannot read --spec-acceptance '{text}': {why}",
            hint="give a rate such as 0.7, or one per position such as 0.8,0.6",
        )

    try:
        # plain_float, as every number: float() read '0_1' as 1.0 (issue 47, round 7)
        values = [plain_float(v) for v in text.split(",")]
    except ValueError as exc:
        raise refused(f"{exc}; rates from 0 to 1") from None
    if not all(0.0 <= v <= 1.0 for v in values):  # NaN fails this too
        raise refused("rates from 0 to 1")
    return values[0] if len(values) == 1 else values


def spec_config(spec: str | None, acceptance: str | None):
    """The SpecConfig of ``--spec`` with ``--spec-acceptance`` (None without --spec; an
    acceptance without --spec is an error)."""
    if not spec:
        if acceptance is not None:
            raise CapsimUserError(
                "--spec-acceptance needs --spec", hint="e.g. --spec mtp:2 --spec-acceptance 0.8"
            )
        return None
    from capsim.physics.speculative import parse_spec

    return parse_spec(spec, parse_acceptance(acceptance))


EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT), as a shell reports it."""


def end_worker_processes() -> None:
    """Kill (SIGKILL) every worker process this one started. Not SIGTERM: a worker forked
    while a signal handler ran in the parent can be left waiting on a lock it inherited
    locked, where no handler of its own ever runs, and it holds both ends of its pipes,
    so it never sees the parent go (CI, 2026-11-29: a validate --calibrated worker still
    asleep twelve minutes after its command exited 143)."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()


class CtrlC:
    """What a ``stop_on_ctrl_c`` block knows of Ctrl-C: whether it was pressed."""

    def __init__(self) -> None:
        self.pressed = False

    def stopped(self, exc: BaseException) -> bool:
        """Whether ``exc`` ends the block's work because of Ctrl-C: the KeyboardInterrupt
        itself or, once Ctrl-C was pressed, whatever the ended worker processes leave
        behind (a broken process pool) when the KeyboardInterrupt was raised inside a call
        that swallows exceptions (a fork hook, a finalizer) and never reached the work."""
        return isinstance(exc, KeyboardInterrupt) or self.pressed


@contextlib.contextmanager
def stop_on_ctrl_c():
    """Make Ctrl-C stop a long command within about a second, without tracebacks: the
    main process raises KeyboardInterrupt (for the command to keep and print what it
    finished) after ending the worker processes it simulates in; a worker (forked with
    this handler, and sent the same SIGINT by the terminal) ignores it and is ended.
    Yields a CtrlC: the block's ``except`` asks its ``stopped(exc)``, since the interrupt
    can be swallowed where it lands while the ended workers still break the work."""
    import os
    import signal
    import threading
    from concurrent.futures import InvalidStateError

    main = os.getpid()
    thread_hook = threading.excepthook
    unraisable_hook = sys.unraisablehook

    def quiet_pool(args) -> None:
        # a process pool whose workers were ended marks its futures broken, and trips
        # over those the interrupted map had cancelled (CPython 3.11): not the user's news
        if not isinstance(args.exc_value, InvalidStateError):
            thread_hook(args)

    def quiet_unraisable(args) -> None:
        # the KeyboardInterrupt raised inside a call that swallows exceptions (logging's
        # fork hook _releaseLock, a finalizer): CPython prints it as "Exception ignored
        # in" with a traceback; ``stopped`` already tells the block Ctrl-C was pressed
        if not isinstance(args.exc_value, KeyboardInterrupt):
            unraisable_hook(args)

    def handler(signum, frame):
        if os.getpid() != main:
            return
        ctrl_c.pressed = True
        threading.excepthook = quiet_pool
        sys.unraisablehook = quiet_unraisable
        end_worker_processes()
        raise KeyboardInterrupt

    ctrl_c = CtrlC()
    if threading.current_thread() is not threading.main_thread():
        yield ctrl_c  # signal handlers belong to the main thread: Ctrl-C stays the default
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield ctrl_c
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = unraisable_hook


said_interrupted = False
"""Whether a command said what it kept after Ctrl-C (``interrupted``); the entry point
prints a bare 'interrupted' for one that did not (Ctrl-C during start-up)."""


def interrupted(what: str) -> None:
    """After Ctrl-C: one line on stderr saying what was kept (``what``)."""
    global said_interrupted
    said_interrupted = True
    err_console.print(
        f"[bold yellow]interrupted:[/] {escape(what)}", markup=True, highlight=False, soft_wrap=True
    )


T = TypeVar("T")


def finished_before_ctrl_c(
    work: Iterator[T],
    total: int,
    what: str,
    covers: str,
    plot_path: Path | None = None,
    bar_text: str | None = None,
    shorter: str | None = None,
) -> tuple[list[T], str | None]:
    """Run ``work`` (an iterator that yields each of ``total`` finished items) until it ends
    or Ctrl-C stops it, with a bar counting the items when ``bar_text`` is given. Returns
    the items finished and, after Ctrl-C, the line that says what the output covers
    ("3 of 183 configurations simulated; the plan covers those"; ``what`` is "configurations
    simulated", ``covers`` "the plan covers those"). Ctrl-C before the first item says so
    and exits 130 here; otherwise the caller prints what finished inside
    ``exit_after_interrupt``. With ``shorter`` (how to make the run shorter), a run that
    will take long says so once on stderr (LongRunNote), in a pipe too, where no bar shows."""
    done: list[T] = []
    stopped = None
    note = LongRunNote(what, shorter) if shorter else None
    bar = progress_bar() if bar_text else contextlib.nullcontext()
    with stop_on_ctrl_c() as ctrl_c, bar:
        task = bar.add_task(bar_text, total=total) if bar_text else None
        try:
            for item in work:
                done.append(item)
                if task is not None:
                    bar.advance(task)
                if note is not None:
                    note(len(done), total)
        except BaseException as exc:
            if not ctrl_c.stopped(exc):
                raise
            stopped = f"{len(done)} of {total} {what}"
            # the item under way may have kept its finished parts (predict: its levels)
            partial = getattr(exc, "capsim_partial", None)
            if partial is not None:
                done.append(partial)
                stopped += f", and {exc.capsim_partial_text} of the next"
            stopped += f"; {covers}"
            stopped += "" if plot_path is None else " (no plot written)"
    if stopped and not done:
        noun, _, verb = what.partition(" ")
        interrupted(f"before the first of {total} {noun} was {verb}")
        raise typer.Exit(EXIT_INTERRUPTED)
    return done, stopped


@contextlib.contextmanager
def exit_after_interrupt(stopped: str | None):
    """Around printing what finished before Ctrl-C: then one line saying what it covers
    (``stopped``) and exit 130; nothing when the work was not interrupted."""
    try:
        yield
    finally:
        if stopped:
            interrupted(stopped)
            raise typer.Exit(EXIT_INTERRUPTED)


def progress_bar(counts: bool = True):
    """The bar long commands show on stderr while they work: description, bar, done of
    total (``counts``; else the share done, for a bar that measures estimated work) and
    time remaining; it disappears when done."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.table import Column

    whole = dict(no_wrap=True, overflow="fold")  # the counts and the time are never cut
    done = MofNCompleteColumn if counts else TaskProgressColumn
    return Progress(
        TextColumn(
            "[progress.description]{task.description}",
            table_column=Column(no_wrap=True, overflow="ellipsis", max_width=34),
        ),
        BarColumn(bar_width=20),
        done(table_column=Column(**whole)),
        TimeRemainingColumn(table_column=Column(**whole)),
        console=err_console,
        transient=True,
    )


LONG_RUN_NOTE_AFTER_S = 3.0
"""Seconds of work after which a long command says how long it will take (LongRunNote)."""

LONG_RUN_S = 30.0
"""Projected seconds from which a run counts as long enough to say so."""


def duration_words(seconds: float) -> str:
    """A duration for a person: '40 s', '12 min', '3.5 h'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class LongRunNote:
    """Wraps a progress callback ``(done, total)``: once LONG_RUN_NOTE_AFTER_S have passed,
    projects the whole run from the share done and, when it comes to LONG_RUN_S or more,
    says once on stderr how long is left, how to stop it and how to make it shorter. It
    says so on a terminal (above the bar) and in a pipe or a log, where no bar shows.
    ``unit`` names what ``done`` and ``total`` count."""

    def __init__(self, unit: str, shorter: str, callback=None, console=None):
        import time

        self.unit, self.shorter = unit, shorter
        self.callback = callback
        self.console = console or err_console
        self.started = time.perf_counter()
        self.said = False

    def __call__(self, done: int, total: int) -> None:
        import time

        if self.callback is not None:
            self.callback(done, total)
        if self.said or done <= 0 or total <= done:
            return
        elapsed = time.perf_counter() - self.started
        if elapsed < LONG_RUN_NOTE_AFTER_S:
            return
        left = elapsed * (total - done) / done
        self.said = True
        if elapsed + left < LONG_RUN_S:
            return
        self.console.print(
            f"note: at the pace so far, about {duration_words(left)} left ({done:,} of "
            f"{total:,} {self.unit} in {elapsed:.0f} s); Ctrl-C stops it and prints what is "
            f"finished; {self.shorter}",
            highlight=False,
        )


def fitted_table(
    title: str,
    columns: list[tuple[str, str, bool]],
    rows: list[list[str]],
    width: int | None = None,
    caption: str | None = None,
    cell_padding: int = 3,
    **table_options,
):
    """A rich Table whose values are never cut: ``columns`` are (header, justify,
    optional); while the table is wider than the terminal, optional columns are dropped,
    widest first, and the caption says which (``--json`` has every field). Should the
    columns left still not fit, the widest left-justified (text) column wraps, folding a
    long name onto more lines; the other columns never wrap. Headers may span lines
    ("TTFT\\np90 ms"); ``table_options`` go to rich's Table."""
    from rich.table import Table

    width = width or console.width
    keep = list(range(len(columns)))

    def column_width(i: int) -> int:
        header = max(len(line) for line in columns[i][0].split("\n"))
        return max([header] + [len(r[i]) for r in rows])

    def needed(idx: list[int]) -> int:
        # a cell's text plus its padding and border (``cell_padding``); plus the outer border
        return 1 + sum(cell_padding + column_width(i) for i in idx)

    dropped: list[str] = []
    while needed(keep) > width:
        optional = [i for i in keep if columns[i][2]]
        if not optional:
            break
        widest = max(optional, key=column_width)
        keep.remove(widest)
        dropped.append(columns[widest][0].replace("-\n", "").replace("\n", " "))
    notes = [caption] if caption else []
    if dropped:
        notes.append(f"not shown for width: {', '.join(dropped)} (see --json)")
    # a name a server or a file gave may hold control characters: escaped, never sent raw
    # to the terminal (issue 47: a model named ESC[31m recoloured it)
    caption_text = printable("; ".join(notes)) if notes else None
    table = Table(title=printable(title), caption=caption_text, **table_options)
    text = [i for i in keep if columns[i][1] == "left"]
    wraps = max(text, key=column_width) if text else None
    for i in keep:
        name, justify, _ = columns[i]
        if i == wraps:  # takes what the others leave, folding a long name onto more lines
            table.add_column(name, justify=justify, overflow="fold")
        else:
            table.add_column(name, justify=justify, no_wrap=True, min_width=column_width(i))
    for r in rows:
        table.add_row(*(printable(r[i]) for i in keep))
    return table


WORKLOAD_FLAGS = {
    "rate": ("--rate", ("open",)),
    "arrival": ("--arrival", ("open",)),
    "gamma_cv": ("--gamma-cv", ("open",)),
    "turns": ("--turns", ("agents",)),
    "think_time": ("--think-time", ("agents",)),
    "tool_tokens": ("--tool-tokens", ("agents",)),
    "orchestrator": ("--orchestrator", ("agents",)),
    "trace": ("--trace", ("trace",)),
    "rounds": ("--rounds", ("batch",)),
    # a trace gives every request's arrival and lengths; an open loop sets its load by
    # --rate (the levels are rates, not clients)
    "concurrency": ("--concurrency", ("closed", "batch", "agents")),
    "requests": ("--requests", ("closed", "batch", "open")),
    "input_tokens": ("--input-tokens", ("closed", "batch", "agents", "open")),
    "output_tokens": ("--output-tokens", ("closed", "batch", "agents", "open")),
    # a trace states every request's lengths and arrival: nothing is drawn
    "seed": ("--seed", ("closed", "batch", "agents", "open")),
}
"""Workload flags (parameter name: flag, the workloads it shapes): given with another
workload, they would be ignored."""


def refuse_inapplicable_flags(ctx, workload: str, arrival: str = "poisson") -> None:
    """A workload flag the user typed that the chosen workload ignores is an error, not a
    silent no-op (``--turns 8 --workload closed`` would run one-turn requests)."""
    for name, (flag, workloads) in WORKLOAD_FLAGS.items():
        # by name: typer carries its own copy of click's ParameterSource
        source = ctx.get_parameter_source(name) if name in ctx.params else None
        if getattr(source, "name", None) not in ("COMMANDLINE", "ENVIRONMENT"):
            continue
        if workload not in workloads:
            raise CapsimUserError(
                f"{flag} applies to --workload {' or '.join(workloads)}, not {workload}",
                hint=f"drop {flag}, or use --workload {workloads[0]}",
            )
        if name == "gamma_cv" and arrival != "gamma":
            raise CapsimUserError(
                "--gamma-cv applies to --arrival gamma, not poisson",
                hint="add --arrival gamma (Poisson arrivals have a CV of 1)",
            )
    typed = {
        name
        for name in ("rounds", "requests")
        if name in ctx.params
        and getattr(ctx.get_parameter_source(name), "name", None) in ("COMMANDLINE", "ENVIRONMENT")
    }
    if typed == {"rounds", "requests"}:  # --requests took over and --rounds said nothing
        raise CapsimUserError(
            "--rounds and --requests both set how many requests a batch level sends",
            hint="give one: --rounds R (R x C requests) or --requests N",
        )


ENGINE_FLAGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "scheduler_recv_interval": ("--scheduler-recv-interval", ("sglang",)),
    "mixed_chunk": ("--enable-mixed-chunk", ("sglang",)),
    "schedule_conservativeness": ("--schedule-conservativeness", ("sglang",)),
    "enable_hierarchical_cache": ("--enable-hierarchical-cache", ("sglang",)),
    "ubatch_size": ("--ubatch-size", ("llama.cpp",)),
    "flash_attn": ("--flash-attn", ("llama.cpp",)),
    "n_cpu_moe": ("--n-cpu-moe", ("llama.cpp",)),
    "cpu_offload_gb": ("--cpu-offload-gb", ("vllm", "sglang")),
    "kv_offloading_size": ("--kv-offloading-size", ("vllm",)),
    "gpu_memory_utilization": ("--gpu-memory-utilization", ("vllm", "sglang")),
    "async_scheduling": ("--async-scheduling / --no-async-scheduling", ("vllm", "sglang")),
    "disable_custom_all_reduce": ("--disable-custom-all-reduce", ("vllm", "sglang")),
    "enable_expert_parallel": ("--enable-expert-parallel", ("vllm", "sglang")),
}
"""Flags that one or two engines have (parameter name: flag, the engines that have it)."""

ENGINE_WORDS = {"vllm": "vLLM", "sglang": "SGLang", "llama.cpp": "llama.cpp"}


def refuse_flags_of_other_engines(ctx, engine: str) -> None:
    """A flag of another engine that the user typed is an error whatever its value. The
    deployment's own checks (engine/flag_checks.py, engine/setup.py) refuse such a flag
    by its value, saying what ``engine`` does instead; a value that means the same as not
    giving the flag (its default, '--flash-attn auto', '--n-cpu-moe 0',
    '--scheduler-recv-interval 1') passed them, and '--engine llama.cpp --cpu-offload-gb 0'
    ran without a word (issue 47, round 6). ``engine`` is the resolved engine's name."""
    from capsim.catalog.loader import engine_base

    base = engine_base(engine)
    if base not in ENGINE_WORDS:  # an overlay's own engine: its flags are its own
        return
    for name, (flag, owners) in ENGINE_FLAGS.items():
        if base in owners or name not in ctx.params:
            continue
        source = getattr(ctx.get_parameter_source(name), "name", None)
        if source not in ("COMMANDLINE", "ENVIRONMENT"):
            continue
        typed = value = ctx.params[name]
        default = next(p.default for p in ctx.command.params if p.name == name)
        if name == "flash_attn":  # 'auto' is the engine's own choice, as not given
            value, default = flash_attention_choice(value), None
        if value != default:
            continue  # the deployment's check says what the engine does instead
        flag = flag.split(" /")[0]
        if not isinstance(typed, bool) and typed is not None:
            flag += f" {typed:g}" if isinstance(typed, float) else f" {typed}"
        owner_words = " and ".join(f"{ENGINE_WORDS[o]}'s" for o in owners)
        raise CapsimUserError(
            f"{flag} is {owner_words} flag; {ENGINE_WORDS[base]} has none such, and given "
            "with it the flag would change nothing",
            hint=f"leave {flag.split()[0]} out with --engine {base}, or use --engine {owners[0]}",
        )


def refuse_force_without_output(force: bool, *outputs) -> None:
    """--force replaces files a command writes: with none of its ``outputs`` (paths or
    None) given, it would do nothing, and is refused as other flags that do not apply."""
    if force and all(out is None for out in outputs):
        raise CapsimUserError(
            "--force lets this command replace a file it writes, and none is asked for",
            hint="drop --force, or give the output it should replace",
        )


def refuse_links_without_tp(
    tps: list[int], interconnect: str, custom_off: bool = False, engine: str = "vllm"
) -> None:
    """--interconnect and --disable-custom-all-reduce shape the TP group's all-reduces: at
    --tp 1 no GPU exchanges activations with another, and they changed nothing without a
    word (issue 47's fourth audit: 'pcie,nvlink' gave two identical rows). Each listed link
    is checked as a kind of link first, whatever the TP size; an engine without these
    flags is left to its own message."""
    from capsim.catalog.loader import engine_base
    from capsim.cli.predict import split_list
    from capsim.physics.communication import check_interconnect

    links = [check_interconnect(link) for link in split_list(interconnect, "--interconnect")]
    if max(tps) > 1 or engine_base(engine) not in ("vllm", "sglang"):
        return
    if any(link != "auto" for link in links):
        raise CapsimUserError(
            "--interconnect sets the links a tensor-parallel group's all-reduces cross; "
            "at --tp 1 there are none",
            hint="drop --interconnect, or add --tp 2 (or more)",
        )
    if custom_off:
        raise CapsimUserError(
            "--disable-custom-all-reduce changes a tensor-parallel group's all-reduces; at "
            "--tp 1 there are none",
            hint="drop it, or add --tp 2 (or more)",
        )
