"""Shared fixtures: the built-in catalog, loaded once per test session."""

from __future__ import annotations

import os
import tempfile

import pytest
import typer.testing

from capsim.catalog.loader import load_catalog

_build_command = typer.testing._get_command
_commands: dict[int, tuple] = {}


def _command_built_once(app):
    """typer's CliRunner builds the click command from the app on every invoke: about
    0.2 s for capsim's whole command line, two thirds of a quick command's test. The app
    (``capsim.cli.main.app``, built once) does not change between tests, so its command is
    built once a process; the app is kept beside it so its id stays its own."""
    key = id(app)
    if key not in _commands:
        _commands[key] = (app, _build_command(app))
    return _commands[key][1]


typer.testing._get_command = _command_built_once


def pytest_configure(config):
    # profiles of the machine's user (capsim calibrate's default output) must not change
    # what the tests see: an empty user profile folder of the session's own
    os.environ["CAPSIM_PROFILE_DIR"] = tempfile.mkdtemp(prefix="capsim-profiles-")
    # the parsed catalog the commands cache (capsim/catalog/cache.py) and imported models
    # go to a cache folder of the session's own, not the user's
    os.environ["CAPSIM_CACHE_DIR"] = tempfile.mkdtemp(prefix="capsim-cache-")


def pytest_xdist_auto_num_workers(config):
    """Two workers a core (``-n auto``; ``--maxprocesses`` caps it). About a fifth of the
    suite's time is spent waiting on the wall clock (real servers, mock servers, round
    trips, Ctrl-C), which leaves a core idle under one worker; a second keeps it busy, and
    the suite keeps its pace beside another busy process (2-core machine beside a CPU hog:
    5:38 with two workers, 4:58 with four)."""
    return 2 * (os.cpu_count() or 1)


@pytest.fixture(scope="session")
def cat():
    return load_catalog()
