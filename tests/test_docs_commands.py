"""Every capsim command shown in README.md and docs/ parses against today's CLI, and the
quick ones run (issue 48: documented commands must not go stale). A command that needs
something the test cannot give (a running server, a file of the reader's, a placeholder)
is skipped by name, and the count of checked commands keeps the skip list honest."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from capsim.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.S | re.M)
NEEDS_OUTSIDE = ("...", " [", "path/to", "my-", "MY-", "http://", "result.json", "benchmarks.json")
"""Words of a command that stands for something the reader supplies (a server, a file, an
optional part in usage brackets)."""
RUN_FULLY = {"gpus", "models", "quants", "fit", "explain", "engines"}
"""Subcommands quick enough (well under a second) to run, not only parse, in the suite."""


def documented_commands() -> list[tuple[str, str]]:
    """(where, command line) for every capsim command in a fenced block of the README or
    docs/, continuation lines joined, prompts taken off; ``where`` ends with the command's
    trailing comment, which the command loses."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in FENCE.findall(path.read_text()):
            text = block.replace("\\\n", " ")
            for line in text.splitlines():
                if not line.startswith(("capsim ", "$ capsim ", ".venv/bin/capsim ", "python3 ")):
                    continue  # printed output, not a command
                for part in line.split("&&"):
                    part = part.strip().removeprefix("$ ").removeprefix(".venv/bin/")
                    if part.startswith("capsim "):
                        command = part.partition("  #")[0]
                        where = f"{path.relative_to(ROOT)}: {part}"
                        found.append((where, command.strip()))
    return found


COMMANDS = documented_commands()
CHECKED = [(where, c) for where, c in COMMANDS if not any(w in c for w in NEEDS_OUTSIDE)]


def test_the_documents_show_enough_commands_to_check():
    assert len(COMMANDS) >= 40
    assert len(CHECKED) >= 30, [c for _, c in COMMANDS if (_, c) not in CHECKED]


def parse_only(argv: list[str]):
    """Parse a command line down to its leaf command without running it: every option must
    exist and every value must pass its type and callbacks."""
    command = typer.main.get_command(app)
    ctx = command.make_context("capsim", list(argv), resilient_parsing=False)
    while hasattr(command, "resolve_command"):  # a group: descend to the subcommand
        # the subcommand's name and arguments (click 8.2 made protected_args private)
        protected = getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", [])
        args = [*protected, *ctx.args]
        if not args:
            break
        name, command, rest = command.resolve_command(ctx, args)
        ctx = command.make_context(name, rest, parent=ctx)
    return ctx


@pytest.mark.parametrize(("where", "command"), CHECKED, ids=[w for w, _ in CHECKED])
def test_a_documented_command_parses(where, command):
    argv = shlex.split(command)[1:]
    try:
        parse_only(argv)
    except Exception as error:  # typer carries its own copy of click's exceptions
        if not hasattr(error, "format_message"):
            raise
        pytest.fail(f"{where}: {error.format_message()}")


QUICK = [(w, c) for w, c in CHECKED if shlex.split(c)[1] in RUN_FULLY]


@pytest.mark.parametrize(("where", "command"), QUICK, ids=[w for w, _ in QUICK])
def test_a_quick_documented_command_runs(where, command):
    """It runs as documented: exit 0, or exit 2 where the document says so."""
    expected = 2 if "exit 2" in where.partition("  #")[2] else 0
    r = CliRunner().invoke(app, shlex.split(command)[1:])
    assert r.exit_code == expected, (where, r.output[-2000:])
    assert "Traceback" not in r.output
