"""Checks of the Python API's arguments: a value of the wrong kind (a name where a catalog
entry is taken, None where a cost model is, a number where a path is) is a
``CapsimUserError`` naming the argument and what it takes, not an AttributeError or
TypeError from deep inside (issue 47, the third fuzzing round).

Each check is an ``isinstance`` test or two (well under a microsecond), so functions the
simulation calls often may make them.
"""

from __future__ import annotations

import dataclasses
import os
import reprlib
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from capsim.errors import CapsimUserError

_short = reprlib.Repr()
_short.maxstring = 40
_short.maxother = 40


def described(value: Any) -> str:
    """``value``'s type and a short form of it, for a message: "str 'h100-sxm'", "None"."""
    if value is None:
        return "None"
    if isinstance(value, str | int | float | bytes | list | tuple | dict | set | Path):
        return f"{type(value).__name__} {_short.repr(value)}"
    return f"a {type(value).__name__}"


def require(value: Any, kinds: type | tuple[type, ...], argument: str, takes: str) -> None:
    """Refuse ``value`` unless it is one of ``kinds`` (a bool only where bool is one):
    "``argument``: takes ``takes``, got ..."."""
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds):
        return
    raise CapsimUserError(f"{argument}: takes {takes}, got {described(value)}")


def require_name(name: Any, kind: str) -> None:
    """A catalog lookup's ``name`` (of a ``kind``: 'gpu', 'model', ...) is a string
    (``Catalog.gpu(None)`` called ``.strip`` on None)."""
    require(name, str, f"the {kind} name", "a name or alias (a string)")


_UNSET = object()


def require_entries(gpu: Any = _UNSET, model: Any = _UNSET, fmt: Any = _UNSET) -> None:
    """The catalog entries a physics function takes: ``gpu`` a GPU, ``model`` a Model,
    ``fmt`` a QuantFormat (those not passed are not checked), each as ``Catalog.gpu(name)``
    and its siblings give them."""
    from capsim.catalog.gpu_schema import GPU
    from capsim.catalog.model_schema import Model, QuantFormat

    for argument, value, kind, lookup in (
        ("gpu", gpu, GPU, "gpu"),
        ("model", model, Model, "model"),
        ("fmt", fmt, QuantFormat, "quant"),
    ):
        if value is not _UNSET:
            require(
                value,
                kind,
                argument,
                f"a {kind.__name__} (load_catalog().{lookup}(name)), not its name",
            )


def require_callable(value: Any, argument: str) -> None:
    """``value`` is None or something to call (a progress or event callback)."""
    if value is not None and not callable(value):
        raise CapsimUserError(f"{argument}: takes a function or None, got {described(value)}")


def require_catalog(value: Any) -> None:
    """``catalog=`` is None (the built-in one) or a Catalog from ``load_catalog``."""
    if value is not None:
        from capsim.catalog.loader import Catalog

        require(value, Catalog, "catalog", "a Catalog from capsim.load_catalog() or None")


def path_list(value: Any, argument: str) -> list[Path]:
    """``value`` as a list of paths: one path (a str or os.PathLike: not read as a list of
    its characters), or a list or tuple of them; anything else is refused."""
    if isinstance(value, str | os.PathLike):
        return [Path(value)]
    if isinstance(value, list | tuple) and all(isinstance(v, str | os.PathLike) for v in value):
        return [Path(v) for v in value]
    raise CapsimUserError(
        f"{argument}: takes a path or a list of paths (str or pathlib.Path), got {described(value)}"
    )


_CHECKS: dict[tuple[type, str], Callable[[Any], str | None]] = {}


def _field_check(annotation: Any) -> Callable[[Any], str | None]:
    """A function that says what is wrong with a value for ``annotation`` (None: nothing),
    strictly: a dataclass or pydantic model takes its own instances only (not a dict of
    their fields), anything else is validated by pydantic in strict mode."""
    from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

    if isinstance(annotation, type) and (
        dataclasses.is_dataclass(annotation) or issubclass(annotation, BaseModel)
    ):
        return lambda v: None if isinstance(v, annotation) else f"takes a {annotation.__name__}"
    validate = TypeAdapter(annotation, config=ConfigDict(strict=True)).validate_python

    def check(value: Any) -> str | None:
        try:
            validate(value)
        except ValidationError as exc:
            return exc.errors()[0]["msg"]
        return None

    return check


def check_field_types(obj: Any) -> None:
    """Each field of the dataclass ``obj`` holds a value of its annotated type, checked
    strictly (a str is no number, a str no tuple of names, None no CostModel), or a
    CapsimUserError naming the field and what it takes."""
    cls = type(obj)
    hints = None
    for f in dataclasses.fields(obj):
        key = (cls, f.name)
        if key not in _CHECKS:
            if hints is None:
                hints = typing.get_type_hints(cls)
            _CHECKS[key] = _field_check(hints[f.name])
        value = getattr(obj, f.name)
        wrong = _CHECKS[key](value)
        if wrong is not None:
            raise CapsimUserError(
                f"{cls.__name__}.{f.name}: {wrong} (got {described(value)})",
                hint=f"see help({cls.__name__})",
            )
