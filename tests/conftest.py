"""Shared fixtures: the built-in catalog, loaded once per test session."""

from __future__ import annotations

import pytest

from capsim.catalog.loader import load_catalog


@pytest.fixture(scope="session")
def cat():
    return load_catalog()
