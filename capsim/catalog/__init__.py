"""Catalog layer: pydantic schemas and loading of hardware_db/ plus user overlays."""

from capsim.catalog.loader import Catalog, builtin_db_dir, load_catalog
from capsim.catalog.schemas import GPU, Model, QuantFormat, Source

__all__ = ["GPU", "Catalog", "Model", "QuantFormat", "Source", "builtin_db_dir", "load_catalog"]
