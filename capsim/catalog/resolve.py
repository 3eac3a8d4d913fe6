"""What a user means by a model: a catalog name, a Hugging Face id, or a config.json.

``resolve_model`` turns the string a user passes to ``--model`` into a catalog model and,
where the string says it, a weight format:

1. a path to a config.json (or a folder holding one): imported as a model;
2. a catalog name, alias, Hugging Face id or the id of a published checkpoint of a
   catalog model (``Qwen/Qwen3-8B-FP8`` -> qwen3-8b in fp8);
3. a quantised repo of a catalog model, recognised by its ending (``-AWQ-4bit``,
   ``-GPTQ-Int4``, ``-FP8-Dynamic``, GGUF quant names; the ``repo_suffixes`` of each weight
   format in hardware_db/quant_formats/) and the rest of its name
   (``cpatonn/Qwen3-Coder-30B-A3B-Instruct-AWQ-4bit`` -> qwen3-coder-30b-a3b in awq-int4);
4. any other ``org/name`` id: its config.json is read from this machine's Hugging Face
   cache where the model was downloaded here (``HF_HUB_CACHE``, ``HF_HOME``/hub or
   ~/.cache/huggingface/hub: what a server that loaded it by id left there), else fetched
   once from the Hub (``HF_ENDPOINT``, default https://huggingface.co; ``HF_TOKEN`` for
   gated repos) and cached; its ``quantization_config`` gives the format.

Imported models are written as catalog entries into an overlay folder (under the user's
cache directory, ``CAPSIM_CACHE_DIR`` to move it), which the caller lays over the catalog
so worker processes see them too. Every inference leaves a notice (capsim.notices).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from capsim.catalog.cache import cache_dir
from capsim.catalog.loader import Catalog
from capsim.catalog.model_schema import Model
from capsim.errors import CapsimUserError, UnknownNameError, normalise_name
from capsim.notices import notice

HF_ENDPOINT_ENV = "HF_ENDPOINT"
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
FETCH_TIMEOUT_S = 8.0
"""Seconds to wait for a Hub file, whole, before calling the machine offline (a config.json
of a few kB comes in well under a second from the Hub or a mirror)."""

HF_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+(:[\w.\-]+)?$")
"""org/name, optionally with llama.cpp's ':QUANT' tag (``-hf org/name:Q4_K_M``)."""

VARIANT_SUFFIXES = ("instruct", "chat", "it", "base", "hf")
"""Name endings that distinguish a release's variants but not its architecture, tried
off one at a time when a repo's base name is not in the catalog."""


@dataclass(frozen=True)
class ResolvedModel:
    """A model reference resolved: the catalog name to simulate, the weight format the
    reference implies (None: it implies none), and the overlay folder holding an imported
    entry (None for built-in models)."""

    name: str
    quant: str | None = None
    overlay: Path | None = None


def overlay_dir() -> Path:
    """The catalog overlay that imported models are written into."""
    return cache_dir() / "catalog"


def imported_name(hf_id: str) -> str:
    """Catalog name of a model imported from a Hub id: 'org--name', lower-case."""
    return hf_id.replace("/", "--").lower()


def _strip_format(base: str, catalog: Catalog) -> tuple[str, str | None, str | None]:
    """(base name without a format ending, the format, the ending) for a repo name."""
    key = base.lower()
    best: tuple[int, str, str] | None = None
    for fmt in catalog.quant_formats:
        for suffix in fmt.repo_suffixes:
            s = suffix.lower()
            ends = any(key.endswith(sep + s) for sep in "-_.")
            if ends and (best is None or len(s) > best[0]):
                best = (len(s), fmt.name, suffix)
    if best is None:
        return base, None, None
    length, fmt_name, suffix = best
    return base[: -(length + 1)], fmt_name, suffix


def _catalog_by_base(base: str, catalog: Catalog) -> Model | None:
    """A catalog model whose name, alias or repo base name is ``base``, trying it with
    variant endings (-Instruct, -Chat, -it...) removed one at a time."""
    candidates = [base]
    current = base
    while True:
        for suffix in VARIANT_SUFFIXES:
            if current.lower().endswith("-" + suffix):
                current = current[: -(len(suffix) + 1)]
                candidates.append(current)
                break
        else:
            break
    for cand in candidates:
        key = normalise_name(cand)
        for model in catalog.models:
            keys = {normalise_name(model.name), normalise_name(model.hf_id.split("/")[-1])}
            keys.update(normalise_name(a.split("/")[-1]) for a in model.aliases)
            keys.update(normalise_name(c.hf_id.split("/")[-1]) for c in model.checkpoints)
            if key in keys:
                return model
    return None


