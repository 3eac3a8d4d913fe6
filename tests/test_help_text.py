"""Every flag of every command says what it is in --help (issue 48 item 7)."""

from __future__ import annotations

import click
import typer

from capsim.cli.main import full_app


def options_without_help(command, path: str):
    """Options of ``command`` (and of its subcommands) with no help text. Typer ships its
    own copy of click, so the walk goes by what a parameter is, not by its class."""
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from options_without_help(sub, f"{path} {name}")
        return
    for param in command.params:
        told = (getattr(param, "help", None) or "").strip()
        if param.param_type_name == "option" and not param.hidden and not told:
            yield f"{path} {'/'.join(param.opts)}"


def test_every_option_of_every_command_has_help_text():
    command = typer.main.get_command(full_app())
    assert len(command.commands) >= 15
    missing = list(options_without_help(command, "capsim"))
    assert not missing, missing


def test_the_walk_finds_an_option_without_help():
    @click.command()
    @click.option("--bare")
    @click.option("--told", help="Says what it is")
    def cmd(bare, told):
        pass

    assert list(options_without_help(cmd, "x")) == ["x --bare"]
