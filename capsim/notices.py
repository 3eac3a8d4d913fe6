"""Notices: one-line remarks about what capsim inferred for the user (which GPU an
ambiguous name picked, which weight format a Hugging Face id implies).

Library code calls :func:`notice`; by default the remark is kept in a per-context list
that :func:`take_notices` drains, so the Python API can return them and the CLI prints
them on stderr. Nothing here writes to a terminal.
"""

from __future__ import annotations

from contextvars import ContextVar

_NOTICES: ContextVar[list[str] | None] = ContextVar("capsim_notices", default=None)


def notice(message: str) -> None:
    """Record one remark (repeats of the same text are kept once)."""
    current = _NOTICES.get()
    if current is None:
        current = []
        _NOTICES.set(current)
    if message not in current:
        current.append(message)


def take_notices() -> list[str]:
    """The remarks recorded so far in this context, emptied."""
    current = _NOTICES.get()
    if not current:
        return []
    taken = list(current)
    current.clear()
    return taken
