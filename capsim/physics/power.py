"""Power limit: how a board-power cap below TDP slows compute and bandwidth.

Below TDP the GPU lowers its core clock (compute scales nearly with clock) and, more
weakly, the achieved memory bandwidth (the memory clock holds, but fewer SMs in flight
sustain less of it). capsim models both as power laws of the power ratio:

    compute_scale   = min(1, P / TDP) ** compute_power_exponent
    bandwidth_scale = min(1, P / TDP) ** bandwidth_power_exponent

The exponents are calibration parameters; seed 004 measured RTX 3090s at 200, 250 and
300 W (TDP 350 W) and its figures are not monotone in power, which the calibration issue
reports rather than forces.
"""

from __future__ import annotations

import math

from capsim.catalog.gpu_schema import GPU
from capsim.errors import CapsimUserError
from capsim.notices import notice

MAX_UNSOURCED_POWER_FACTOR = 2.0
"""Highest --power-limit taken for a GPU without a settable range in the catalog, as a
multiple of its TDP (1e30 W ran at TDP with a note while a watt was refused); above TDP
capsim runs it at TDP anyway."""

MIN_UNSOURCED_POWER_FRACTION = 0.25
"""Where a GPU has no sourced settable minimum, the lowest limit accepted as a share of TDP:
the lowest sourced minimum in the catalog is a quarter of TDP (A100 80GB: 100 of 400 W,
hardware_db/gpus/a100-80g.yaml); others sit at 29-86% (H100 SXM 200 of 700 W, A10 100 of
150 W)."""


def power_scales(
    gpu: GPU, power_limit_w: float | None, compute_exponent: float, bandwidth_exponent: float
) -> tuple[float, float]:
    """(compute_scale, bandwidth_scale) in (0, 1] for a power limit in watts."""
    if power_limit_w is None:
        return 1.0, 1.0
    if not math.isfinite(power_limit_w) or power_limit_w <= 0:
        raise CapsimUserError(
            f"--power-limit must be a positive number of watts, got {power_limit_w:g}"
        )
    if gpu.tdp_w is None:
        raise CapsimUserError(
            f"{gpu.name} has no TDP in the catalog, so a power limit cannot be applied",
            hint="add tdp_w to the GPU's YAML or drop --power-limit",
        )
    settable = gpu.power_limit_w
    low = settable.min_w if settable is not None else None
    high = settable.max_w if settable is not None else None
    if (low is not None and power_limit_w < low) or (high is not None and power_limit_w > high):
        raise CapsimUserError(
            f"--power-limit {power_limit_w:g} W is outside the range {gpu.name} can be set "
            f"to: {low or '?'}-{high or '?'} W",
            hint=f"from {settable.source.title}" if settable is not None else "",
        )
    if high is None and power_limit_w > MAX_UNSOURCED_POWER_FACTOR * gpu.tdp_w:
        raise CapsimUserError(
            f"--power-limit {power_limit_w:g} W is above {MAX_UNSOURCED_POWER_FACTOR:g}x "
            f"{gpu.name}'s TDP ({gpu.tdp_w:g} W)",
            hint="the catalog has no settable range for this GPU; no board's driver lets it "
            "draw that much (add power_limit_w.max_w with a source to the GPU's YAML)",
        )
    if power_limit_w > gpu.tdp_w:
        notice(
            f"--power-limit {power_limit_w:g} W is above {gpu.name}'s TDP ({gpu.tdp_w:g} W): "
            "capsim runs it at TDP (the catalog has no figures above it)"
        )
    elif low is None and power_limit_w < MIN_UNSOURCED_POWER_FRACTION * gpu.tdp_w:
        raise CapsimUserError(
            f"--power-limit {power_limit_w:g} W is below "
            f"{MIN_UNSOURCED_POWER_FRACTION:.0%} of {gpu.name}'s TDP ({gpu.tdp_w:g} W)",
            hint="the catalog has no settable range for this GPU; drivers refuse limits "
            "this low (add power_limit_w.min_w with a source to the GPU's YAML)",
        )
    ratio = min(1.0, power_limit_w / gpu.tdp_w)
    return ratio**compute_exponent, ratio**bandwidth_exponent
