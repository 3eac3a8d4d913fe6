"""Files other capsim processes may read while this one writes them (the user's catalog
overlay, profiles, bands, caches): written whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file beside it and an atomic
    rename, creating its folder: a process reading ``path`` meanwhile sees the old file or
    the new one, never a truncated one (two capsim processes resolving the same model at
    once read an empty overlay YAML before). Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path
