"""capsim: capacity simulator for self-hosted LLM serving.

The Python API under the ``capsim`` command::

    from capsim import load_catalog, memory_fit
    cat = load_catalog()
    fit = memory_fit(cat.gpu("rtx3090"), cat.model("qwen3-coder-30b-a3b"), cat.quant("awq-int4"))
    print(fit.kv_capacity_tokens)
"""

from capsim.catalog.loader import Catalog, load_catalog
from capsim.errors import CapsimUserError
from capsim.physics.memory import MemoryFit, kv_bytes_per_token, kv_layout, memory_fit
from capsim.physics.parameters import ParameterBreakdown, parameter_breakdown

__version__ = "0.1.0"

__all__ = [
    "CapsimUserError",
    "Catalog",
    "MemoryFit",
    "ParameterBreakdown",
    "kv_bytes_per_token",
    "kv_layout",
    "load_catalog",
    "memory_fit",
    "parameter_breakdown",
]
