"""Schema of a reference host memory system (hardware_db/hosts/): how fast a desktop's CPU
reads its own RAM, as measured, for the configurations that keep model weights in system
RAM (llama.cpp's --n-cpu-moe).

capsim never guesses a user's host: ``--host-memory-bandwidth`` takes their own figure.
These entries are measured examples of common desktops that ``capsim fit`` prices its
offload proposals at, each with where its figure came from."""

from __future__ import annotations

from pydantic import Field

from capsim.catalog.schemas import Source, Strict, catalog_key


class HostMemory(Strict):
    """One measured host memory system: its DRAM, the CPU that read it and the bandwidth
    a benchmark measured (GB/s, 10^9 bytes a second, reading)."""

    name: str = catalog_key("Catalog key, e.g. 'ddr5-5600-2ch'")
    display_name: str = Field(description="Short label, e.g. 'DDR5-5600 2ch'")
    aliases: list[str] = Field(default_factory=list)
    memory: str = Field(description="The DRAM: type, speed and channels, as the source says")
    cpu: str | None = Field(default=None, description="The CPU the figure was measured on")
    read_bandwidth_gbs: float = Field(
        gt=0, le=10_000, description="Measured memory read bandwidth (GB/s)"
    )
    measured_with: str = Field(description="The benchmark that measured it (AIDA64, ...)")
    sources: list[Source] = Field(min_length=1)
