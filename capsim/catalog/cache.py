"""capsim's cache folder, and the parsed data kept in it.

Reading the catalog's YAML and validating every entry takes about 0.1 s, a third of a
short command's start-up. The parsed catalog is written to the cache folder as JSON (never
a pickle: a file planted in a cache folder that ``CAPSIM_CACHE_DIR`` may point anywhere
must not run code) and read back through the same pydantic schemas, which validate it as
they would the YAML (about 5 ms for the whole catalog), under a key
made of every catalog file's path, size and modification time, the schema and loader
sources' and capsim's version: any edit to a YAML file, an added or removed file or a
changed schema gives a new key, so a stale catalog is never read. The calibration profile
and the corpus band table a prediction reads are kept the same way (``cached_parse``, for
any pydantic model):
parsing them is quick, but reading YAML at all costs importing PyYAML, about 30-45 ms of
every prediction's start-up. ``CAPSIM_NO_CACHE=1`` turns it off; a cache that cannot be
read or written is ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

CACHE_ENV = "CAPSIM_CACHE_DIR"
"""Environment variable naming capsim's cache folder (default: the platform's user cache)."""

NO_CACHE_ENV = "CAPSIM_NO_CACHE"
"""Set to 1 to parse the catalog on every run instead of reading the cached one."""

KEEP_CATALOGS = 4
"""Cached files of each kind kept (the catalogs, profiles, band tables used last); older ones
are removed when a new one is written."""


def folder_from_env(variable: str, instead: str) -> Path | None:
    """The folder environment ``variable`` names, '~' expanded; None where it is unset or
    only spaces, or names a relative path (ignored with a note saying what is used
    ``instead``, as the XDG base directory specification has it for its own variables)."""
    explicit = os.environ.get(variable, "")
    if not explicit.strip():
        return None
    from capsim.notices import notice

    folder = Path(explicit).expanduser()
    if folder.is_absolute():
        if folder.exists() and not folder.is_dir():
            # a file or a device: nothing can be read from it or written to it, which
            # went unsaid (issue 47, round 6: CAPSIM_CACHE_DIR=/dev/null ran without a word)
            notice(
                f"{variable}='{explicit}' is not a folder: nothing is read from it or written to it"
            )
        return folder
    notice(
        f"{variable}='{explicit}' is not an absolute path: ignored, {instead} (write e.g. "
        f"$PWD/{explicit} for a folder here)"
    )
    return None


def cache_dir() -> Path:
    """capsim's cache folder: ``CAPSIM_CACHE_DIR`` or the platform's user cache dir (a value
    of only spaces counts as unset, as CAPSIM_DB's does: it made a folder named '  ' in the
    current directory). A relative path is ignored with a note, as the XDG base directory
    specification has it for its own variables: it named a new cache folder in whatever
    directory each command ran from."""
    explicit = folder_from_env(CACHE_ENV, "the user cache folder is used")
    if explicit is not None:
        return explicit
    import platformdirs

    return Path(platformdirs.user_cache_dir("capsim"))


def catalog_key(files: list[Path]) -> str:
    """The cache key of a catalog read from ``files`` (in load order)."""
    here = Path(__file__).resolve().parent
    # the code a cached catalog depends on: every schema module (schemas.py and the
    # *_schema.py files on it), the loader and this file
    schemas = sorted(here.glob("*schema*.py"))
    return files_key([*schemas, here / "loader.py", *files])


def files_key(files: list[Path]) -> str:
    """A cache key of ``files`` (data and the code that parses it, in order): each one's
    path, size and modification time, this module, the YAML reader (loader.py: a profile
    or band table cached before the reader refused '0120' kept its 1.1 reading) and
    capsim's version."""
    from capsim import __version__

    parts = [__version__]
    here = Path(__file__).resolve()
    for path in [here, here.with_name("loader.py"), *files]:
        st = path.stat()
        parts.append(f"{path}\0{st.st_size}\0{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


MAX_CACHED_BYTES = 64 * 2**20
"""A cached file larger than this is not read (the whole catalog is about 0.5 MB)."""


def cached_catalog(
    files: list[Path],
    parse: Callable[[], object],
    dump: Callable[[object], bytes],
    load: Callable[[bytes], object],
):
    """The catalog parsed from ``files`` by ``parse()``, from the cache when it holds one
    for exactly these files; else parsed and stored. ``dump`` turns a catalog into JSON
    bytes and ``load`` validates them back into one."""
    return _cached("catalog", lambda: catalog_key(files), parse, dump, load)


def cached_parse(
    kind: str, path: Path, code: list[Path], schema: type[BaseModel], parse: Callable[[], BaseModel]
):
    """The ``schema`` model ``parse()`` makes of the file ``path`` (parsed by the modules
    ``code``), from the cache when it holds it for this version of the file and code; else
    parsed and stored (``kind`` names the cached files: profile, bands)."""
    return _cached(
        kind,
        lambda: files_key([*code, path]),
        parse,
        lambda model: model.model_dump_json().encode(),
        schema.model_validate_json,
    )


def _cached(
    kind: str,
    key: Callable[[], str],
    parse: Callable[[], object],
    dump: Callable[[object], bytes],
    load: Callable[[bytes], object],
):
    if os.environ.get(NO_CACHE_ENV, "") not in ("", "0"):
        return parse()
    try:
        folder = cache_dir()
        path = folder / f"{kind}-{key()}.json"
    except OSError:
        return parse()
    loaded = _read(path, load)
    if loaded is not None:
        # a hit counts as a use, so pruning keeps the files used last, not the ones written
        # last: the built-in catalog, written once and read under every overlay, stays
        with contextlib.suppress(OSError):
            os.utime(path)
        return loaded
    parsed = parse()
    try:
        data = dump(parsed)
        if len(data) > MAX_CACHED_BYTES:  # never read back: not worth writing
            return parsed
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(data)
        os.replace(partial, path)
        _prune(folder, kind)
    except (OSError, ValueError):
        pass
    return parsed


def _read(path: Path, load: Callable[[bytes], object]):
    """The cached object in ``path``, validated by its schema; None when there is none or
    it is not one (not a plain file, too large, truncated, foreign, another schema's): it
    is then parsed again and overwritten."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_CACHED_BYTES:
            return None
        return load(path.read_bytes())
    except Exception:  # any unreadable cache entry is parsed afresh
        return None


def _prune(folder: Path, kind: str) -> None:
    """Remove all but the KEEP_CATALOGS newest cached files of ``kind``: capsim's own, named
    by their key (``kind``-32 hex digits.json). CAPSIM_CACHE_DIR may name a folder that
    holds other files; 'profile-notes.json' there is the user's, and was deleted."""
    own = re.compile(rf"{re.escape(kind)}-[0-9a-f]{{32}}\.json")
    cached = [p for p in folder.glob(f"{kind}-*.json") if own.fullmatch(p.name)]
    cached.sort(key=lambda p: p.stat().st_mtime_ns)
    for old in cached[:-KEEP_CATALOGS]:
        old.unlink(missing_ok=True)
