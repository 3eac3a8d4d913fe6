"""Catalog layer: pydantic schemas and loading of hardware_db/ plus user overlays.

Names are imported on first use (the CLI's start-up needs none of them)."""

from capsim.lazy import lazy_exports

ENV_VAR = "CAPSIM_DB"
"""Environment variable naming extra catalog directories (os.pathsep-separated)."""

_EXPORTS = {
    "Catalog": "capsim.catalog.loader",
    "builtin_db_dir": "capsim.catalog.loader",
    "load_catalog": "capsim.catalog.loader",
    "GPU": "capsim.catalog.gpu_schema",
    "Model": "capsim.catalog.model_schema",
    "QuantFormat": "capsim.catalog.model_schema",
    "Source": "capsim.catalog.schemas",
}

__all__ = [
    "ENV_VAR",
    "GPU",
    "Catalog",
    "Model",
    "QuantFormat",
    "Source",
    "builtin_db_dir",
    "load_catalog",
]

__getattr__ = lazy_exports(__name__, _EXPORTS)
