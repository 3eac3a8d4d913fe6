"""Loading the catalog from YAML: the built-in hardware_db plus user overlays.

Layout of a catalog directory (the built-in one and any user one alike)::

    gpus/<name>.yaml           one GPU per file         (schema: GPU)
    models/<name>.yaml         one model per file       (schema: Model)
    quant_formats/<name>.yaml  one weight format a file (schema: QuantFormat)
    efficiency/<class>.yaml    default efficiency parameters of one hardware class
    engines/<name>.yaml        one serving engine a file (schema: Engine)
    hosts/<name>.yaml          one measured host memory system a file (schema: HostMemory)

User directories come from ``--db DIR`` and the ``CAPSIM_DB`` environment variable
(several directories separated by ``os.pathsep``). Their entries are laid over the
built-in ones: an entry with the same ``name`` replaces the built-in entry.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from capsim.arguments import path_list, require_name
from capsim.catalog import ENV_VAR
from capsim.catalog.engine_schema import EfficiencyProfile, Engine, parse_engine_version
from capsim.catalog.gpu_schema import GPU
from capsim.catalog.host_schema import HostMemory
from capsim.catalog.model_schema import Model, QuantFormat
from capsim.errors import (
    CapsimUserError,
    CatalogError,
    UnknownNameError,
    close_matches,
    normalise_name,
)
from capsim.files import path_exists
from capsim.notices import notice

SECTIONS: dict[str, type[BaseModel]] = {
    "gpus": GPU,
    "models": Model,
    "quant_formats": QuantFormat,
    "efficiency": EfficiencyProfile,
    "engines": Engine,
    "hosts": HostMemory,
}

T = TypeVar("T", GPU, Model, QuantFormat, EfficiencyProfile, Engine, HostMemory)

LIST_COMMANDS = {
    "gpus": "gpus",
    "models": "models",
    "quant_formats": "quants",
    "engines": "engines",
}
"""The capsim command that lists each section's entries."""


def builtin_db_dir() -> Path:
    """The built-in catalog directory.

    In an installed wheel it is shipped as ``capsim/hardware_db``; in a source checkout
    (including an editable install) it is the top-level ``hardware_db/``.
    """
    package_dir = Path(__file__).resolve().parent.parent
    shipped = package_dir / "hardware_db"
    if (shipped / "gpus").is_dir():
        return shipped
    checkout = package_dir.parent / "hardware_db"
    if (checkout / "gpus").is_dir():
        return checkout
    raise CatalogError(
        "the built-in catalog (hardware_db) is missing from this installation",
        hint="reinstall capsim with 'pip install .' from a checkout that has hardware_db/",
    )


def load_yaml_text(text: str):
    """Parse YAML text safely (no Python objects), with libyaml's safe loader where PyYAML
    was built with it (about 10x faster on the catalog's ~160 files), else the pure-Python
    one; both accept the same documents. PyYAML is imported here: a catalog read from the
    cache needs none."""
    import yaml

    if len(text) > MAX_YAML_CHARS:
        raise yaml.YAMLError(
            f"the document is {len(text) / 2**20:.1f} MB, above the {MAX_YAML_CHARS / 2**20:g} MB "
            "capsim parses as YAML (its own datasets and catalog files are under 100 kB)"
        )
    from capsim.catalog.yaml_errors import one_line_yaml_error

    try:
        data = yaml.load(text, Loader=strict_loader())
    except (ValueError, OverflowError, RecursionError) as exc:
        # the constructor's own limits (an integer of 5,000 digits, a date out of range):
        # not a YAML document capsim can read, reported as its syntax errors are (in the
        # document's terms, not Python's advice to raise its limit)
        from capsim.files import parse_limit_message

        raise yaml.YAMLError(parse_limit_message(exc)) from None
    except yaml.YAMLError as exc:  # one line with the line and column, not libyaml's five
        raise yaml.YAMLError(one_line_yaml_error(exc)) from None
    check_expansion(data)
    return data


_STRICT_LOADER = None


