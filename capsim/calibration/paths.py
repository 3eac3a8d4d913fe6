"""Where the calibration data lives (published corpus, shipped profiles, band table)."""

from __future__ import annotations

from pathlib import Path


def calibration_dir() -> Path:
    """The calibration data: shipped as capsim/calibration_data in a wheel, the top-level
    calibration/ in a checkout."""
    package = Path(__file__).resolve().parent.parent
    shipped = package / "calibration_data"
    if (shipped / "published").is_dir():
        return shipped
    return package.parent / "calibration"
