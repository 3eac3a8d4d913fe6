"""Uncalibrated prediction bands: how far the uncalibrated model has been off on the
published corpus, per hardware class and metric family, as multiplicative factors.

``capsim validate --write-bands`` compares every scored corpus point and stores, for each
(hardware class, metric family) with at least ``MIN_POINTS`` points, the 10th and 90th
percentiles of measured / predicted; a family with too few points in a class falls back to
the pooled corpus, and says so. ``predict`` multiplies each figure by those factors when
no calibration profile applies, so a prediction always states its 80% band, and the band
carries the model's known bias (an asymmetric band around a biased prediction).

The bands describe errors on the corpus the model was compared with (in-sample); they
are not yet measured to hold out of sample (issue 19's coverage check).
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from capsim.calibration.compare import METRIC_KINDS, ComparedPoint

MIN_POINTS = 15
"""Points a (class, family) needs for its own band; fewer use the pooled corpus."""

POOLED = "all"
"""The hardware-class key of the pooled bands."""

LOW_Q, HIGH_Q = 10.0, 90.0
"""Percentiles of measured / predicted that bound the 80% band."""


class Band(BaseModel):
    """An 80% band as factors on a prediction: [low x predicted, high x predicted]."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    low: float = Field(gt=0)
    high: float = Field(gt=0)
    points: int = Field(ge=1, description="Corpus points it was measured on")


class BandTable(BaseModel):
    """Bands by hardware class (or 'all') and metric family (throughput, TPOT, TTFT, E2E)."""

    model_config = ConfigDict(extra="forbid")

    created: str = Field(default_factory=lambda: dt.date.today().isoformat())
    note: str = ""
    bands: dict[str, dict[str, Band]]

    def band(self, hardware_class: str, family: str) -> tuple[Band | None, bool]:
        """The band for a class and family, and whether it is the pooled fallback."""
        own = self.bands.get(hardware_class, {}).get(family)
        if own is not None:
            return own, False
        return self.bands.get(POOLED, {}).get(family), True


def _band(ratios: list[float]) -> Band:
    r = np.asarray(ratios, dtype=float)
    return Band(
        low=float(np.percentile(r, LOW_Q)), high=float(np.percentile(r, HIGH_Q)), points=r.size
    )


def _ratio(p: ComparedPoint) -> float | None:
    """measured / predicted in the direction of the figure: for a rate as given; for a
    latency the same (a band on a latency scales it alike)."""
    if not (p.predicted > 0 and math.isfinite(p.predicted) and p.measured > 0):
        return None
    return p.measured / p.predicted


def build_band_table(points: list[ComparedPoint], gpu_class: dict[str, str]) -> BandTable:
    """Bands from compared corpus points (reference-only ones left out); ``gpu_class``
    maps a GPU name to its hardware class."""
    by_key: dict[tuple[str, str], list[float]] = {}
    for p in points:
        ratio = _ratio(p)
        family = METRIC_KINDS.get(p.metric)
        if not p.scored or ratio is None or family is None:
            continue
        # decode and prompt rates are the inverse of TPOT and TTFT: flip them
        if p.metric in ("decode_tok_s", "prompt_tok_s"):
            ratio = 1.0 / ratio
        by_key.setdefault((POOLED, family), []).append(ratio)
        by_key.setdefault((gpu_class.get(p.gpu, "?"), family), []).append(ratio)
    bands: dict[str, dict[str, Band]] = {}
    for (cls, family), ratios in sorted(by_key.items()):
        if cls == POOLED or len(ratios) >= MIN_POINTS:
            bands.setdefault(cls, {})[family] = _band(ratios)
    return BandTable(
        bands=bands,
        note=f"{sum(len(v) for (c, _), v in by_key.items() if c == POOLED)} scored corpus "
        "points, uncalibrated; 10th and 90th percentiles of measured / predicted",
    )


def default_bands_path() -> Path:
    from capsim.calibration.published import calibration_dir

    return calibration_dir() / "bands" / "uncalibrated.yaml"


def load_band_table(path: Path | None = None) -> BandTable | None:
    """The shipped (or given) band table, or None when there is none. Parsed once per file
    version (path, size, modification time): predict asks for it at every call, and the
    planner and the capacity search call predict many times."""
    target = path or default_bands_path()
    try:
        stat = target.stat()
    except OSError:
        return None
    return _load_band_version(str(target.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _load_band_version(path: str, mtime_ns: int, size: int) -> BandTable:
    from capsim.catalog.loader import load_yaml_text

    return BandTable.model_validate(load_yaml_text(Path(path).read_text(encoding="utf-8")))


def save_band_table(table: BandTable, path: Path) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(table.model_dump(mode="json"), sort_keys=False))
    return path


COVERAGE_LEVELS = (50.0, 80.0)
"""Central band widths (percent) whose out-of-sample coverage ``band_coverage`` measures."""


def _family_ratio(p: ComparedPoint) -> tuple[str, float] | None:
    ratio = _ratio(p)
    family = METRIC_KINDS.get(p.metric)
    if not p.scored or ratio is None or family is None:
        return None
    if p.metric in ("decode_tok_s", "prompt_tok_s"):
        ratio = 1.0 / ratio
    return family, ratio


def band_coverage(
    points: list[ComparedPoint], gpu_class: dict[str, str], source_of
) -> dict[str, dict[str, float]]:
    """Leave-one-source-out coverage of the uncalibrated bands: for each source
    (``source_of(point)``, e.g. its dataset), bands are built as build_band_table does from
    every other source's points (the class's own with MIN_POINTS, else pooled) and the
    source's points are checked against them. Returns, per metric family, the share of
    points inside the 50% and 80% bands and the number of points checked."""
    rows = []
    for p in points:
        fr = _family_ratio(p)
        if fr is not None:
            rows.append((source_of(p), gpu_class.get(p.gpu, "?"), fr[0], fr[1]))
    inside: dict[str, dict[float, int]] = {}
    counts: dict[str, int] = {}
    for source in sorted({r[0] for r in rows}):
        train = [r for r in rows if r[0] != source]
        for _, cls, family, ratio in (r for r in rows if r[0] == source):
            own = [r[3] for r in train if r[1] == cls and r[2] == family]
            pool = own if len(own) >= MIN_POINTS else [r[3] for r in train if r[2] == family]
            if len(pool) < 2:
                continue
            counts[family] = counts.get(family, 0) + 1
            for width in COVERAGE_LEVELS:
                lo, hi = np.percentile(pool, [50 - width / 2, 50 + width / 2])
                hit = int(lo <= ratio <= hi)
                inside.setdefault(family, {}).setdefault(width, 0)
                inside[family][width] += hit
    return {
        family: {
            **{f"inside_{w:.0f}": inside[family][w] / counts[family] for w in COVERAGE_LEVELS},
            "points": counts[family],
        }
        for family in sorted(counts)
    }
