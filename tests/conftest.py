"""Shared fixtures: the built-in catalog, loaded once per test session."""

from __future__ import annotations

import os
import tempfile

import pytest

from capsim.catalog.loader import load_catalog


def pytest_configure(config):
    # profiles of the machine's user (capsim calibrate's default output) must not change
    # what the tests see: an empty user profile folder of the session's own
    os.environ["CAPSIM_PROFILE_DIR"] = tempfile.mkdtemp(prefix="capsim-profiles-")
    # the parsed catalog the commands cache (capsim/catalog/cache.py) and imported models
    # go to a cache folder of the session's own, not the user's
    os.environ["CAPSIM_CACHE_DIR"] = tempfile.mkdtemp(prefix="capsim-cache-")


@pytest.fixture(scope="session")
def cat():
    return load_catalog()
