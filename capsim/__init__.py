"""capsim: capacity simulator for self-hosted LLM serving.

The Python API the ``capsim`` command is built on (capsim/api.py)::

    import capsim

    result = capsim.predict(gpu="rtx3090", model="qwen3-coder-30b-a3b", concurrency=[1, 4, 16])
    answer = capsim.capacity(gpu="rtx3090", model="qwen3-coder-30b-a3b", min_agent_tok_s=30)
    cat = capsim.load_catalog()
    fit = capsim.memory_fit(cat.gpu("rtx3090"), cat.model("qwen3-coder-30b-a3b"),
                            cat.quant("awq-int4"))

Names are imported on first use, so ``import capsim`` (and the command's start-up) stays
quick.
"""

from __future__ import annotations

from capsim.lazy import lazy_exports

TYPE_CHECKING = False  # not typing's: importing typing here delays the command's signal handlers

__version__ = "0.1.0"

_EXPORTS = {
    "predict": "capsim.api",
    "capacity": "capsim.api",
    "plan": "capsim.api",
    "validate": "capsim.api",
    "probe": "capsim.probe",  # the package, callable as capsim.api.probe (see its docstring)
    "CapsimUserError": "capsim.errors",
    "Catalog": "capsim.catalog.loader",
    "load_catalog": "capsim.api",  # the loader's, with overlays' model cards checked
    "MemoryFit": "capsim.physics.memory",
    "kv_bytes_per_token": "capsim.physics.kv_layout",
    "kv_layout": "capsim.physics.kv_layout",
    "memory_fit": "capsim.physics.memory",
    "ParameterBreakdown": "capsim.physics.parameters",
    "parameter_breakdown": "capsim.physics.parameters",
    "PredictConfig": "capsim.engine.config",
    "PredictResult": "capsim.engine.simulate",
    "LevelResult": "capsim.engine.levels",
    "CapacityAnswer": "capsim.planner.capacity",
    "PlanRequest": "capsim.planner.search",
    "PlanOutcome": "capsim.planner.search",
    "ProbeConfig": "capsim.probe.runner",
}

__all__ = [
    "CapacityAnswer",
    "CapsimUserError",
    "Catalog",
    "LevelResult",
    "MemoryFit",
    "ParameterBreakdown",
    "PlanOutcome",
    "PlanRequest",
    "PredictConfig",
    "PredictResult",
    "ProbeConfig",
    "capacity",
    "kv_bytes_per_token",
    "kv_layout",
    "load_catalog",
    "memory_fit",
    "parameter_breakdown",
    "plan",
    "predict",
    "probe",
    "validate",
]

if TYPE_CHECKING:
    from capsim.api import capacity, load_catalog, plan, predict, probe, validate
    from capsim.catalog.loader import Catalog
    from capsim.engine.config import PredictConfig
    from capsim.engine.levels import LevelResult
    from capsim.engine.simulate import PredictResult
    from capsim.errors import CapsimUserError
    from capsim.physics.kv_layout import kv_bytes_per_token, kv_layout
    from capsim.physics.memory import MemoryFit, memory_fit
    from capsim.physics.parameters import ParameterBreakdown, parameter_breakdown
    from capsim.planner.capacity import CapacityAnswer
    from capsim.planner.search import PlanOutcome, PlanRequest
    from capsim.probe.runner import ProbeConfig


__getattr__ = lazy_exports(__name__, _EXPORTS)


def __dir__() -> list[str]:
    """What ``dir(capsim)`` and completion offer: the public API and the version, not the
    names this module uses to load it lazily."""
    return sorted([*__all__, "__version__"])
