"""The ``capsim`` command: a thin typer layer over the Python API.

Commands parse options, call the API and print; they hold no physics. User errors
(:class:`capsim.errors.CapsimUserError`) print one line, a hint and did-you-mean
suggestions on stderr and exit with code 2, without a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Annotated, Any

import typer

from capsim.cli.common import (
    PLAIN_HELP,
    DbOption,
    console,
    err_console,
    global_db,
    user_errors,
)

APP_SETTINGS: dict[str, Any] = dict(
    name="capsim",
    help="Predict LLM serving throughput on your GPUs before you buy or reconfigure them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    **PLAIN_HELP,
)


def _whole_numbers_only() -> None:
    """Integer flags take whole numbers as written: typer reads them through pydantic's lax
    mode, which took '--requests 2.0' as 2 (issue 47). A value that is not digits (with a
    sign, '_' between digits) is refused as click refuses any other bad value, exit 2.
    A float flag's range check that reads 'nan' as out of range says what it is as well
    (flags without a range check the value where they are used, in their own words)."""
    import math
    import re
    import types
    from pathlib import Path
    from typing import Union, get_args, get_origin

    from capsim.errors import reads_below_normal, too_small_message

    try:
        from typer._click.exceptions import BadParameter
        from typer._coercion import AdapterRuntimeParam
    except ImportError:  # another typer: its own integer parsing stands
        return
    # digits as typed: not '٣', and not '1_000' (float and length flags refuse '_' too)
    whole = re.compile(r"\s*[+-]?\d+\s*", re.ASCII)

    def of_type(annotation, kind) -> bool:
        if annotation is kind:
            return True
        if get_origin(annotation) in (Union, types.UnionType, list):
            return any(of_type(a, kind) for a in get_args(annotation))
        return False

    def foreign_digit(value: str) -> str | None:
        """A digit of another script in ``value`` (not in a file:PATH), or None."""
        if value.startswith("file:"):
            return None
        return next((ch for ch in value if ch.isdecimal() and not ch.isascii()), None)

    def finite(value: str) -> bool:
        try:
            return math.isfinite(float(value))
        except ValueError:
            return True  # not a number at all: the float parsing says so

    def underflows(value: str) -> bool:
        try:
            return reads_below_normal(value, float(value))
        except ValueError:
            return False

    original = AdapterRuntimeParam._coerce_value

    def coerce(self, value, param, ctx):
        if isinstance(value, str) and of_type(self.annotation, int) and not whole.fullmatch(value):
            why = " (an '_' in it)" if "_" in value else ""
            raise BadParameter(f"{value!r} is not a whole number{why}", ctx=ctx, param=param)
        if isinstance(value, str) and of_type(self.annotation, int) and len(value) > 40:
            # past any count a flag takes; Python refuses to read 4,300 digits or more,
            # and said only 'exceeded maximum size' (issue 47, round 6)
            low, high = getattr(param, "min", None), getattr(param, "max", None)
            span = (
                f" ({low} to {high})"
                if low is not None and high is not None
                else f" (at most {high})"
                if high is not None
                else ""
            )
            digits = sum(ch.isdigit() for ch in value)
            raise BadParameter(
                f"'{value.strip()[:12]}...', a number of {digits:,} digits, is out of range{span}",
                ctx=ctx,
                param=param,
            )
        numeric = of_type(self.annotation, float) and not of_type(self.annotation, str)
        if isinstance(value, str) and numeric and "_" in value:
            # Python reads '0_9' as 9.0: a typo for 0.9 taken as a number ten times larger
            raise BadParameter(f"{value!r} is not a number (an '_' in it)", ctx=ctx, param=param)
        if isinstance(value, str) and numeric and underflows(value):
            # 1e-320 is no setting of any flag: '--prior-weight 1e-320' printed 'weight
            # 9.99989e-321', and 1e-400 was read as 0 (issue 47, round 7)
            low = getattr(param, "min", None)
            raise BadParameter(
                f"{too_small_message(value)}: "
                + ("give a larger number" if low is None else f"the flag takes {low:g} or more"),
                ctx=ctx,
                param=param,
            )
        textual = of_type(self.annotation, str) or of_type(self.annotation, Path)
        if isinstance(value, str) and textual and not value.strip():
            # '--quant ""' read as no value, '--out ""' as the current folder: never meant
            raise BadParameter(f"{value!r} is empty", ctx=ctx, param=param)
        texts = value if isinstance(value, list | tuple) else [value]
        for text in texts if textual and isinstance(value, list | tuple) else ():
            if isinstance(text, str) and not text.strip():
                # '--db ""' read as the current folder, '--set ""' as nothing
                raise BadParameter(f"{text!r} is empty", ctx=ctx, param=param)
        for text in texts if of_type(self.annotation, Path) else ():
            if isinstance(text, str) and text.endswith("/") and text.strip("/"):
                why = slash_on_a_file(text, param, ctx)
                if why:
                    raise BadParameter(why, ctx=ctx, param=param)
            why = output_name_without_a_stem(text, param, ctx) if isinstance(text, str) else None
            if why:
                raise BadParameter(why, ctx=ctx, param=param)
        for text in texts if of_type(self.annotation, str) else ():
            # text flags that hold numbers ('--input-tokens ٣', '--spec ngram:٣') read
            # them as Python does, any script's digits; whole-number flags refuse them
            if isinstance(text, str) and foreign_digit(text):
                raise BadParameter(
                    f"{text!r} has a digit that is not 0-9 ({foreign_digit(text)!r})",
                    ctx=ctx,
                    param=param,
                )
        try:
            return original(self, value, param, ctx)
        except BadParameter as exc:
            # a range check that read 'nan' as out of range: say what it is, and the range
            if isinstance(value, str) and of_type(self.annotation, float) and not finite(value):
                said = exc.message[:1].lower() + exc.message[1:]
                raise BadParameter(
                    f"{value!r} is not a finite number ({said})", ctx=ctx, param=param
                ) from None
            raise

    AdapterRuntimeParam._coerce_value = coerce


FILE_OUTPUT_FLAGS = frozenset({"--plot", "--out", "--write-bands"})
"""Options that name a file capsim writes (``models import-hf --out`` names a folder)."""

FOLDER_OUTPUT_COMMANDS = frozenset({"import-hf"})
"""Commands whose ``--out`` is a folder to write into."""


def slash_on_a_file(text: str, param, ctx) -> str | None:
    """Why a path given with a trailing '/' is refused, or None: the '/' says "a folder",
    but pathlib drops it, so 'runs.yaml/' read the file runs.yaml and '--plot out/'
    wrote out.png beside the folder the user named (issue 47's sixth audit). Refused:
    an existing file named with a '/', and a file output named with one."""
    import os

    bare = text.rstrip("/")
    try:
        exists, folder = os.path.exists(bare), os.path.isdir(bare)
    except (OSError, ValueError):
        return None  # the readers and writers say what is wrong with the path itself
    if exists and not folder:
        return f"'{text}' ends in '/', but '{bare}' is a file"
    names = set(getattr(param, "opts", ()) or ())
    command = getattr(getattr(ctx, "command", None), "name", None)
    if names & FILE_OUTPUT_FLAGS and command not in FOLDER_OUTPUT_COMMANDS:
        return (
            f"'{text}' ends in '/', naming a folder: this option writes a "
            f"file; give a file name, e.g. '{bare}/capsim.png'"
            if "--plot" in names
            else f"'{text}' ends in '/', naming a folder: this option writes "
            "a file; give a file name"
        )
    return None


OUTPUT_SUFFIXES = frozenset({"png", "pdf", "svg", "jpg", "jpeg", "json", "jsonl", "yaml", "csv"})
"""File types capsim's outputs are written as: a name that is only one of them ('.png') is
a suffix without a file name."""


def output_name_without_a_stem(text: str, param, ctx) -> str | None:
    """Why a file output's name is refused, or None: '-' (standard output in many tools,
    a file named '-' here: '--out -' wrote '-.json'), a name ending in '.' ('--out x.'
    wrote 'x..json') and a suffix alone ('--plot .png' wrote '.png.png'; issue 47's
    seventh audit), a name beginning or ending with a space (the eighth)."""
    names = set(getattr(param, "opts", ()) or ())
    command = getattr(getattr(ctx, "command", None), "name", None)
    if not names & FILE_OUTPUT_FLAGS or command in FOLDER_OUTPUT_COMMANDS:
        return None
    flag = sorted(names & FILE_OUTPUT_FLAGS)[0]
    name = text.rstrip("/").rsplit("/", 1)[-1]
    example = {"--plot": "plot.png", "--write-bands": "bands.yaml"}.get(
        flag, "profile.yaml" if command == "calibrate" else "run.json"
    )
    if name == "-":
        return (
            f"'-' is not standard output here: {flag} names a file to write (e.g. {flag} {example})"
        )
    if name != name.strip():
        # '--plot "x.png "' wrote 'x.png .png' (the suffix '.png ' not a type), and
        # ' x.png' a name that lists as x.png: a space a quote kept, never meant
        return (
            f"'{text}' begins or ends with a space, which the file's name would keep: "
            f"give it without (e.g. {flag} {text.strip()})"
        )
    if name.endswith(".") and name.strip("."):
        return (
            f"'{text}' ends in '.', a suffix with no file type: give the name with one "
            f"(e.g. {flag} {text.rstrip('.')}{example[example.rfind('.') :]})"
        )
    if name.startswith(".") and name[1:].lower() in OUTPUT_SUFFIXES:
        return f"'{text}' is a file type without a name: give one, e.g. {flag} {example}"
    return None


_whole_numbers_only()


def _each_option_once() -> None:
    """An option given twice, under one name or two of its aliases ('--pp 2 --pp-size 4',
    '--tp 2 --tp 4'), took the last value without a word (issue 47's fifth audit): it is
    refused as any other bad command line is, exit 2. Options that take several values
    (--set, --db) repeat as before."""
    from collections import Counter

    try:
        from typer._click.core import _OptionParser
        from typer._click.exceptions import UsageError
    except ImportError:  # another typer: its own parsing stands
        return
    original = _OptionParser.parse_args

    def parse_args(self, args):
        opts, largs, order = original(self, args)
        counts = Counter(id(param) for param in order)
        for param in order:
            once = not getattr(param, "multiple", False) and not getattr(param, "count", False)
            if counts[id(param)] > 1 and once and getattr(param, "opts", None):
                names = " / ".join([*param.opts, *getattr(param, "secondary_opts", [])])
                raise UsageError(f"{names} is given more than once; give it once", ctx=self.ctx)
        return opts, largs, order

    _OptionParser.parse_args = parse_args


_each_option_once()

cli = typer.Typer(**APP_SETTINGS)
"""The global options; ``app`` (``full_app``) adds the commands, which live in the other
cli modules."""


def print_version(value: bool) -> None:
    """--version: the installed capsim's version, then exit."""
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("capsim")
        except PackageNotFoundError:
            text = "unknown (not installed)"
        console.print(f"capsim {text}", highlight=False)
        raise typer.Exit()


@cli.callback()
def main(
    db: DbOption = None,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """capsim: capacity simulator for self-hosted LLM serving."""
    global_db[:] = list(db or [])


COMMANDS = {
    "quants": ("capsim.cli.catalog_commands", "quants_list"),
    "engines": ("capsim.cli.catalog_commands", "engines_list"),
    "fit": ("capsim.cli.explain", "fit_cmd"),
    "explain": ("capsim.cli.explain", "explain_cmd"),
    "predict": ("capsim.cli.predict", "predict_cmd"),
    "validate": ("capsim.cli.validate", "validate_cmd"),
    "calibrate": ("capsim.cli.calibrate", "calibrate_cmd"),
    "calibrate-kernels": ("capsim.cli.calibrate", "calibrate_kernels_cmd"),
    "plan": ("capsim.cli.plan", "plan_cmd"),
    "capacity": ("capsim.cli.capacity", "capacity_cmd"),
    "serve": ("capsim.cli.serve", "serve_cmd"),
}
"""The commands, each defined in a cli module: (module, function), in the order --help
lists them. A command line names one, so only its module is imported (start-up time)."""

GROUPS = {
    "gpus": ("capsim.cli.catalog_commands", "gpus_app"),
    "models": ("capsim.cli.catalog_commands", "models_app"),
    "probe": ("capsim.cli.probe", "probe_app"),
    "import": ("capsim.cli.importers", "import_app"),
}
"""The command groups, each defined in a cli module: (module, Typer)."""


def _add_command(target: typer.Typer, name: str) -> None:
    """Register the command or group ``name`` of another cli module on ``target``."""
    import importlib

    if name in COMMANDS:
        module, attr = COMMANDS[name]
        target.command(name)(user_errors(getattr(importlib.import_module(module), attr)))
    else:
        module, attr = GROUPS[name]
        target.add_typer(getattr(importlib.import_module(module), attr), name=name)


@functools.cache
def full_app() -> typer.Typer:
    """Every command and group of the cli modules, registered once on ``cli``."""
    for name in [*GROUPS, *COMMANDS]:
        _add_command(cli, name)
    return cli


def __getattr__(name: str) -> Any:
    if name == "app":  # the whole command line, for tests and ``python -m``
        return full_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def app_for(args: list[str]) -> typer.Typer:
    """The command line that ``args`` needs: the global callback and the one command or
    group they name (so typer builds only its options, and no other command's module is
    imported), or every command where they name none, or one this module does not know
    (--help, a typo: the full listing and its did-you-mean)."""
    name = args[0] if args and not args[0].startswith("-") else None
    if name not in COMMANDS and name not in GROUPS:
        return full_app()
    slim = typer.Typer(**APP_SETTINGS)
    slim.registered_callback = cli.registered_callback
    _add_command(slim, name)
    return slim


EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process SIGTERM ended
_terminated = False


def _terminate_as_ctrl_c() -> None:
    """SIGTERM (a service manager, ``kill``, CI's timeout) stops a command the way Ctrl-C
    does: the work that finished is printed or kept, worker processes are stopped, no
    traceback; the exit status is 143. Worker processes forked later inherit the handler
    and die of SIGTERM as before."""
    import os
    import signal

    main = os.getpid()

    def handler(signum, frame):
        global _terminated
        if os.getpid() != main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        _terminated = True
        # as Python's own SIGINT handler does; not by sending SIGINT, which a shell that
        # starts a command in the background has set to be ignored (it then ran on)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _exit_interrupted(say: bool) -> None:
    """Leave at once after Ctrl-C, output flushed (``say``: print that it was interrupted,
    where the command has not said so itself): worker pools stopped mid-work leave
    concurrent.futures' exit hook racing its own threads (a spurious traceback at
    interpreter shutdown), and there is nothing left to clean up (what finished was
    printed or written as it finished)."""
    import os

    from capsim.cli.common import end_worker_processes

    end_worker_processes()  # any a pool started after the first ones were ended
    if say:
        err_console.print("interrupted", highlight=False)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(EXIT_TERMINATED if _terminated else EXIT_INTERRUPTED)


def _ignore_late_signals() -> None:
    """Once a command has finished, Ctrl-C or SIGTERM during the interpreter's shutdown
    changes nothing: its output is out and its exit status stands (they raised
    KeyboardInterrupt in the exit hooks, and the process died of SIGINT, status -2, with
    nothing said)."""
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def _output_failed(exc: OSError) -> None:
    """A write the command could not make (stdout on a full disk, /dev/full, a device that
    failed), or another refusal of the system no command caught: one line saying which
    and exit 2, never a traceback; nothing more is written to stdout (its buffer is
    dropped, so the interpreter's exit does not fail on it again)."""
    import errno
    import os

    where = f" '{exc.filename}'" if exc.filename else " the output"
    writing = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EROFS)
    said = f"cannot write{where}" if writing or exc.filename else "the system refused"
    with contextlib.suppress(Exception):
        sys.stderr.write(f"error: {said}: {exc.strerror or exc}\n")
        sys.stderr.flush()
    os._exit(2)


def _flush_stdout() -> None:
    """Flush stdout now, so that a write that fails (ENOSPC) is reported by
    ``_output_failed`` rather than as an exception ignored at interpreter shutdown."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass  # the reader left (| head): what it took was all it wanted
    except OSError as exc:
        _output_failed(exc)


def run(sigint=None) -> None:
    """Console-script entry point. ``sigint``: the SIGINT handler to put back once a
    Ctrl-C is caught here (capsim.entry holds its own while importing), None to leave
    the one in place."""
    try:
        if sigint is not None:
            import signal

            signal.signal(signal.SIGINT, sigint)
        _terminate_as_ctrl_c()
        app_for(sys.argv[1:])()
    except KeyboardInterrupt:
        _exit_interrupted(say=True)
    except SystemExit as exc:
        if exc.code == EXIT_INTERRUPTED:
            # typer turns a KeyboardInterrupt no command caught (Ctrl-C while starting up)
            # into exit 130 too: say it, unless the command said what it kept
            from capsim.cli import common

            _exit_interrupted(say=not common.said_interrupted)
        _ignore_late_signals()
        _flush_stdout()
        raise
    except BrokenPipeError:
        raise
    except OSError as exc:  # a write no command expected to fail (stdout on a full disk)
        _output_failed(exc)
    _ignore_late_signals()
    _flush_stdout()


if __name__ == "__main__":
    run()
