"""The independent datasheet check (hardware_db/checks/datasheet-check-2026-11.yaml) stays in step
with the catalog: each check's catalog_value is the catalog's current value, and few checks
disagree with the datasheets."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import yaml

from capsim.catalog.loader import builtin_db_dir, load_catalog

CHECKS = builtin_db_dir() / "checks" / "datasheet-check-2026-11.yaml"


@cache
def _catalog():
    return load_catalog()


def _checks() -> list[dict]:
    return yaml.safe_load(Path(CHECKS).read_text())


def _field(gpu, dotted: str):
    value = gpu
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def test_checks_file_is_well_formed():
    checks = _checks()
    assert len(checks) >= 40
    assert len({c["gpu"] for c in checks}) >= 20
    assert len({c["field"] for c in checks}) >= 4
    for c in checks:
        assert isinstance(c["agrees"], bool), c
        assert c["datasheet_value"] > 0, c
        src = c["source"]
        assert src["title"] and src["url"] and src["quote"], c


@pytest.mark.parametrize("check", _checks(), ids=lambda c: f"{c['gpu']}:{c['field']}")
def test_catalog_value_is_current(check):
    gpu = _catalog().gpu(check["gpu"])
    assert _field(gpu, check["field"]) == pytest.approx(check["catalog_value"]), (
        f"{check['gpu']}.{check['field']} changed in the catalog; revisit its datasheet check"
    )


def test_agreement_flags_match_the_values():
    for c in _checks():
        rel = abs(c["catalog_value"] - c["datasheet_value"]) / c["datasheet_value"]
        if rel <= 0.01:
            assert c["agrees"], f"{c['gpu']}.{c['field']} is within 1% but marked as disagreeing"
        elif c["agrees"]:
            assert c.get("note"), f"{c['gpu']}.{c['field']} is off by {rel:.1%}; say why it agrees"


def test_few_checks_disagree():
    checks = _checks()
    disagree = [c for c in checks if not c["agrees"]]
    assert len(disagree) / len(checks) <= 0.05, [(c["gpu"], c["field"]) for c in disagree]
    for c in disagree:
        assert c.get("note"), f"{c['gpu']}.{c['field']} disagrees without a note"
