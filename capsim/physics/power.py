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

from capsim.catalog.schemas import GPU
from capsim.errors import CapsimUserError


def power_scales(
    gpu: GPU, power_limit_w: float | None, compute_exponent: float, bandwidth_exponent: float
) -> tuple[float, float]:
    """(compute_scale, bandwidth_scale) in (0, 1] for a power limit in watts."""
    if power_limit_w is None:
        return 1.0, 1.0
    if power_limit_w <= 0:
        raise CapsimUserError(f"power limit must be positive, got {power_limit_w} W")
    if gpu.tdp_w is None:
        raise CapsimUserError(
            f"{gpu.name} has no TDP in the catalog, so a power limit cannot be applied",
            hint="add tdp_w to the GPU's YAML or drop --power-limit",
        )
    ratio = min(1.0, power_limit_w / gpu.tdp_w)
    return ratio**compute_exponent, ratio**bandwidth_exponent
