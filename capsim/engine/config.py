"""What a prediction is asked: the deployment, the workload and the load levels
(``PredictConfig``), validated where it is built."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from capsim.engine.lengths import number_text, parse_length
from capsim.engine.limits import MAX_CONCURRENCY, MAX_GPUS, MAX_SEED, MAX_TP
from capsim.engine.router import RouterPolicy
from capsim.engine.workloads import WorkloadKind
from capsim.physics.kv_layout import BLOCK_SIZE_TOKENS
from capsim.physics.speculative import SpecConfig

MAX_REQUESTS = 10_000_000
"""The most requests one level may simulate: about a minute on this 2-core host (capsim
predict -c 64 --requests 200000 took 1.6 s, 2026-11-29), far past any converged figure;
more is refused up front rather than left to run for hours."""

MIN_HOST_SIZE_GB = 0.001
"""The least size in system RAM --cpu-offload-gb, --kv-offloading-size and --hicache-size
take above 0 (about a MiB, the least a weight tensor or a KV block moves)."""
MAX_BATCH_ROUNDS = 10_000
"""The most rounds of the batch workload per level."""


class PredictConfig(BaseModel):
    """Everything one prediction needs; field names follow the CLI flags."""

    model_config = ConfigDict(extra="forbid")

    gpu: str
    model: str
    quant: str | None = None
    gpus: int | None = Field(None, ge=1, le=MAX_GPUS, description="GPUs in total (default tp x dp)")
    tp: int = Field(1, ge=1, le=MAX_TP)
    dp: int | None = Field(None, ge=1, le=MAX_GPUS, description="Replicas (default gpus / tp)")
    pp: int = Field(
        1,
        ge=1,
        le=MAX_TP,
        description="Pipeline stages per replica (--pipeline-parallel-size), each a TP group "
        "of --tp GPUs holding its share of the layers",
    )
    interconnect: str = "auto"
    kv_dtype: str = "auto"
    workload: WorkloadKind = "closed"
    concurrency: list[Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)]] = Field(
        default_factory=lambda: [1], min_length=1, max_length=4096
    )
    rates: list[Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]] = Field(
        default_factory=list, max_length=4096, description="Open-loop arrival rates"
    )
    requests: int | None = Field(None, ge=1, le=MAX_REQUESTS, description="Requests per level")
    batch_rounds: int = Field(
        4,
        ge=1,
        le=MAX_BATCH_ROUNDS,
        description="Batch workload: rounds per level when --requests is not given",
    )
    input_tokens: str = "1024"
    output_tokens: str = "512"
    turns: int = 4
    think_time: str = "0"
    tool_tokens: str = "256"
    orchestrator: StrictBool = False
    arrival: Literal["poisson", "gamma"] = "poisson"
    gamma_cv: float = 2.0  # the CLI's --gamma-cv default: gamma arrivals are chosen for bursts
    trace: str | None = None
    max_num_seqs: int | None = Field(None, ge=1, description="Default: vLLM's for the GPU")
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="Default: vLLM's for the GPU"
    )
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = Field(
        None,
        ge=0.001,  # 1e-320 was taken, and answered '0.0 GiB is usable'
        le=1,
        description="Share of GPU memory the engine may use (None: its own)",
    )
    spec: SpecConfig | None = None
    prefix_caching: StrictBool = True
    power_limit_w: float | None = Field(
        None,
        gt=0,  # 0, -1 and NaN were a pydantic ValidationError from inside the simulation
        allow_inf_nan=False,
        description="Board power cap, W (above the GPU's TDP: runs at TDP, with a note)",
    )
    enforce_eager: StrictBool = False
    attention_backend: str | None = Field(
        None,
        description="--attention-backend (SGLang's and vLLM's names); None: the engine's "
        "choice for the model",
    )
    flash_attention: StrictBool | None = Field(
        None,
        description="llama.cpp's --flash-attn on (True) or off (False); None: the engine's "
        "default for its release (off before b6327, auto since, which is on for the GPUs "
        "capsim models)",
    )
    async_scheduling: StrictBool | None = Field(
        None,
        description="False = --no-async-scheduling (host work runs between steps); None: "
        "the engine's default",
    )
    custom_allreduce: StrictBool | None = Field(
        None,
        description="False = --disable-custom-all-reduce (NCCL for every all-reduce); None: "
        "the engine's default",
    )
    engine: str = Field("vllm", description="Serving engine (hardware_db/engines/)")
    ubatch_tokens: int | None = Field(
        None, ge=1, description="Physical batch, tokens (llama.cpp's -ub; None: the engine's)"
    )
    expert_parallel: StrictBool = Field(
        False,
        description="Routed experts split whole over the TP group (vLLM's "
        "--enable-expert-parallel; SGLang's --ep-size equal to --tp)",
    )
    dp_attention: int = Field(
        1,
        ge=1,
        le=MAX_GPUS,
        description="Data-parallel attention ranks inside each TP group (SGLang's "
        "--enable-dp-attention --dp-size N); 1: plain tensor parallelism",
    )
    prefill_replicas: int = Field(
        0,
        ge=0,
        le=MAX_GPUS,
        description="Disaggregated prefill and decode: instances that only prefill (each a "
        "TP group of --prefill-tp GPUs), the --dp replicas then only decode; 0: every "
        "replica prefills and decodes its own requests",
    )
    prefill_tp: int | None = Field(
        None, ge=1, le=MAX_TP, description="TP size of each prefill instance (default --tp)"
    )
    kv_transfer_gbs: float | None = Field(
        None,
        gt=0,
        le=100_000,
        description="Link a prompt's KV crosses from prefill to decode, GB/s per GPU per "
        "direction (default: NVLink where every GPU fits in one NVLink domain, else the "
        "GPU's PCIe link)",
    )
    cpu_moe_layers: int = Field(
        0,
        ge=0,
        le=10_000,
        description="MoE layers whose routed experts stay in system RAM (llama.cpp's --n-cpu-moe)",
    )
    cpu_offload_gb: float = Field(
        0.0,
        ge=0,
        le=100_000,
        description="GiB of each GPU's weights kept in pinned system RAM and read over the "
        "host link every pass (vLLM's and SGLang's --cpu-offload-gb)",
    )
    kv_offloading_gb: float = Field(
        0.0,
        ge=0,
        le=100_000,
        description="GiB of system RAM a replica keeps prefix-cache blocks in besides the "
        "GPU's cache (vLLM's --kv-offloading-size, summed over its TP ranks); 0: none",
    )
    hierarchical_cache: StrictBool = Field(
        False,
        description="SGLang's --enable-hierarchical-cache (HiCache): a host KV pool "
        "--hicache-ratio times the GPU's (or --hicache-size GB a GPU) that keeps the prefix "
        "cache's blocks besides the GPU's, loaded back on a hit",
    )
    hicache_ratio: float = Field(
        2.0, gt=0, le=1_000, description="SGLang's --hicache-ratio: host pool over device pool"
    )
    hicache_size_gb: float = Field(
        0.0,
        ge=0,
        le=100_000,
        description="SGLang's --hicache-size: the host pool in GB a GPU, over the ratio; 0: "
        "the ratio",
    )
    host_memory_bandwidth_gbs: float | None = Field(
        None, gt=0, le=100_000, description="System RAM read bandwidth, GB/s (with --n-cpu-moe)"
    )
    host_link_gbs: float | None = Field(
        None,
        gt=0,
        le=100_000,
        description="Host-to-GPU link, GB/s per direction (default: the GPU's PCIe link)",
    )
    scheduler_recv_interval: int = Field(
        1,
        ge=1,
        le=10_000,
        description="SGLang's --scheduler-recv-interval: decode steps between the "
        "scheduler's polls for new requests (1: every step)",
    )
    schedule_conservativeness: float | None = Field(
        None,
        ge=0,
        le=100,
        description="SGLang's --schedule-conservativeness: scales the admission reserve's "
        "starting ratio (0.7 x this, at most 1; 0 reserves nothing for running requests). "
        "None: SGLang's default, 1",
    )
    mixed_chunk: StrictBool = Field(
        False,
        description="SGLang's --enable-mixed-chunk: its prefill chunks share a step with "
        "the decodes (as vLLM's always do) instead of running in batches of their own",
    )
    offline: StrictBool = Field(
        False,
        description="Requests go straight to the engine (llama-bench, vllm bench "
        "throughput/latency, an in-process LLM.generate): no API server, tokenizer or "
        "streaming latency in TTFT and end-to-end time",
    )
    router: RouterPolicy = "round_robin"
    # the CLI's bounds (--router-latency-ms 0 to 60,000; --router-capacity-rps above 0, at
    # most 1e9): a negative latency was a SimPy error, NaN an error of the level's metrics
    router_latency_s: float = Field(0.0, ge=0, le=60.0, allow_inf_nan=False)
    router_capacity_rps: float | None = Field(None, gt=0, le=1e9, allow_inf_nan=False)
    seed: int = Field(
        0, ge=0, le=MAX_SEED, description="Random seed (a whole number from 0 to 2**64 - 1)"
    )
    fast_forward: StrictBool = True
    skip_periods: StrictBool = Field(
        True,
        description="Lay down whole periods of a closed loop's repeating steady state as "
        "copies instead of simulating them again (engine/periodic.py; same figures)",
    )
    efficiency_overrides: dict[str, float | None] = Field(
        default_factory=dict,
        description="Efficiency parameters laid over the defaults (None unsets an optional "
        "one, as a prior put back to its absence)",
    )
    kv_capacity_tokens: int | None = Field(
        None, ge=BLOCK_SIZE_TOKENS, description="Pin the KV pool size (e.g. from a probe)"
    )
    profile: str = Field(
        "auto",
        description="Calibration profile: auto (the GPU class's, if any), none, a name or a path",
    )

    @field_validator("efficiency_overrides", mode="before")
    @classmethod
    def _known_parameters_in_range(cls, value):
        """Each override a known parameter within its range (a boolean is no number): a bad
        one was a ValidationError or ValueError from deep in the simulation (issue 47)."""
        from capsim.physics.efficiency import override_problem

        if isinstance(value, dict) and value:
            problem = override_problem(value)
            if problem is not None:
                text, close = problem
                raise ValueError(text + (f" (did you mean: {', '.join(close)}?)" if close else ""))
        return value

    @field_validator("cpu_offload_gb", "kv_offloading_gb", "hicache_size_gb")
    @classmethod
    def _none_or_a_real_size(cls, value: float) -> float:
        """A size in system RAM is 0 (none) or at least MIN_HOST_SIZE_GB: 1e-320 passed
        'ge=0' as an offload, let --host-link-bandwidth through and printed '+9.99989e-321
        GiB weights in RAM' (issue 47, round 7)."""
        if 0 < value < MIN_HOST_SIZE_GB:
            raise ValueError(
                f"0 (none) or at least {MIN_HOST_SIZE_GB:g} GiB (a MiB); a smaller size "
                "offloads nothing"
            )
        return value

    @field_validator("input_tokens", "output_tokens", "think_time", "tool_tokens", mode="before")
    @classmethod
    def _a_number_is_its_text(cls, value):
        """``input_tokens=1000`` in the Python API is the CLI's '1000' (a bool is not)."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            return number_text(value)
        return value

    @field_validator("input_tokens", "output_tokens")
    @classmethod
    def _at_least_one_token(cls, value: str, info) -> str:
        parse_length(value, "--" + info.field_name.replace("_", "-"), minimum=1)
        return value

    @model_validator(mode="after")
    def _levels_within_bounds(self) -> PredictConfig:
        """The agents workload sends C x turns requests a level, each drawn up front, and
        the batch workload C x rounds (without --requests): a level beyond MAX_REQUESTS is
        refused (100,000 agents of 1,000 turns took 3 GB; 100,000 x 10,000 rounds ran on)."""
        per_client = {"agents": (self.turns, "--turns")}
        if self.requests is None:
            per_client["batch"] = (self.batch_rounds, "--rounds")
        if self.workload not in per_client or not self.concurrency:
            return self
        each, flag = per_client[self.workload]
        level = max(self.concurrency)
        if level * each > MAX_REQUESTS:
            from capsim.errors import CapsimUserError  # not a ValueError: said as is

            raise CapsimUserError(
                f"--workload {self.workload} sends concurrency x {flag} requests a level: "
                f"{level:,} x {each:,} = {level * each:,}, above the {MAX_REQUESTS:,} capsim "
                "simulates",
                hint=f"a lower concurrency or fewer {flag}",
            )
        return self

    def default_requests(self, level: int) -> int:
        """Requests per level when --requests is not given."""
        if self.workload == "batch":
            return self.batch_rounds * level
        return max(8 * level, 32)
