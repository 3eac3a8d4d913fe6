"""Every file capsim reads and writes goes through here. Reading: only regular files, of a
bounded size, as UTF-8 text, with an error that names the file and what is wrong (never a
hang on a device or a pipe, never a traceback on binary data). Writing: files other capsim
processes may read meanwhile (the user's catalog overlay, profiles, bands, caches) are
written whole or not at all."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

from capsim.errors import CapsimUserError

MAX_INPUT_BYTES = 64 * 2**20
"""Largest document (YAML, JSON, a lengths or trace file) capsim parses, bytes: parsed, a
64 MB JSON file takes a few hundred MB of Python objects; a larger file is refused before
it is read, so no input can take the process past about 1 GB."""

MAX_LOG_BYTES = 64 * 2**20
"""Largest probe request log (.jsonl) capsim reads back, bytes: a run of ~10,000 requests
of 1,000 streamed tokens with their chunk times to the microsecond (probe/runfile.py
CHUNK_TIME_DECIMALS). Its events are held parsed, up to about 8 bytes of memory per byte
of log where the chunk times are short ('0.5,': a 120 MB log of them took probe
summarize to 1.26 GB), so 64 MB keeps a log under about 600 MB (issue 47: under 1 GB)."""


def file_stem(name: str, flag: str) -> str:
    """``name`` checked as a file name capsim writes inside the folder the user named
    (``--name``): no path separators, no leading dot (so no '..'), no control characters,
    at most 200 bytes in UTF-8; else a CapsimUserError (exit 2)."""
    bad = (
        not name.strip()
        or len(name.encode("utf-8", "surrogateescape")) > 200  # bytes: a file system's unit
        or name.startswith(".")
        or any(c in name for c in "/\\")
        or any(ord(c) < 32 for c in name)
        or re.fullmatch(r"[A-Za-z0-9._-]+", name) is None  # a space breaks every shell line
    )
    if bad:
        raise CapsimUserError(
            f"{flag} {name!r} cannot name a file inside the output folder",
            hint="use letters, digits, '-', '_' and '.', not starting with '.', no '/', at "
            "most 200 bytes",
        )
    return name


VALUE_WORDS = frozenset(
    "true false yes no on off y n null none nan inf infinity".split()  # noqa: SIM905
)
"""Words JSON, YAML or a spreadsheet reads as a boolean, a null or a number."""


def name_read_as_value(name: str) -> str | None:
    """Why a name capsim is asked to give (a profile's, an imported model's) would be read
    as something else where it is written (a --json or --csv result, a YAML file, one of
    capsim's own lists), or None: a number ('1e309', '8'), a word of VALUE_WORDS in any
    case ('NaN', 'true'), or a range ('8..1', 'a..b')."""
    word = name.lower().lstrip("+-")
    if word in VALUE_WORDS:
        numeric = word in ("nan", "inf", "infinity")
        return "reads as a number" if numeric else "reads as a boolean or null"
    try:
        float(name.replace("_", "x"))  # Python reads '1_0' as 10; a spreadsheet does not
    except ValueError:
        pass
    else:
        return "reads as a number"
    if ".." in name:
        return "reads as a range (1..8)"
    return None


def name_suggestion(name: str, prefix: str) -> str:
    """A name near ``name`` that reads as no value: ``prefix``-NAME with its '..' as '-'."""
    stem = "-".join(part for part in re.split(r"\.\.+", name) if part).lstrip("+-.") or "1"
    return f"{prefix}-{stem}"


def path_exists(path: Path) -> bool:
    """``path.exists()``, False instead of an OSError for a name no file can have (too long,
    a NUL byte, a loop of links): a user's value that names no file is not there."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


MAX_NAME_BYTES = 255
"""Longest file name (one path component, UTF-8 bytes) the common file systems take."""


SYSTEM_FOLDERS = ("/dev", "/proc", "/sys")
"""Folders whose entries are devices and kernel state: capsim writes no file there (as
root every folder reads as writable; 'calibrate --out /proc/x.yaml' failed after its fit
naming its temporary file, '--plot /dev/stdout' wrote /dev/stdout.png)."""


def refuse_overwrite(paths: list[Path], flag: str, force: bool) -> None:
    """A CapsimUserError (exit 2) before any work when one of ``paths`` (what ``flag``
    writes) already exists and ``force`` is False, is a folder where a file goes, is a
    device, pipe or socket (replaced even with --force, an atomic rename would put a file
    where /dev/full was), or has no name or one too long for a file system: capsim never
    replaces a file the user did not say it may."""
    for path in paths:
        if not path.name or path.name in (".", ".."):
            raise CapsimUserError(f"{flag} '{path}' names no file", hint="give a file name")
        if any(ord(c) < 32 or ord(c) == 127 for c in str(path)):
            # a newline in a file name: every listing and script that reads it breaks
            raise CapsimUserError(
                f"{flag} {str(path)!r} holds a control character (a newline, a tab)",
                hint="name the file with printable characters",
            )
        if len(path.name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
            raise CapsimUserError(
                f"{flag}: the file name is {len(path.name)} characters, longer than a file "
                f"system takes ({MAX_NAME_BYTES} bytes)"
            )
        if path.is_dir():
            raise CapsimUserError(f"{flag} '{path}' is a folder: capsim writes a file there")
        if path.exists() and not path.is_file():
            raise CapsimUserError(
                f"{flag} '{path}' is a device, pipe or socket, not a file capsim may replace"
            )
        if (path.exists() or path.is_symlink()) and not force:
            raise CapsimUserError(
                f"'{path}' exists: capsim does not overwrite it",
                hint=f"pass --force to replace it, or another {flag}",
            )
        blocker = file_in_the_way(path)
        if blocker is not None:
            raise CapsimUserError(
                f"{flag} '{path}': '{blocker}' is a file, not a folder to write into",
                hint=f"name a file in a folder, e.g. another {flag}",
            )
        folder = nearest_existing_folder(path)
        if folder is not None and str(folder.resolve()) in SYSTEM_FOLDERS:
            raise CapsimUserError(
                f"{flag} '{path}' is in {folder}, a folder of devices and system state, "
                "not of files",
                hint="name a file in a folder of your own",
            )
        if folder is not None and not os.access(folder, os.W_OK | os.X_OK):
            raise CapsimUserError(
                f"{flag} '{path}': capsim may not create files in '{folder}'",
                hint="name a file in a folder you can write to",
            )


def refuse_missing_folder(folder: Path, flag: str, path: Path) -> None:
    """A CapsimUserError (exit 2) before any work when ``folder``, where ``path`` given to
    ``flag`` is written, does not exist: capsim does not create folders the user named (a
    typo in one would put the output where nobody looks)."""
    try:
        there, something = folder.is_dir(), folder.exists()
    except OSError:
        there = something = False
    if something and not there:
        raise CapsimUserError(f"{flag} '{path}': '{folder}' is not a folder to write into")
    if not there:
        raise CapsimUserError(
            f"{flag} '{path}': the folder '{folder}' does not exist",
            hint=f"create it first (mkdir -p {folder}) or name a file in an existing folder",
        )


def refuse_writing_over_inputs(outputs: list[Path], inputs: list[Path] | None, flag: str) -> None:
    """A CapsimUserError (exit 2) before any work when one of ``outputs`` (what ``flag``
    writes) is one of the files the command reads: one of ``inputs`` or a file in one of
    its folders (with --force, 'validate d.yaml --write-bands d.yaml' replaced the dataset
    with a band table, 'calibrate d.yaml --out d.yaml' with a profile)."""
    read: set[Path] = set()
    for path in inputs or []:
        try:
            if path.is_dir():
                read.update(p.resolve() for p in path.rglob("*") if p.is_file())
            elif path.exists():
                read.add(path.resolve())
        except OSError:
            continue  # the reader reports a path it cannot read
    for out in outputs:
        try:
            target = out.resolve()
        except OSError:
            continue
        if target in read:
            raise CapsimUserError(
                f"{flag} '{out}' is one of the files this command reads: writing it would "
                "replace the input",
                hint=f"give {flag} another file",
            )


def file_in_the_way(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` when it is not a folder (a file where a
    folder of the path should be: '/etc/hostname/b.yaml'), else None; checked before any
    work, where creating the folder would otherwise fail after it."""
    for folder in [path.parent, *path.parent.parents]:
        try:
            if folder.exists():
                return None if folder.is_dir() else folder
        except OSError:
            return None
    return None


def nearest_existing_folder(path: Path) -> Path | None:
    """The folder ``path`` would be written into, or its nearest ancestor that exists (a
    missing folder is created on writing); None when none can be found."""
    for folder in [path.parent, *path.parent.parents]:
        try:
            if folder.is_dir():
                return folder
        except OSError:
            return None
    return None


BOM = "\ufeff"
"""The byte-order mark some editors (Notepad, Excel's CSV export) put before UTF-8 text."""


def read_input_text_checks(path: Path, what: str, max_bytes: int) -> None:
    """read_input_text's checks before reading: the path exists, is a regular file (not a
    folder, device, pipe or socket) and is at most ``max_bytes``."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise CapsimUserError(f"{what} '{path}' does not exist") from None
    except OSError as exc:
        raise CapsimUserError(f"cannot read {what} '{path}': {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise CapsimUserError(f"{what} '{path}' is a folder, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise CapsimUserError(
            f"{what} '{path}' is not a regular file (a device, pipe or socket)",
            hint="save the content to a file and pass that",
        )
    if info.st_size > max_bytes:
        raise CapsimUserError(
            f"{what} '{path}' is {info.st_size / 2**20:,.1f} MB, more than the "
            f"{max_bytes / 2**20:,.0f} MB capsim reads",
        )


def read_input_text(path: Path | str, what: str = "file", max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of the user's file ``path`` (``what`` names it in errors: 'profile',
    'dataset'): a CapsimUserError (exit 2) for a path that does not exist, a folder, a
    device, pipe or socket (which could block or never end), a file over ``max_bytes``
    (refused before reading), one that cannot be read, or bytes that are not UTF-8 text."""
    path = Path(path)
    read_input_text_checks(path, what, max_bytes)
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise CapsimUserError(f"cannot read {what} '{path}': {exc.strerror or exc}") from None
    if len(data) > max_bytes:  # it grew while we looked
        raise CapsimUserError(f"{what} '{path}' is more than the {max_bytes >> 20} MB capsim reads")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CapsimUserError(
            f"{what} '{path}' is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x}): "
            "is it a binary file?",
        ) from None
    if "\x00" in text:
        raise CapsimUserError(
            f"{what} '{path}' holds NUL bytes (at character {text.index(chr(0))}): "
            "it is not a text file"
        )
    return text.removeprefix(BOM)  # an editor's byte-order mark is no part of the content


def iter_input_lines(path: Path | str, what: str = "file", max_bytes: int = MAX_INPUT_BYTES):
    """The lines of the user's text file ``path``, read one at a time (a long run log is
    never held whole): the checks of read_input_text on the path and its size up front,
    then each line's UTF-8 and NUL bytes as it is read."""
    path = Path(path)
    read_input_text_checks(path, what, max_bytes)
    try:
        with open(path, encoding="utf-8", errors="strict") as f:
            read = 0
            for number, line in enumerate(f, 1):
                read += len(line)
                if read > max_bytes:  # it grew while we read
                    raise CapsimUserError(
                        f"{what} '{path}' is more than the {max_bytes >> 20} MB capsim reads"
                    )
                if "\x00" in line:
                    raise CapsimUserError(
                        f"{what} '{path}' holds NUL bytes (line {number}): it is not a text file"
                    )
                yield line.removeprefix(BOM) if number == 1 else line
    except UnicodeDecodeError:
        raise CapsimUserError(f"{what} '{path}' is not UTF-8 text: is it a binary file?") from None
    except OSError as exc:
        raise CapsimUserError(f"cannot read {what} '{path}': {exc.strerror or exc}") from None


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file beside it and an atomic
    rename, creating its folder: a process reading ``path`` meanwhile sees the old file or
    the new one, never a truncated one (two capsim processes resolving the same model at
    once read an empty overlay YAML before). Returns ``path``."""
    if path.exists() and not path.is_file():  # never rename a file over a device or a pipe
        raise CapsimUserError(f"'{path}' is not a regular file: capsim does not replace it")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CapsimUserError(f"cannot create the folder of '{path}': {exc.strerror}") from None
    import secrets

    # a new file of a name no other has (O_EXCL, the umask's permissions): a file or a
    # link already there under a fixed temporary name was written through (issue 47,
    # round 5: a probe's 'run.json.tmp' pointing elsewhere had the summary written into
    # its target)
    partial = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    handle = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


MAX_JSON_CONTAINERS = 200_000
"""Most objects and arrays (counted as '{' and '[' characters, strings included: an upper
bound) a JSON document capsim parses may hold. Each costs 60-250 bytes parsed and more
where a schema then reports on every one, so a 60 MB file of '[{},{},...]' took
validate to 3.2 GB and import vllm-bench to 1.5 GB under the size limit alone (issue 47:
under 1 GB for any file). Real inputs hold far fewer: a vllm bench result keeps its
per-request figures in a few flat arrays (one array a request where it keeps ITLs: 10,000
requests, 10,000 arrays); a request body, a config.json or a probe log line, tens."""


def json_containers_over_limit(text: str | bytes) -> str | None:
    """Why ``text`` is refused before it is parsed as JSON (more than MAX_JSON_CONTAINERS
    objects and arrays), or None when it is not."""
    brace, bracket = ("{", "[") if isinstance(text, str) else (b"{", b"[")
    containers = text.count(brace) + text.count(bracket)
    if containers <= MAX_JSON_CONTAINERS:
        return None
    return (
        f"holds {containers:,} objects and arrays, more than the "
        f"{MAX_JSON_CONTAINERS:,} capsim parses"
    )


def parse_limit_message(exc: Exception) -> str:
    """The first line of a parser's own limit error, in the document's terms: an integer
    of over 4,300 digits is said as such, not with Python's advice to raise its limit."""
    said = str(exc).split("\n")[0]
    return "a number of more than 4,300 digits" if "integer string conversion" in said else said


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """An object's members, refusing a key given twice (json keeps the last silently: a
    config.json with two num_hidden_layers imported the second)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} is given twice in one object")
        out[key] = value
    return out


def loads_json(text: str | bytes, duplicate_keys: bool = False) -> Any:
    """``json.loads`` whose every failure is a ``json.JSONDecodeError``: a document nested
    past Python's recursion limit (json.loads raises RecursionError), an integer of over
    4,300 digits or bytes that are not UTF-8 (ValueError) are malformed input like any
    other, so every reader's JSONDecodeError handling covers them; so is a document of
    more than MAX_JSON_CONTAINERS objects and arrays, refused before it is parsed. A key
    given twice in one object is malformed too, unless ``duplicate_keys`` (what a server
    answers, or a request body, read as vLLM reads them: the last wins)."""
    import json

    too_many = json_containers_over_limit(text)
    if too_many:
        raise json.JSONDecodeError(too_many, "", 0)
    try:
        return json.loads(text, object_pairs_hook=None if duplicate_keys else _unique_keys)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", "", 0) from None
    except ValueError as exc:
        raise json.JSONDecodeError(parse_limit_message(exc), "", 0) from None