def yaml11_number_problem(text: str, value) -> str | None:
    """Why ``text``, which PyYAML (YAML 1.1) read as the number ``value``, is refused: a
    spelling YAML 1.2 reads otherwise, or as no number ('memory_gb: 0120' was 80 GB, an
    octal number; '1:20' was 80, base 60; '8_0' was 80). None where it reads alike in both
    (80, 8.0, 1e3, 0x50, .inf)."""
    digits = text.strip().lstrip("+-")
    if ":" in digits:
        return (
            f"'{text}' is a base-60 number ({value:g}) to YAML 1.1 and a text to YAML 1.2: "
            f"write {value:g}, or quote it"
        )
    if "_" in digits:
        return (
            f"'{text}' is a number with '_' ({value:g}) to YAML 1.1 and a text to YAML 1.2: "
            f"write {value:g}"
        )
    if digits.startswith("0b"):
        return f"'{text}' is a binary number ({value}) to YAML 1.1 only: write {value}"
    if len(digits) > 1 and digits[0] == "0" and digits.isdigit() and int(digits, 10) != abs(value):
        return (
            f"'{text}' is an octal number ({value}) to YAML 1.1 and {int(text, 10)} to YAML "
            f"1.2: write {value} or {int(text, 10)}, without the leading 0"
        )
    return None


