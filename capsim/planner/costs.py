"""What a configuration costs: purchase plus energy over a horizon, per million tokens.

* purchase = GPU price (catalog, dated) x GPU count
* energy = TDP x power fraction x GPU count x hours in the horizon x price per kWh, where
  the power fraction is the power limit over TDP (1 without a limit). Drawing TDP the whole
  time is an upper bound for a box kept busy; real draw is lower when idle.
* cost per million output tokens = (purchase + energy) / (output tok/s x seconds in the
  horizon) x 1e6, as if the box served at the simulated rate the whole time.
* or, with a cloud price per GPU-hour, cost = hourly x GPU count x hours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from capsim.catalog.gpu_schema import GPU
from capsim.errors import CapsimUserError

HOURS_PER_YEAR = 8760.0


@dataclass(frozen=True)
class CostModel:
    """How a configuration's cost is counted: over ``years`` of use (> 0), energy at
    ``kwh_price_usd`` per kWh (>= 0), or GPUs rented at ``cloud_usd_per_gpu_hour``."""

    years: float = 3.0
    kwh_price_usd: float = 0.15
    cloud_usd_per_gpu_hour: float | None = None

    def __post_init__(self) -> None:
        checks = (
            ("--years", self.years, self.years > 0, "a positive number of years"),
            ("--kwh-price", self.kwh_price_usd, self.kwh_price_usd >= 0, "0 or more USD"),
            (
                "--cloud-hourly",
                self.cloud_usd_per_gpu_hour,
                self.cloud_usd_per_gpu_hour is None or self.cloud_usd_per_gpu_hour >= 0,
                "0 or more USD per GPU-hour",
            ),
        )
        for flag, value, ok, allowed in checks:
            if not ok or (value is not None and not math.isfinite(value)):
                raise CapsimUserError(f"{flag} {value:g}: must be {allowed}")


@dataclass(frozen=True)
class Cost:
    purchase_usd: float | None
    energy_usd: float | None
    total_usd: float | None
    usd_per_million_output_tokens: float | None


def cost_of(
    gpu: GPU, count: int, output_tok_s: float, model: CostModel, power_limit_w: float | None = None
) -> Cost:
    hours = model.years * HOURS_PER_YEAR
    if model.cloud_usd_per_gpu_hour is not None:
        total = model.cloud_usd_per_gpu_hour * count * hours
        purchase = None
        energy = None
    else:
        purchase = gpu.price.usd * count if gpu.price else None
        energy = None
        if gpu.tdp_w:
            watts = min(power_limit_w or gpu.tdp_w, gpu.tdp_w)
            energy = watts / 1000 * count * hours * model.kwh_price_usd
        total = purchase + energy if purchase is not None and energy is not None else None
    per_million = None
    if total is not None and output_tok_s > 0:
        per_million = total / (output_tok_s * hours * 3600) * 1e6
    return Cost(purchase, energy, total, per_million)
