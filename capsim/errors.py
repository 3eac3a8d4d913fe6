"""User-facing errors.

Anything a user can cause (an unknown name, a malformed catalog file, a model that does
not fit) raises :class:`CapsimUserError`. The CLI prints it as one line plus an optional
hint and exits with code 2; it never shows a traceback for these.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Iterable


class CapsimUserError(Exception):
    """An error caused by the user's input, with a hint on how to fix it.

    Attributes:
        message: what is wrong, one line.
        hint: how to fix it (may be empty).
        suggestions: close matches for a misspelt name (may be empty).
    """

    def __init__(self, message: str, hint: str = "", suggestions: Iterable[str] = ()):
        self.message = message
        self.hint = hint
        self.suggestions = list(suggestions)
        super().__init__(self.render())

    def render(self) -> str:
        parts = [self.message]
        if self.suggestions:
            parts.append("did you mean: " + ", ".join(self.suggestions) + "?")
        if self.hint:
            parts.append(self.hint)
        return "\n".join(parts)


class UnknownNameError(CapsimUserError):
    """A GPU, model or format name that is not in the catalog."""


class CatalogError(CapsimUserError):
    """A catalog file that cannot be read or does not validate."""


class DoesNotFitError(CapsimUserError):
    """A deployment whose weights or minimum KV cache exceed the GPU memory."""


def normalise_name(name: str) -> str:
    """Lower-case a name and drop separators, so 'RTX 3090', 'rtx-3090' and 'rtx3090' match."""
    return re.sub(r"[\s_\-./]+", "", name.strip().lower())


def close_matches(name: str, candidates: Iterable[str], limit: int = 3) -> list[str]:
    """Names from ``candidates`` that look like ``name`` (difflib ratio and substring)."""
    cands = list(candidates)
    norm = {normalise_name(c): c for c in cands}
    key = normalise_name(name)
    found: list[str] = []
    for match in difflib.get_close_matches(key, list(norm), n=limit, cutoff=0.6):
        found.append(norm[match])
    if key:
        for n, original in norm.items():
            if (key in n or n in key) and original not in found:
                found.append(original)
    return found[:limit]


def plain_int(text: str) -> int:
    """``text`` as a whole number written the plain way, as whole-number flags take it:
    Python's int() also reads '1_0' as 10 and ' 3' as 3 ('--spec ngram:1_0' drafted ten
    tokens). ValueError says which it is."""
    stripped = text.strip()
    if "_" in stripped:
        raise ValueError(f"'{stripped}' is not a whole number (an '_' in it)")
    if not re.fullmatch(r"[+-]?[0-9]+", stripped):
        raise ValueError(f"'{stripped}' is not a whole number")
    return int(stripped)


class NotPlainNumber(ValueError):
    """What plain_float raises for text it refuses with a reason of its own (an '_', a
    digit of another script, a number too small to read), the message naming the value:
    a caller adds it to its own message, where float()'s bare ValueError it does not."""


class TooSmallToRead(NotPlainNumber):
    """A number whose digits are not all 0 that a float holds as 0 or as a subnormal
    (``reads_below_normal``): what plain_float raises for it, so that a flag's message can
    add this reason to its own without reading the exception's text."""


def reads_below_normal(text: str, number: float) -> bool:
    """Whether ``text``, read as ``number``, is a number too small to read: 1e-400 reads as
    0 though its digits are not all 0, and 1e-320 as a subnormal below
    sys.float_info.min, its digits lost. Every number flag (cli/main.py) and every number
    inside a text flag (plain_float) refuse it (issue 47, round 7)."""
    if number == 0:
        mantissa = text.strip().lower().split("e")[0]
        return any(ch in "123456789" for ch in mantissa)
    return abs(number) < sys.float_info.min


def too_small_message(text: str) -> str:
    """Why ``text`` (reads_below_normal) is refused."""
    return (
        f"'{text.strip()}' is too small to be read as a number (below "
        f"{sys.float_info.min:.3g}, digits are lost or it reads as 0)"
    )


def plain_float(text: str) -> float:
    """``text`` as a number written the plain way: Python's float() also reads '1_000' as
    1000 and full-width or other scripts' digits ('１０') as 10, which every numeric flag
    refuses (a typo '0_9' for 0.9 ran ten times larger). NotPlainNumber says which it is
    (TooSmallToRead for a number too small to read); float()'s ValueError for the rest."""
    stripped = text.strip()
    if "_" in stripped:
        raise NotPlainNumber(f"'{stripped}' is not a number (an '_' in it)")
    if not stripped.isascii():
        raise NotPlainNumber(f"'{stripped}' is not a number (a character outside 0-9 in it)")
    number = float(stripped)
    if reads_below_normal(stripped, number):
        raise TooSmallToRead(too_small_message(stripped))
    return number