def _quant_tag(text: str) -> tuple[str, str | None]:
    """Split llama.cpp's 'org/name:QUANT' into ('org/name', 'QUANT')."""
    if ":" in text and "/" in text:
        repo, _, tag = text.partition(":")
        return repo, tag
    return text, None


def _format_of_tag(tag: str, catalog: Catalog) -> str:
    """The weight format of llama.cpp's ':QUANT' tag: a GGUF file's type, so the GGUF
    entry of that name first (':MXFP4' is gguf-mxfp4, Q8_0 outside the experts), then
    the format the name or an alias gives (':BF16')."""
    fmt = catalog.quant_formats.find("gguf-" + tag)
    if fmt is None:
        fmt = catalog.quant_formats.find(tag)
    if fmt is None:
        raise UnknownNameError(
            f"unknown quant tag ':{tag}'", hint="run 'capsim quants' for the weight formats"
        )
    return fmt.name


def _is_config_folder(path: Path) -> bool:
    """Whether ``path`` is a folder holding a config.json (a name no file system can hold,
    300 characters of it, is not: it is a model name, looked up as one)."""
    try:
        return path.is_dir() and (path / "config.json").is_file()
    except (OSError, ValueError):
        return False


def resolve_model(text: str, catalog: Catalog, offline: bool = False) -> ResolvedModel:
    """Resolve a ``--model`` value (see the module docstring). ``offline`` forbids the
    Hub fetch. Raises a user error with a hint when nothing matches."""
    text = text.strip()
    path = Path(text).expanduser()
    if text.endswith(".json") or _is_config_folder(path):
        return _import_config_path(path, catalog)

    repo, tag = _quant_tag(text)
    direct = catalog.models.find(repo)
    if direct is not None:
        quant = _format_of_tag(tag, catalog) if tag else _checkpoint_format(direct, repo)
        if quant:
            how = f"its ':{tag}' tag" if tag else "the id (a published checkpoint)"
            notice(f"'{text}' is {direct.name}; weight format {quant} inferred from {how}")
        return ResolvedModel(direct.name, quant)

    if "/" in repo or tag:
        base = repo.split("/")[-1]
        stripped, fmt_name, suffix = _strip_format(base, catalog)
        model = _catalog_by_base(stripped, catalog)
        if model is not None:
            quant = _format_of_tag(tag, catalog) if tag else fmt_name
            if quant:
                how = f":{tag}" if tag else f"'-{suffix}'"
                notice(f"'{text}' is {model.name}; weight format {quant} inferred from {how}")
            else:
                notice(f"'{text}' is {model.name}")
            return ResolvedModel(model.name, quant)
    if HF_ID.match(text):
        return _import_from_hub(repo, tag, catalog, offline)
    catalog.models.get(text)  # raises the usual unknown-name error with suggestions
    raise AssertionError("unreachable")


def looks_like_model_reference(text: str) -> bool:
    """Whether ``text`` names a model by a config.json path, a folder holding one, or a
    Hugging Face id (rather than by a catalog name)."""
    path = Path(text).expanduser()
    return (
        text.endswith(".json")
        or (path.is_dir() and (path / "config.json").is_file())
        or bool(HF_ID.match(text))
    )


def resolve_into(catalog: Catalog, names: list[str]) -> tuple[Catalog, list[ResolvedModel]]:
    """Resolve model references (catalog names, Hugging Face ids, config.json paths) and
    return the catalog with any imported models laid over it, so that worker processes,
    which reload the catalog from its folders, see them too."""
    from capsim.catalog.loader import load_catalog

    resolved = [resolve_model(name, catalog) for name in names]
    overlays = [r.overlay for r in resolved if r.overlay is not None]
    if overlays and overlays[0] not in catalog.directories:
        catalog = load_catalog([*catalog.directories[1:], overlays[0]])
    return catalog, resolved


def _checkpoint_format(model: Model, repo: str) -> str | None:
    key = normalise_name(repo)
    for ckpt in model.checkpoints:
        if normalise_name(ckpt.hf_id) == key:
            return ckpt.quant
    return None


