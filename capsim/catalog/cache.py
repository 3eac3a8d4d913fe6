"""capsim's cache folder, and the parsed catalog kept in it.

Reading the catalog's YAML and validating every entry takes about 0.1 s, a third of a
short command's start-up. The parsed catalog is pickled into the cache folder under a key
made of every catalog file's path, size and modification time, the schema and loader
sources' and capsim's version: any edit to a YAML file, an added or removed file or a
changed schema gives a new key, so a stale catalog is never read. ``CAPSIM_NO_CACHE=1``
turns it off; a cache that cannot be read or written is ignored.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable
from pathlib import Path

CACHE_ENV = "CAPSIM_CACHE_DIR"
"""Environment variable naming capsim's cache folder (default: the platform's user cache)."""

NO_CACHE_ENV = "CAPSIM_NO_CACHE"
"""Set to 1 to parse the catalog on every run instead of reading the cached one."""

KEEP_CATALOGS = 4
"""Cached catalogs kept (the newest); older ones are removed when a new one is written."""


def cache_dir() -> Path:
    """capsim's cache folder: ``CAPSIM_CACHE_DIR`` or the platform's user cache dir."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    import platformdirs

    return Path(platformdirs.user_cache_dir("capsim"))


def catalog_key(files: list[Path]) -> str:
    """The cache key of a catalog read from ``files`` (in load order)."""
    from capsim import __version__

    here = Path(__file__).resolve().parent
    # the code a cached catalog depends on: every schema module (schemas.py and the
    # *_schema.py files on it), the loader and this file
    schemas = sorted(here.glob("*schema*.py"))
    code = [*schemas, here / "loader.py", Path(__file__).resolve()]
    parts = [__version__]
    for path in [*code, *files]:
        st = path.stat()
        parts.append(f"{path}\0{st.st_size}\0{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def cached_catalog(files: list[Path], parse: Callable[[], object]):
    """The catalog parsed from ``files`` by ``parse()``, from the cache when it holds one
    for exactly these files; else parsed and stored."""
    if os.environ.get(NO_CACHE_ENV, "") not in ("", "0"):
        return parse()
    try:
        folder = cache_dir()
        path = folder / f"catalog-{catalog_key(files)}.pickle"
    except OSError:
        return parse()
    try:
        with path.open("rb") as f:
            return pickle.load(f)
    except Exception:  # none yet, or a truncated or foreign file: parse (and overwrite) it
        pass
    catalog = parse()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        with partial.open("wb") as f:
            pickle.dump(catalog, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(partial, path)
        _prune(folder)
    except OSError:
        pass
    return catalog


def _prune(folder: Path) -> None:
    """Remove all but the KEEP_CATALOGS newest cached catalogs."""
    cached = sorted(folder.glob("catalog-*.pickle"), key=lambda p: p.stat().st_mtime_ns)
    for old in cached[:-KEEP_CATALOGS]:
        old.unlink(missing_ok=True)
