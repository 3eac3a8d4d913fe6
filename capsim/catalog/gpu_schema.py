"""Schema of a GPU in the catalog (hardware_db/gpus/): datasheet figures, interconnect,
prices and power limits, each with its source."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import Field, StrictBool, field_validator, model_validator

from capsim.catalog.schemas import DTYPES, Source, Strict, catalog_key

PLAUSIBLE = {
    "memory_gb": 100_000.0,
    "bandwidth_gb_s": 1_000_000.0,
    "tflops": 1_000_000.0,
    "link_gb_s": 100_000.0,
    "watts": 100_000.0,
    "usd": 100_000_000.0,
    "cache_mb": 100_000.0,
    "latency_us": 1_000_000.0,
    "sm_count": 100_000,
}
"""Upper bounds of a device figure a catalog file may give: about a hundred times the
largest of today's parts (288 GB and 8 TB/s of HBM, 15 PFLOPS of FP4, 900 GB/s of NVLink,
1.4 kW). A figure beyond is a typo or a unit slip (TB/s written as GB/s twice), which would
otherwise be simulated: a --db GPU with 1e30 GB/s ran and answered nonsense (issue 47)."""


MIN_BANDWIDTH_GB_S = 1.0
"""Lowest memory bandwidth a catalog device may give, GB/s: below the slowest memory any
model is served from (a single DDR3 channel is 6-13 GB/s); 1e-300 was accepted and
predicted 5e-302 tok/s in a table it broke (issue 47)."""


class Price(Strict):
    """A purchase price of one GPU in US dollars on a date."""

    usd: float = Field(
        gt=0,
        le=PLAUSIBLE["usd"],
        description="Price of one GPU (or one GPU's share of a system), USD",
    )
    date: dt.date = Field(description="When that price applied")
    kind: Literal["launch-msrp", "street", "used", "list", "estimate"] = Field(
        "launch-msrp",
        description="launch-msrp: the vendor's launch price; list: a reseller's or vendor's "
        "current list price; street: typical retail; used: second-hand; estimate: an analyst's "
        "or press figure where the vendor publishes none (say whose in the source)",
    )
    source: Source


class CloudPrice(Strict):
    """What one GPU costs to rent per hour from a named provider."""

    usd_per_gpu_hour: float = Field(gt=0, description="USD per GPU per hour, on demand")
    provider: str = Field(description="Who rents it at that price, e.g. 'Lambda', 'AWS'")
    date: dt.date
    source: Source


class PowerLimitRange(Strict):
    """The board power limits a user can set (nvidia-smi -pl, rocm-smi), W."""

    min_w: float | None = Field(
        default=None, gt=0, le=PLAUSIBLE["watts"], description="Lowest settable limit, W"
    )
    max_w: float | None = Field(
        default=None, gt=0, le=PLAUSIBLE["watts"], description="Highest settable limit, W"
    )
    source: Source

    @model_validator(mode="after")
    def _in_order(self) -> PowerLimitRange:
        if self.min_w is not None and self.max_w is not None and self.min_w > self.max_w:
            raise ValueError(f"min_w {self.min_w:g} W is above max_w {self.max_w:g} W")
        return self


class Interconnect(Strict):
    """One way GPUs of this kind talk to each other."""

    kind: Literal["nvlink", "pcie", "infinity-fabric", "xe-link", "nvlink-c2c", "none"]
    topology: Literal["switch", "bridge", "mesh", "host"] | None = Field(
        default=None,
        description="How a group is joined: 'switch' (NVSwitch: every GPU at full bandwidth to "
        "all, in-switch reduction where supported), 'bridge' (a point-to-point bridge between "
        "2-4 cards), 'mesh' (a direct link to each peer, e.g. MI300X's xGMI), 'host' (through "
        "the CPU's PCIe root complex or a PCIe switch)",
    )
    generation: float | None = Field(default=None, description="NVLink or PCIe generation")
    lanes: int | None = Field(default=None, ge=1, description="PCIe lanes")
    bandwidth_gb_s_per_direction: float | None = Field(
        default=None,
        gt=0,
        le=PLAUSIBLE["link_gb_s"],
        description="Peak GPU-to-GPU bandwidth one way, GB/s (1e9 bytes/s)",
    )
    latency_us: float | None = Field(
        default=None,
        ge=0,
        le=PLAUSIBLE["latency_us"],
        description="One-hop latency in microseconds, where a source gives it",
    )
    max_gpus: int | None = Field(
        default=None,
        ge=2,
        description="Most GPUs this link joins in one group (a consumer NVLink bridge joins 2; "
        "an NVSwitch baseboard 8); None for PCIe, which any number share through the host",
    )
    note: str | None = None


class TensorThroughput(Strict):
    """Dense (no structured sparsity) tensor-core peak throughput, TFLOPS or TOPS.

    For fp16/bf16 the figure is with FP32 accumulation where the vendor distinguishes,
    since that is what inference GEMMs use. ``None`` means no native support or unknown.
    """

    bf16: float | None = Field(default=None, gt=0, le=PLAUSIBLE["tflops"])
    fp16: float | None = Field(default=None, gt=0, le=PLAUSIBLE["tflops"])
    fp8: float | None = Field(default=None, gt=0, le=PLAUSIBLE["tflops"])
    int8: float | None = Field(default=None, gt=0, le=PLAUSIBLE["tflops"])
    int4: float | None = Field(default=None, gt=0, le=PLAUSIBLE["tflops"])
    fp4: float | None = Field(default=None, gt=0, le=PLAUSIBLE["tflops"])


class GPU(Strict):
    """One accelerator model (a GPU or an APU's integrated GPU)."""

    name: str = catalog_key("catalog key, lower-case, e.g. 'rtx3090'")
    display_name: str
    aliases: list[str] = Field(default_factory=list)
    vendor: Literal["nvidia", "amd", "intel", "apple", "generic"]
    architecture: str = Field(description="e.g. 'ampere', 'hopper', 'cdna3', 'xe2'")
    hardware_class: str = Field(
        description="Group whose default efficiency parameters apply, e.g. 'consumer-ampere'"
    )
    memory_gb: float = Field(
        gt=0, le=PLAUSIBLE["memory_gb"], description="Device memory as marketed, GB"
    )
    memory_type: str | None = None
    unified_memory: StrictBool = Field(
        default=False,
        description="One memory shared by the CPU and the GPU (an APU, Apple silicon, "
        "GB10): weights 'in system RAM' would sit in the same memory",
    )
    usable_memory_gb: float | None = Field(
        default=None,
        gt=0,
        le=PLAUSIBLE["memory_gb"],
        description="Memory the GPU can use for serving where less than memory_gb "
        "(e.g. an APU's share of system RAM), GB",
    )
    memory_bandwidth_gb_s: float = Field(
        ge=MIN_BANDWIDTH_GB_S,
        le=PLAUSIBLE["bandwidth_gb_s"],
        description="Peak DRAM bandwidth, GB/s",
    )
    l2_cache_mb: float | None = Field(
        default=None, gt=0, le=PLAUSIBLE["cache_mb"], description="L2 or last-level cache, MB"
    )
    tensor_tflops: TensorThroughput = Field(description="Dense peak tensor throughput")
    vector_fp32_tflops: float | None = Field(
        default=None,
        gt=0,
        le=PLAUSIBLE["tflops"],
        description="Peak non-tensor FP32 throughput (the SMs' FMA units), TFLOPS: the "
        "rate of the units beside the tensor cores, which a compute-bound kernel also keeps "
        "busy (softmax, epilogues, address arithmetic). Against the tensor rate it says "
        "whether a part's tensor cores are throttled relative to its class's reference "
        "(physics/tensor_throttle.py); None: unknown",
    )
    sm_count: int | None = Field(
        default=None,
        gt=0,
        le=PLAUSIBLE["sm_count"],
        description="Streaming multiprocessors (compute units) the product enables, as "
        "deviceQuery or the vendor reports them: how many thread blocks of a kernel run at "
        "once, one a multiprocessor, which a GEMM of few output tiles leaves idle "
        "(physics/gemm_tiles.py). Each with its source among the sources; None: unknown",
    )
    native_formats: list[str] = Field(
        description="Data types the tensor cores execute natively (subset of bf16, fp16, fp8, "
        "int8, int4, fp4)"
    )
    interconnects: list[Interconnect] = Field(default_factory=list)
    tdp_w: float | None = Field(
        default=None, gt=0, le=PLAUSIBLE["watts"], description="Board power (TDP/TBP), W"
    )
    power_limit_w: PowerLimitRange | None = Field(
        default=None, description="Settable power-limit range, where a source gives it"
    )
    price: Price | None = None
    cloud_price: CloudPrice | None = None
    listed: StrictBool = Field(
        default=True, description="Shown in default listings (False: test or host entries)"
    )
    sources: list[Source] = Field(min_length=1)
    notes: str | None = None
    efficiency: dict[str, float] = Field(
        default_factory=dict,
        description="Efficiency parameters measured on this GPU itself where they differ "
        "from its hardware class's (hardware_db/efficiency/CLASS.yaml), laid over them; "
        "each with its measurement among the sources",
    )

    @field_validator("native_formats")
    @classmethod
    def _known_formats(cls, v: list[str]) -> list[str]:
        unknown = sorted(set(v) - set(DTYPES))
        if unknown:
            raise ValueError(f"unknown native format(s) {unknown}; known: {list(DTYPES)}")
        return v

    @model_validator(mode="after")
    def _usable_within_memory(self) -> GPU:
        if self.usable_memory_gb is not None and self.usable_memory_gb > self.memory_gb:
            raise ValueError(
                f"usable_memory_gb ({self.usable_memory_gb:g} GB) is above memory_gb "
                f"({self.memory_gb:g} GB): the usable memory is a part of the device's, at "
                "most memory_gb"
            )
        return self

    @property
    def serving_memory_gb(self) -> float:
        """Memory available to a serving engine, GB (usable_memory_gb if set)."""
        return self.usable_memory_gb if self.usable_memory_gb is not None else self.memory_gb

    @property
    def memory_bytes(self) -> float:
        """Serving memory in bytes.

        Convention: vendors' 'GB' for VRAM/HBM are binary (a '24 GB' RTX 3090 reports
        24,576 MiB), so capacity in bytes = memory_gb x 2**30.
        """
        return self.serving_memory_gb * 2**30

    def interconnect(self, kind: str) -> Interconnect | None:
        """The first interconnect of a kind ('nvlink', 'pcie', ...), or None."""
        for ic in self.interconnects:
            if ic.kind == kind:
                return ic
        return None