def _import_config_path(path: Path, catalog: Catalog) -> ResolvedModel:
    from capsim.catalog.hf_import import quant_file_beside, read_config

    try:
        config_path = path / "config.json" if path.is_dir() else path
        found = config_path.is_file()
    except OSError as exc:  # a name too long for the file system, a loop of links
        raise CapsimUserError(f"cannot read config file '{path}': {exc.strerror}") from None
    if not found:
        raise CapsimUserError(
            f"config file '{path}' does not exist",
            hint="pass the path of a model's config.json, or a folder that holds one",
        )
    config = read_config(config_path)
    # a folder's config.json is named after the folder; any other file after itself
    # (two configs kept side by side, a.json and b.config.json, are two models)
    stem = config_path.name.removesuffix(".json").removesuffix(".config")
    own = config_path.parent.name if config_path.name == "config.json" else stem
    name = normalise_name(own or "model") or "model"
    hf_id = str(config.get("_name_or_path") or f"local/{config_path.parent.name or name}")
    model_name = f"local--{name}"
    resolved = _write_imported(
        config, model_name, hf_id, str(config_path), catalog, quant_file_beside(config_path)
    )
    notice(f"'{path}' imported as {model_name} from its config.json")
    return resolved


def _import_from_hub(repo: str, tag: str | None, catalog: Catalog, offline: bool) -> ResolvedModel:
    from capsim.catalog.hf_import import (
        fetch_hub_config,
        fetch_hub_quant_file,
        local_hub_config_path,
        quant_file_beside,
        read_config,
    )

    name = imported_name(repo)
    cached = overlay_dir() / "models" / f"{name}.yaml"
    if cached.is_file():
        from capsim.catalog.loader import load_entry

        model = load_entry(cached, Model)
        quant = _format_of_tag(tag, catalog) if tag else _imported_format(model)
        notice(f"'{repo}' read from capsim's cache ({cached})")
        return ResolvedModel(model.name, quant, overlay_dir())
    local = local_hub_config_path(repo)
    if local is not None:  # downloaded here already (a server on this machine loaded it)
        config, source = read_config(local), f"the local Hugging Face cache ({local})"
        quant_file = quant_file_beside(local)
        how = f"read from the local Hugging Face cache ({local}) as {name}"
    elif offline:
        raise CapsimUserError(
            f"model '{repo}' is not in the catalog nor in the local Hugging Face cache, and "
            "fetching is off",
            hint="pass the model's config.json path to --model",
        )
    else:
        config, source = fetch_hub_config(repo), f"the Hugging Face Hub ({repo})"
        quant_file = fetch_hub_quant_file(repo)
        how = f"fetched from the Hugging Face Hub and cached as {name}"
    resolved = _write_imported(config, name, repo, source, catalog, quant_file)
    quant = _format_of_tag(tag, catalog) if tag else resolved.quant
    notice(f"'{repo}' {how}")
    return ResolvedModel(resolved.name, quant, resolved.overlay)


def _imported_format(model: Model) -> str | None:
    return model.dtype if model.dtype not in ("bf16", "fp16") else None


def _write_imported(
    config: dict,
    name: str,
    hf_id: str,
    source: str,
    catalog: Catalog,
    quant_file: dict | None = None,
) -> ResolvedModel:
    """Import a config.json (and its hf_quant_config.json) as ``name`` into the overlay.
    Where the files state no quantization, the repo name's format ending decides; a stated
    format capsim does not know falls back to that ending, else the torch dtype, with a
    notice (``--quant`` still chooses)."""
    from capsim.catalog.hf_import import model_from_hf_config, write_model_yaml
    from capsim.catalog.hf_quant import torch_dtype_format

    model = model_from_hf_config(config, name, hf_id=hf_id, source=source, quant_file=quant_file)
    known = {f.name for f in catalog.quant_formats}
    stated = model.dtype
    _, by_name, suffix = _strip_format(hf_id.split("/")[-1], catalog)
    if stated not in known:
        # model_from_hf_config has checked that a text_config, where present, is an object
        fallback = by_name or torch_dtype_format(config.get("text_config") or config, config)
        if fallback not in known:  # a torch dtype capsim has no format for: served 16-bit
            fallback = "bf16"
        why = f"its name ends in '-{suffix}'" if by_name else "its torch dtype"
        notice(
            f"{hf_id} is stored as '{stated}', a weight format capsim does not know: "
            f"simulated as {fallback} ({why}); pass --quant to choose (capsim quants)"
        )
        model = model.model_copy(update={"dtype": fallback})
    elif by_name and stated in ("bf16", "fp16") and by_name != stated:
        notice(
            f"{hf_id}: its files state no quantization; weight format {by_name} inferred "
            f"from its name's ending '-{suffix}'"
        )
        model = model.model_copy(update={"dtype": by_name})
    elif stated not in ("bf16", "fp16"):
        notice(f"{hf_id}: weight format {stated} read from its quantization config")
    write_model_yaml(model, overlay_dir())
    return ResolvedModel(model.name, _imported_format(model), overlay_dir())