def strict_loader():
    """PyYAML's safe loader (libyaml's where built with it) that also refuses a key given
    twice in one mapping (the safe loader keeps the last: a dataset's second 'name:' took
    over without a word) and binary scalars (!!binary: bytes, which no field of capsim's
    takes, read as text by pydantic)."""
    global _STRICT_LOADER
    if _STRICT_LOADER is not None:
        return _STRICT_LOADER
    import yaml
    from yaml.constructor import ConstructorError, SafeConstructor

    class StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        pass

    def mapping(loader, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the safe constructor reports it
                continue
            if duplicate:
                raise ConstructorError(
                    None, None, f"the key {key!r} is given twice", key_node.start_mark
                )
        return SafeConstructor.construct_mapping(loader, node, deep)

    def binary(loader, node):
        raise ConstructorError(
            None, None, "binary data (!!binary) is not a value capsim reads", node.start_mark
        )

    def number(kind):
        construct = getattr(SafeConstructor, f"construct_yaml_{kind}")

        def checked(loader, node):
            value = construct(loader, node)
            problem = yaml11_number_problem(str(node.value), value)
            if problem is not None:
                raise ConstructorError(None, None, problem, node.start_mark)
            return value

        return checked

    StrictLoader.add_constructor("tag:yaml.org,2002:map", mapping)
    StrictLoader.add_constructor("tag:yaml.org,2002:binary", binary)
    StrictLoader.add_constructor("tag:yaml.org,2002:int", number("int"))
    StrictLoader.add_constructor("tag:yaml.org,2002:float", number("float"))
    _STRICT_LOADER = StrictLoader
    return StrictLoader


MAX_YAML_CHARS = 2**20
"""Longest YAML text parsed: a parsed document takes about 100 bytes of memory per byte of
text (10 MB of points: 1.07 GB and 28 s before the value count refused it), so this keeps a
YAML file under about 100 MB of memory (issue 47: under 1 GB for any file accepted) and its
parse and checks within a few seconds (a 4 MB flow list took 19 s to be refused, past the
10 s a bad input may take). The largest file capsim ships is 97 kB, a tenth of the limit."""

MAX_DOCUMENT_VALUES = 2_000_000
"""Most values (mappings, lists, scalars, counted every time an alias repeats them) a
document may hold: YAML's aliases let a few hundred bytes name billions of values (the
'billion laughs'), which validating or writing the document would then walk."""


def check_expansion(data, limit: int = MAX_DOCUMENT_VALUES) -> None:
    """Raise a yaml.YAMLError when ``data`` holds more than ``limit`` values counted as a
    walk sees them (an alias's value once per reference); stops at the limit."""
    import yaml

    count, stack = 0, [data]
    while stack:
        node = stack.pop()
        count += 1
        if count > limit:
            raise yaml.YAMLError(
                f"the document expands to more than {limit:,} values (aliases of aliases?)"
            )
        if isinstance(node, dict):
            stack.extend(node.values())
            count += len(node)
        elif isinstance(node, list):
            stack.extend(node)


def read_yaml(path: Path) -> dict:
    """Parse one YAML file into a mapping, with a clear error naming the file."""
    import yaml

    from capsim.files import read_input_text

    try:
        text = read_input_text(path, "catalog file")
    except CapsimUserError as exc:
        raise CatalogError(exc.message, hint=exc.hint) from None
    try:
        data = load_yaml_text(text)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    return data


def format_validation_error(path: Path, exc: ValidationError, text: str | None = None) -> str:
    """A schema error as 'file:LINE: invalid entry: field: problem' (up to five fields,
    each after the first with its own line). ``text``: the file's YAML or JSON, read again
    from ``path`` when not given, to place the fields (capsim.catalog.yaml_errors)."""
    from capsim.catalog.yaml_errors import field_lines

    line_of = field_lines(text if text is not None else _text_for_lines(path))
    errors = exc.errors()
    lines = []
    first_line = None
    for i, err in enumerate(errors[:5]):
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        line = line_of(tuple(err["loc"]))
        msg = err["msg"].removeprefix("Value error, ")  # pydantic's wrapper of our messages
        if i == 0:
            first_line = line
            lines.append(f"{loc}: {msg}")
        else:
            lines.append(f"{loc}{f' (line {line})' if line else ''}: {msg}")
    more = "" if len(errors) <= 5 else f" (and {len(errors) - 5} more)"
    where = f"{path}:{first_line}" if first_line else f"{path}"
    return f"{where}: invalid entry: " + "; ".join(lines) + more


def _text_for_lines(path: Path) -> str | None:
    """``path``'s text for placing schema errors, or None where it cannot be read again."""
    from capsim.files import read_input_text

    try:
        return read_input_text(path, "file")
    except (CapsimUserError, OSError, ValueError):
        return None


_YAML11_EXPONENT = re.compile(r"[-+]?[0-9]+(\.[0-9]*)?[eE][-+]?[0-9]+")
"""A number in exponent form that PyYAML (YAML 1.1) leaves a string unless it has a dot
('1e30', '1e-300'): written unquoted, it is a number, and pydantic reads it as one."""


def annotation_kinds(annotation) -> tuple:
    """The types a field annotation admits: the members of a union (an Annotated type's
    own), else the annotation itself."""
    import types
    from typing import Annotated, Union, get_args, get_origin

    if get_origin(annotation) in (Union, types.UnionType, Annotated):
        return tuple(k for a in get_args(annotation) for k in annotation_kinds(a))
    return (annotation,)


def stands_for_a_number(value: Any, allowed: tuple) -> bool:
    """Whether ``value``, a YAML true or false or a text, stands where a field of the types
    ``allowed`` (annotation_kinds) takes a number and not that kind of value: pydantic
    reads true as 1 and "24" as 24. An exponent number YAML 1.1 left a string ('1e30') is a
    number."""
    return (
        isinstance(value, bool | str)
        and type(value) not in allowed
        and any(k in (int, float) for k in allowed)
        and not (isinstance(value, str) and _YAML11_EXPONENT.fullmatch(value.strip()))
    )


def stands_for_a_boolean(value: Any, allowed: tuple) -> bool:
    """Whether ``value``, a number or a text, stands where a field of the types ``allowed``
    takes true or false and not that kind of value: pydantic reads 1 and "yes" as true,
    "off" and 0.0 as false (issue 47, round 5)."""
    return (
        value is not None
        and not isinstance(value, bool)
        and type(value) not in allowed
        and bool in allowed
    )


def boolean_for_number(data: Any, schema: Any, where: str = "") -> tuple[str, Any, str] | None:
    """The first field of ``data`` where a YAML true or false, or a quoted text, stands for
    a number ``schema`` takes, or a number or a text for true or false, as (its dotted path,
    the value, what the field takes), or None: pydantic reads true as 1 and "24" as 24
    (issue 47: 'num_layers: true' ran as one layer), and 1 or "yes" as true."""
    fields = getattr(schema, "model_fields", None)
    if not isinstance(data, dict) or fields is None:
        return None
    for key, value in data.items():
        field = fields.get(key)
        if field is None:
            continue
        found = _boolean_in(value, field.annotation, f"{where}{key}")
        if found:
            return found
    return None


def _boolean_in(value: Any, annotation, path: str) -> tuple[str, Any, str] | None:
    """boolean_for_number for one field's ``value`` of type ``annotation``, at ``path``:
    the value itself, a nested entry of its own schema, and the items of a list or the
    values of a mapping (an engine's batch_defaults rows, its generations, its params and
    class_params: 'max_num_seqs: true' in a generation's row, 'moe_gemm_half_width: true'
    in an efficiency file were read as 1, issue 47 round 4)."""
    from typing import get_args, get_origin

    allowed = annotation_kinds(annotation)
    if stands_for_a_number(value, allowed):
        # a quoted number in an overlay, or a boolean, passed as a number without a
        # word (issue 47's fuzzing)
        return path, value, "a number"
    if stands_for_a_boolean(value, allowed):
        return path, value, "true or false"
    for kind in allowed:
        if isinstance(kind, type) and hasattr(kind, "model_fields"):  # an entry of its own
            found = boolean_for_number(value, kind, path + ".")
        elif get_origin(kind) is list and isinstance(value, list):
            (item,) = get_args(kind) or (Any,)
            found = next(
                (f for i, v in enumerate(value) if (f := _boolean_in(v, item, f"{path}.{i}"))),
                None,
            )
        elif get_origin(kind) is dict and isinstance(value, dict):
            item = get_args(kind)[1] if get_args(kind) else Any
            found = next(
                (f for k, v in value.items() if (f := _boolean_in(v, item, f"{path}.{k}"))),
                None,
            )
        else:
            continue
        if found:
            return found
    return None


def load_entry(path: Path, schema: type[T]) -> T:
    """Validate one YAML file against a schema."""
    data = read_yaml(path)
    found = boolean_for_number(data, schema)
    if found:
        flipped, value, takes = found
        if takes == "true or false":
            shown = f"the text {value[:40]!r}" if isinstance(value, str) else f"{value!r:.40}"
            raise CatalogError(
                f"{path}: {flipped}: true or false, not {shown}",
                hint="write true or false, without quotes",
            )
        if isinstance(value, str):
            raise CatalogError(
                f"{path}: {flipped}: a number, not the text {value[:40]!r}",
                hint="write the number without quotes",
            )
        raise CatalogError(
            f"{path}: {flipped}: a number, not {str(value).lower()}",
            hint="write the number (YAML reads true and false, yes and no as booleans)",
        )
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise CatalogError(
            format_validation_error(path, exc),
            hint="fix the field named above; see the schemas in capsim/catalog/ (gpu_schema.py, "
            "model_schema.py, engine_schema.py)",
        ) from None


def entry_keys(entry) -> set[str]:
    """Normalised aliases of an entry, and for a model its Hugging Face id and the ids of
    its published checkpoints."""
    keys = {normalise_name(a) for a in entry.aliases}
    if isinstance(entry, Model):
        keys.add(normalise_name(entry.hf_id))
        keys.update(normalise_name(c.hf_id) for c in entry.checkpoints)
    return keys


def _alias_rank(entry, key: str) -> int:
    """Where ``key`` stands among an entry's aliases (0 = first); large if absent."""
    for i, alias in enumerate(entry.aliases):
        if normalise_name(alias) == key:
            return i
    return 1_000


@dataclass
class Section(Generic[T]):
    """One kind of catalog entry, with lookup by name or alias."""

    kind: str
    entries: dict[str, T] = field(default_factory=dict)
    origin: dict[str, Path] = field(default_factory=dict)
    # normalised name -> entry, and normalised alias or id -> entries, in entry order:
    # made at the first lookup (every simulation's setup looks its GPU and model up)
    _index: tuple[dict[str, T], dict[str, list[T]]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def add(self, entry: T, path: Path) -> None:
        """Add ``entry`` from ``path``; one of the same name from another folder (an
        overlay's) replaces it. Two files of one folder naming one entry (NAME.yaml and
        NAME.yml: the second won without a word), or a name another entry has but for case
        and separators (an overlay's 'H100_SXM' beside 'h100-sxm', which every lookup
        found instead), are errors naming both files."""
        before = self.origin.get(entry.name)
        if before is not None and before.parent == path.parent and before != path:
            raise CatalogError(
                f"{path} and {before} both define the {self.kind} entry '{entry.name}'",
                hint="keep one file an entry",
            )
        key = normalise_name(entry.name)
        twin = next((n for n in self.entries if n != entry.name and normalise_name(n) == key), None)
        if twin is not None:
            raise CatalogError(
                f"{path} defines the {self.kind} entry '{entry.name}', which is "
                f"'{twin}' ({self.origin[twin]}) but for case and separators: lookups "
                "could not tell them apart",
                hint=f"name it '{twin}' to replace that entry, or give it a name of its own",
            )
        self.entries[entry.name] = entry
        self.origin[entry.name] = path
        self._index = None

    def _lookup(self) -> tuple[dict[str, T], dict[str, list[T]]]:
        if self._index is None:
            names: dict[str, T] = {}
            keys: dict[str, list[T]] = {}
            for entry in self.entries.values():
                names.setdefault(normalise_name(entry.name), entry)
                for key in entry_keys(entry):
                    keys.setdefault(key, []).append(entry)
            self._index = (names, keys)
        return self._index

    def names(self) -> list[str]:
        return sorted(self.entries)

    def __iter__(self):
        return iter(self.entries[n] for n in self.names())

    def __len__(self) -> int:
        return len(self.entries)

    def find(self, name: str) -> T | None:
        """An entry by name, alias or (models) Hugging Face id, ignoring case and
        separators; None when nothing matches. An alias several entries share (a family
        name such as 'h100') picks the entry that lists it first among its aliases (else
        the first by name) and leaves a notice naming the alternatives."""
        require_name(name, self.kind.rstrip("s").replace("_", " "))
        key = normalise_name(name)
        names, keys = self._lookup()
        entry = names.get(key)
        if entry is not None:
            shadowed = [e.name for e in keys.get(key, []) if e is not entry]
            if shadowed:  # an overlay's entry named as another's alias wins the name
                notice(
                    f"'{name}' is the name of {entry.name} ({self.origin[entry.name]}) and "
                    f"an alias of {', '.join(sorted(shadowed))}: using {entry.name}"
                )
            return entry
        matches = list(keys.get(key, []))
        if not matches:
            return None
        if len(matches) > 1:
            matches.sort(key=lambda e: (_alias_rank(e, key), e.name))
            others = ", ".join(e.name for e in matches[1:])
            notice(f"'{name}' is ambiguous: using {matches[0].name} (also: {others})")
        return matches[0]

    def get(self, name: str) -> T:
        """Look an entry up as ``find`` does; an unknown name is a user error with
        did-you-mean suggestions."""
        found = self.find(name)
        if found is not None:
            return found
        owner = {n: n for n in self.entries}
        owner.update({a: e.name for e in self.entries.values() for a in e.aliases})
        suggestions = list(dict.fromkeys(owner[c] for c in close_matches(name, owner, limit=6)))
        suggestions = suggestions[:3]
        singular = self.kind.rstrip("s").replace("_", " ")
        raise UnknownNameError(
            f"unknown {singular} '{name}'",
            hint=f"run 'capsim {LIST_COMMANDS.get(self.kind, self.kind)}' to list them, or "
            "add a YAML file with --db DIR",
            suggestions=suggestions,
        )


@dataclass
class Catalog:
    """All GPUs, models and weight formats known to this run."""

    gpus: Section[GPU]
    models: Section[Model]
    quant_formats: Section[QuantFormat]
    efficiency: Section[EfficiencyProfile]
    engines: Section[Engine]
    hosts: Section[HostMemory]
    directories: list[Path]

    def gpu(self, name: str) -> GPU:
        return self.gpus.get(name)

    def model(self, name: str) -> Model:
        return self.models.get(name)

    def quant(self, name: str) -> QuantFormat:
        return self.quant_formats.get(name)

    def engine(self, name: str) -> Engine:
        """An engine by name, or as one of its releases ran it: 'vllm@0.7.3' lays the
        generation that covers 0.7.3 over the newest release's entry (Engine.at_version);
        'llama.cpp:vulkan' the Vulkan backend's parameters (Engine.on_backend), and
        'llama.cpp:vulkan@b6918' both."""
        require_name(name, "engine")
        base, at, version = name.partition("@")
        if (at or ":" in base) and not engine_base(name):  # '@0.24', ':vulkan'
            raise CapsimUserError(
                f"engine '{name}' names no engine before '{name.strip()[:1]}'",
                hint=f"write ENGINE{name.strip()} (e.g. vllm@0.24.0, llama.cpp:vulkan); "
                "'capsim engines' lists them",
            )
        engine = self.engines.get(engine_base(name))
        if at:
            if not version.strip():
                # the example is one of this engine's releases ('llama.cpp@0.7.3' is refused)
                example = engine.releases.newest if engine.releases is not None else "VERSION"
                raise CapsimUserError(
                    f"engine '{name}' names no release after '@'",
                    hint=f"write {engine.name}@VERSION (e.g. {engine.name}@{example}), or "
                    f"{engine.name} alone for its newest release",
                )
            try:
                engine = engine.at_version(version.strip())
            except ValueError as e:
                raise CapsimUserError(
                    f"engine '{name}': {e}",
                    hint=f"'capsim engines' lists each engine's generations; {engine.name} "
                    "alone is its newest release",
                ) from None
            parsed = parse_engine_version(version.strip())
            if engine.releases is not None and parsed is not None:
                outside = engine.releases.outside(f"{engine.name}@{version.strip()}", parsed)
                if outside is not None:
                    notice(outside)
        _, colon, backend = base.partition(":")
        if not colon:
            return engine
        if not backend.strip():
            raise CapsimUserError(
                f"engine '{name}' names no backend after ':'",
                hint=f"write {engine.name}:BACKEND (e.g. {engine.name}:vulkan), or "
                f"{engine.name} alone for each GPU's own backend",
            )
        try:  # the backend's parameters lay over the release's
            return engine.on_backend(backend)
        except ValueError as e:
            raise CapsimUserError(
                f"engine '{name}': {e}", hint="'capsim engines' lists each engine's backends"
            ) from None


def engine_base(reference: str) -> str:
    """The engine an engine reference names, without its backend or release
    ('vllm@0.7.3': vllm; 'llama.cpp:vulkan@b6918': llama.cpp)."""
    return reference.partition("@")[0].partition(":")[0].strip()


def user_db_dirs(explicit: list[Path] | None = None) -> list[Path]:
    """User overlay directories: CAPSIM_DB first, then --db (later ones win)."""
    dirs: list[Path] = []
    env = os.environ.get(ENV_VAR, "")
    dirs += [Path(p) for p in env.split(os.pathsep) if p.strip()]
    dirs += list(explicit or [])
    for d in dirs:
        if not d.is_dir():
            what = "is not a directory" if path_exists(d) or d.is_symlink() else "does not exist"
            raise CatalogError(
                f"catalog directory '{d}' {what}",
                hint=f"pass an existing directory to --db or fix {ENV_VAR}",
            )
        check_overlay_layout(d)
    # one folder named twice (CAPSIM_DB and --db, or a list that repeats it) is one overlay:
    # laid over itself it changes nothing, and each copy was read again (20 copies of a
    # 5,000-file overlay took 15 s a command); the later place keeps its precedence
    seen: dict[Path, int] = {}
    for i, d in enumerate(dirs):
        seen[d.resolve()] = i
    return [d for i, d in enumerate(dirs) if seen[d.resolve()] == i]


def check_overlay_layout(directory: Path) -> None:
    """A CatalogError for a directory that cannot be a catalog overlay: one that holds
    entries but none of the section folders (gpus/, models/, ...) capsim reads, so nothing
    in it would be read ('--db /usr' was taken without a word, '--db mydb/models' then
    called the model unknown). An empty directory is fine: models import-hf fills it."""
    sections = [kind for kind in SECTIONS if (directory / kind).is_dir()]
    if sections:
        return
    try:
        entries = [p.name for p in itertools.islice(directory.iterdir(), 10_000)]
    except OSError:
        return  # unreadable: nothing is read from it, and reading says so where it matters
    if not entries:
        return
    folders = ", ".join(f"{kind}/" for kind in SECTIONS)
    yaml_here = any(name.endswith((".yaml", ".yml")) for name in entries)
    if directory.name in SECTIONS or yaml_here:
        raise CatalogError(
            f"catalog directory '{directory}' holds entry files itself, not in the folders "
            f"a catalog has ({folders})",
            hint=f"pass the folder above it, '{directory.parent}', to --db or {ENV_VAR}"
            if directory.name in SECTIONS
            else f"move each file into the folder of its kind ({folders})",
        )
    raise CatalogError(
        f"'{directory}' is not a catalog directory: it has none of {folders}, so nothing in "
        "it would be read",
        hint=f"pass a folder laid out as capsim's hardware_db to --db or {ENV_VAR}",
    )


def load_catalog(extra_dirs: list[Path] | None = None) -> Catalog:
    """Load the built-in catalog and lay the user's directories over it (paths or path
    strings)."""
    if extra_dirs is not None:  # the Python API's strings too; one path, not its letters
        extra_dirs = path_list(extra_dirs, "load_catalog's extra_dirs")
    dirs = [builtin_db_dir(), *user_db_dirs(extra_dirs)]
    return _load_dirs(tuple(d.resolve() for d in dirs))


_PROCESS_CATALOGS: dict[tuple[Path, ...], Catalog] = {}


def process_catalog(extra_dirs: list[Path] | None = None) -> Catalog:
    """``load_catalog`` read once per process and overlay set: for worker processes that
    simulate many configurations or levels (reading the YAML takes about 80 ms, as long as
    one simulation). Callers must not modify the returned catalog."""
    key = tuple(d.resolve() for d in [builtin_db_dir(), *user_db_dirs(extra_dirs)])
    if key not in _PROCESS_CATALOGS:
        _PROCESS_CATALOGS[key] = _load_dirs(key)
    return _PROCESS_CATALOGS[key]


def share_with_workers(catalog: Catalog) -> None:
    """Let worker processes forked from this one use ``catalog`` for its directories
    instead of reading the YAML again (``process_catalog``; about 0.1 s a worker). The
    catalog must then not be modified."""
    _PROCESS_CATALOGS.setdefault(tuple(catalog.directories), catalog)


MAX_CATALOG_FILES = 5_000
"""Most entry files one catalog directory may hold (the built-in one has about 200)."""

MAX_CATALOG_BYTES = 16 * 2**20
"""Most YAML one catalog directory may hold, bytes (the built-in one has 0.7 MB; each file
at most MAX_YAML_CHARS): 300 overlay files of 0.9 MB each took a start-up to 2.2 GB
(issue 47: under 1 GB for any input)."""


def _catalog_files(dirs: tuple[Path, ...]) -> list[tuple[str, Path]]:
    """Every entry file of ``dirs``, as (section, path), in load order; a directory of
    more files or bytes than a catalog holds is refused, naming it."""
    files = []
    for directory in dirs:
        found = []
        for kind in SECTIONS:
            sub = directory / kind
            if sub.is_dir():
                found += [(kind, p) for p in sorted(sub.glob("*.yaml")) + sorted(sub.glob("*.yml"))]
        if len(found) > MAX_CATALOG_FILES:
            raise CapsimUserError(
                f"catalog directory '{directory}' holds {len(found):,} entry files, more than "
                f"the {MAX_CATALOG_FILES:,} capsim reads",
                hint="keep only the entries you add or change in an overlay (--db)",
            )
        total = 0
        for _, path in found:
            with contextlib.suppress(OSError):  # unreadable: its own read says so
                total += path.stat().st_size
        if total > MAX_CATALOG_BYTES:
            raise CapsimUserError(
                f"catalog directory '{directory}' holds {total / 2**20:.0f} MB of YAML, more "
                f"than the {MAX_CATALOG_BYTES >> 20} MB capsim reads",
                hint="keep only the entries you add or change in an overlay (--db)",
            )
        files += found
    return files


def _load_dirs(dirs: tuple[Path, ...]) -> Catalog:
    """The catalog of ``dirs``, from capsim's cache when its files have not changed
    (capsim/catalog/cache.py)."""
    from capsim.catalog.cache import cached_catalog

    files = _catalog_files(dirs)
    return cached_catalog(
        [p for _, p in files],
        lambda: _parse_over_base(dirs, files),
        _catalog_json,
        _catalog_from_json,
    )


def _parse_over_base(dirs: tuple[Path, ...], files: list[tuple[str, Path]]) -> Catalog:
    """The catalog of ``dirs`` parsed from ``files``: with overlays, the first directory's
    catalog (the built-in one, from the cache when its files have not changed) with only
    the overlays' files parsed over it. An overlay changes more often than the built-in
    catalog (each model imported from a config.json adds an entry to capsim's own, a
    ``--db`` folder is edited), and parsing the built-in YAML again for each took about
    0.5 s; the entries, their order and the checks are those of parsing every file."""
    if len(dirs) < 2:
        return _parse(dirs, files)
    base = _load_dirs(dirs[:1])
    sections: dict[str, Section] = {}
    for kind in SECTIONS:
        section = getattr(base, kind)
        sections[kind] = Section(
            kind=kind, entries=dict(section.entries), origin=dict(section.origin)
        )
    # an entry file is DIRECTORY/SECTION/NAME.yaml (_catalog_files)
    return _parse(dirs, [(k, p) for k, p in files if p.parent.parent != dirs[0]], sections)


def check_references(sections: dict[str, Section]) -> None:
    """What one entry names in another, checked where the catalog is read: a GPU's hardware
    class has an efficiency file (a typo took the generic priors without a word), a model's
    dtype is a weight format (it ended in a KeyError at the first prediction, issue 47). The
    efficiency parameters a file sets are checked where they are applied
    (physics.deployment.default_efficiency), naming the file."""
    from capsim.errors import close_matches

    builtin = builtin_db_dir().resolve()
    for section in sections.values():
        names = {normalise_name(n): n for n in section.entries}
        for name, entry in section.entries.items():
            if section.origin[name].resolve().is_relative_to(builtin):
                continue  # an overlay named as a built-in alias takes it, with a notice
            for alias in getattr(entry, "aliases", None) or ():
                other = names.get(normalise_name(alias))
                if other is not None and other != name:
                    # a lookup finds the other entry by its name first: an overlay entry's
                    # alias never reached it (a GPU aliased 'h100-sxm', issue 47)
                    raise CatalogError(
                        f"{section.origin[name]}: alias '{alias}' of {name} is the name of "
                        f"another entry ({section.origin[other]}), which '{alias}' finds",
                        hint=f"drop the alias, or name the entry '{other}' to replace it",
                    )
    classes = sections["efficiency"].entries
    gpus = sections["gpus"]
    for name, gpu in gpus.entries.items():
        if gpu.hardware_class not in classes:  # a typo took the generic priors silently
            raise CatalogError(
                f"{gpus.origin[name]}: hardware_class '{gpu.hardware_class}' has no "
                "efficiency file (efficiency/CLASS.yaml) giving its priors",
                hint="use a class the catalog has (capsim gpus shows each GPU's), or add "
                "its efficiency file beside the GPU in your --db folder",
                suggestions=close_matches(gpu.hardware_class, list(classes)),
            )
    efficiency = sections["efficiency"]
    for name, profile in classes.items():
        ref = profile.reference_gpu
        if ref is not None and (
            ref not in gpus.entries or gpus.entries[ref].hardware_class != name
        ):
            raise CatalogError(
                f"{efficiency.origin[name]}: reference_gpu '{ref}' is not a GPU of class '{name}'",
                hint="name the GPU of this class its compute efficiencies were measured on",
                suggestions=close_matches(ref, list(gpus.entries)),
            )
    formats = sections["quant_formats"].entries
    engines = sections["engines"]
    for name, engine in engines.entries.items():
        for key in ("weight_only_formats", "auto_formats"):
            for fmt in getattr(engine, key) or ():
                if fmt not in formats:  # a typo would change nothing, without a word
                    raise CatalogError(
                        f"{engines.origin[name]}: {key}: '{fmt}' is not a weight format "
                        "capsim knows",
                        hint="capsim quants lists them",
                        suggestions=close_matches(fmt, list(formats)),
                    )
                if not engine.loads(fmt):  # --quant refuses it: the entry never applies
                    raise CatalogError(
                        f"{engines.origin[name]}: {key}: '{fmt}' is a format {name} does not "
                        "load (weight_formats), so it would never apply",
                        hint=f"add it to weight_formats, or drop it from {key}",
                    )
        check_skipped_gpus(engine, engines.origin[name], gpus)
    models = sections["models"]
    for name, model in models.entries.items():
        if model.dtype not in formats:
            raise CatalogError(
                f"{models.origin[name]}: dtype '{model.dtype}' is not a weight format capsim "
                "knows (the release's weights are read in it)",
                hint="capsim quants lists them",
                suggestions=close_matches(model.dtype, list(formats)),
            )


def check_skipped_gpus(engine: Engine, origin: Path, gpus: Section) -> None:
    """A CatalogError for a batch_defaults row (the engine's or a generation's) whose
    except_gpus prefix begins no GPU's name: a typo ('a10O') skipped nothing, without a
    word."""
    from capsim.errors import close_matches

    tables = [("batch_defaults", engine.batch_defaults)] + [
        (f"generations.{i}.batch_defaults", gen.batch_defaults or [])
        for i, gen in enumerate(engine.generations)
    ]
    for where, rows in tables:
        for j, row in enumerate(rows):
            for prefix in row.except_gpus:
                if not any(gpu.startswith(prefix) for gpu in gpus.entries):
                    raise CatalogError(
                        f"{origin}: {where}.{j}.except_gpus: '{prefix}' begins no GPU's name, "
                        "so the row skips nothing",
                        hint="name GPUs as capsim gpus lists them (a prefix: 'a100' skips "
                        "every A100)",
                        suggestions=close_matches(prefix, list(gpus.entries)),
                    )


class _CachedCatalog(BaseModel):
    """A catalog as capsim's cache keeps it (JSON, validated back by the entry schemas)."""

    gpus: dict[str, GPU]
    models: dict[str, Model]
    quant_formats: dict[str, QuantFormat]
    efficiency: dict[str, EfficiencyProfile]
    engines: dict[str, Engine]
    hosts: dict[str, HostMemory]
    origin: dict[str, dict[str, Path]]
    directories: list[Path]


def _catalog_json(catalog: Catalog) -> bytes:
    sections = {kind: getattr(catalog, kind) for kind in SECTIONS}
    cached = _CachedCatalog(
        **{kind: section.entries for kind, section in sections.items()},
        origin={kind: section.origin for kind, section in sections.items()},
        directories=catalog.directories,
    )
    return cached.model_dump_json().encode()


def _catalog_from_json(data: bytes) -> Catalog:
    cached = _CachedCatalog.model_validate_json(data)
    sections = {
        kind: Section(kind=kind, entries=getattr(cached, kind), origin=cached.origin[kind])
        for kind in SECTIONS
    }
    return Catalog(**sections, directories=cached.directories)


def _parse(
    dirs: tuple[Path, ...],
    files: list[tuple[str, Path]],
    sections: dict[str, Section] | None = None,
) -> Catalog:
    """The catalog of ``dirs``: ``files`` parsed in order over ``sections`` (None: empty),
    then every reference between entries checked."""
    if sections is None:
        sections = {k: Section(kind=k) for k in SECTIONS}
    for kind, path in files:
        sections[kind].add(load_entry(path, SECTIONS[kind]), path)
    check_references(sections)
    return Catalog(
        gpus=sections["gpus"],
        models=sections["models"],
        quant_formats=sections["quant_formats"],
        efficiency=sections["efficiency"],
        engines=sections["engines"],
        hosts=sections["hosts"],
        directories=list(dirs),
    )
