"""The ``capsim`` command's entry point: stops quietly on Ctrl-C or SIGTERM even while it
is still importing, then hands over to ``capsim.cli.main.run``.

A Ctrl-C in the first tenth of a second (Python importing typer, rich, pydantic) printed
a KeyboardInterrupt traceback from deep inside an import (issue 47); nothing has been
done at that point, so the command just says it was interrupted and exits 130 (143 for
SIGTERM). ``run`` installs the handlers that keep finished work once the command runs.
"""

from __future__ import annotations

import _signal as signal  # the C module: 'signal' imports enum first, a window of its own
import contextlib
import os
import sys


def _stopped_while_starting(signum, frame) -> None:
    try:
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(143 if signum == signal.SIGTERM else 130)


def _closed_streams_to_devnull() -> None:
    """A command started with its standard output or error closed (``capsim gpus >&-``)
    finds ``sys.stdout`` None and failed on its first write with an AttributeError
    traceback: what it prints is dropped instead, as writing to /dev/null drops it."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115


def _unencodable_as_replacement() -> None:
    """A terminal or pipe whose encoding cannot show every character capsim prints (an
    em dash in a table, under PYTHONIOENCODING=ascii or a C locale) made the first such
    write fail with a UnicodeEncodeError traceback: those characters are written as '?'
    instead, the rest as it is."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if encoding not in ("utf8", "utf16", "utf32") and hasattr(stream, "reconfigure"):
            # a stream that cannot be reconfigured keeps its own handling
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors="replace")


def run() -> None:
    """Console-script entry point (``capsim`` and ``python -m capsim``)."""
    _closed_streams_to_devnull()
    _unencodable_as_replacement()
    interactive = signal.getsignal(signal.SIGINT)
    if interactive is not signal.SIG_IGN:  # a shell that started us in the background
        signal.signal(signal.SIGINT, _stopped_while_starting)
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
        signal.signal(signal.SIGTERM, _stopped_while_starting)
    from capsim.cli.main import run as run_command

    # Python's own handler (KeyboardInterrupt) comes back inside the command's try block:
    # restored here, a Ctrl-C in the few steps before that block raised it uncaught
    # (a traceback from _terminate_as_ctrl_c, seen under load on 2026-12-01)
    run_command(sigint=interactive if interactive is not signal.SIG_IGN else None)
