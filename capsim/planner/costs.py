"""What a configuration costs: purchase plus energy over a horizon, per million tokens.

* purchase = GPU price (catalog, dated) x GPU count
* energy = board power x GPU count x hours in the horizon x duty cycle x price per kWh,
  where board power is the power limit (TDP without one) and the duty cycle the share of
  the horizon the box serves at the simulated load (default 1: around the clock). Board
  power at its limit is an upper bound for a busy GPU (a memory-bound decode draws less);
  idle draw in the rest of the horizon is not counted (no sourced idle power per GPU).
* cost per million output tokens = (purchase + energy) / (output tok/s x seconds in the
  horizon x duty cycle) x 1e6: the tokens the box serves in its serving hours.
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
    duty_cycle: float = 1.0

    def __post_init__(self) -> None:
        # the ceilings are far beyond any real value (retail power tops out near 1 USD a
        # kWh, an 8-GPU cloud node near 100 USD an hour): a larger one is a typo, and
        # 1e308 made the cost columns infinite
        hourly = self.cloud_usd_per_gpu_hour
        checks = (
            (
                "--years",
                self.years,
                0.01 <= self.years <= 100,
                "from 0.01 to 100 years",  # 1e-300 garbled the cost columns
            ),
            (
                "--kwh-price",
                self.kwh_price_usd,
                0 <= self.kwh_price_usd <= 100,
                "0 to 100 USD",
            ),
            (
                "--cloud-hourly",
                hourly,
                hourly is None or 0 <= hourly <= 10_000,
                "0 to 10,000 USD per GPU-hour",
            ),
        )
        checks += (
            (
                "--duty-cycle",
                self.duty_cycle,
                0.001 <= self.duty_cycle <= 1,
                "a share from 0.001 to 1",
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
    serving_hours = hours * model.duty_cycle
    if model.cloud_usd_per_gpu_hour is not None:
        total = model.cloud_usd_per_gpu_hour * count * serving_hours
        purchase = None
        energy = None
    else:
        purchase = gpu.price.usd * count if gpu.price else None
        energy = None
        if gpu.tdp_w:
            watts = min(power_limit_w or gpu.tdp_w, gpu.tdp_w)
            energy = watts / 1000 * count * serving_hours * model.kwh_price_usd
        total = purchase + energy if purchase is not None and energy is not None else None
    per_million = None
    if total is not None and output_tok_s > 0:
        per_million = total / (output_tok_s * serving_hours * 3600) * 1e6
    return Cost(purchase, energy, total, per_million)


def cost_assumptions(model: CostModel, gpus: list[GPU]) -> dict:
    """What the cost columns assume, for the table's caption and the JSON: the horizon,
    duty cycle, electricity price (or cloud rate), and each GPU's price with its kind
    (launch MSRP, street, used...), date and source."""
    return {
        "horizon_years": model.years,
        "duty_cycle": model.duty_cycle,
        "kwh_price_usd": None if model.cloud_usd_per_gpu_hour is not None else model.kwh_price_usd,
        "cloud_usd_per_gpu_hour": model.cloud_usd_per_gpu_hour,
        "power": "board power at the power limit (TDP without one) while serving; idle draw "
        "not counted",
        "gpu_prices": {
            g.name: None
            if g.price is None
            else {
                "usd": g.price.usd,
                "kind": g.price.kind,
                "date": g.price.date.isoformat(),
                "source": g.price.source.url or g.price.source.title,
            }
            for g in gpus
        },
    }


def cost_caption(model: CostModel, gpus: list[GPU]) -> str:
    """One paragraph saying how the table's costs were counted."""
    serving = f"{model.duty_cycle:.0%} of {model.years:g} years"
    if model.cloud_usd_per_gpu_hour is not None:
        return f"cost: ${model.cloud_usd_per_gpu_hour:g} per GPU-hour for {serving}"
    prices = ", ".join(
        f"{g.name} ${g.price.usd:,.0f} {g.price.kind} {g.price.date.isoformat()}"
        if g.price
        else f"{g.name} no price"
        for g in gpus
    )
    return (
        f"cost: purchase ({prices}) + energy at board power (TDP or the limit) serving "
        f"{serving} at ${model.kwh_price_usd:g}/kWh, idle draw not counted; $/Mtok over "
        "the tokens served in those hours (--duty-cycle, --years, --kwh-price)"
    )
