"""Uncalibrated prediction bands: how far the uncalibrated model has been off on the
published corpus, per hardware class and metric family, as multiplicative factors.

``capsim validate --write-bands`` compares every scored corpus point and stores, for each
(hardware class, metric family) with at least ``MIN_POINTS`` points from ``MIN_SOURCES``
datasets, the 10th and 90th (and 25th and 75th) percentiles of measured / predicted; a
family with too little evidence in a class falls back to the pooled corpus, and says
so. ``predict`` multiplies each figure by those factors when no calibration profile
applies, so a prediction always states its 80% and 50% bands, and a band carries the
model's known bias (an asymmetric band around a biased prediction).

A dataset of n points weighs sqrt(n) in a band (``SOURCE_WEIGHT_POWER``): errors cluster by
source, so a large write-up must not decide the band alone, but the next deployment is
also more likely to look like a setup many points were measured on than like a one-point
note. ``capsim validate --coverage`` measures how often the bands hold a dataset they were
not built from.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from capsim.files import write_text_atomic

if TYPE_CHECKING:  # comparing the corpus is only for building bands, not for reading them
    from capsim.calibration.compare import ComparedPoint

MIN_POINTS = 15
"""Points a (class, family) needs for its own band; fewer use the pooled corpus."""

MIN_SOURCES = 6
"""Independent sources (datasets) a (class, family) needs for its own band. Errors cluster
by source (one write-up's hardware, model and harness are off together), so a class band
drawn from two or three write-ups is overconfident for the next one: with bands per class
from 3-4 sources, leave-one-dataset-out coverage of TPOT's 80% band was 68% against 77%
for the pooled band (November 2026 corpus). No class has six sources yet."""

POOLED = "all"
"""The hardware-class key of the pooled bands."""

SOURCE_WEIGHT_POWER = 0.5
"""A source with n points weighs n ** SOURCE_WEIGHT_POWER in a band, each point n ** (p - 1).
Chosen by leave-one-dataset-out coverage on the November 2026 corpus (362 scored points, 24
datasets): with every source weighing the same (p = 0) the throughput bands held 62% and 95%
of points (50% and 80% bands; 42-58% and 72-88% wanted), with every point weighing the same
(p = 1) 50% and 81%, TPOT 50% and 77%; p = 0.5 holds throughput 53% and 86%, TPOT 54% and
81%, and weighs a source's points less than p = 1, since they fall in or out together."""

LOW_Q, HIGH_Q = 10.0, 90.0
"""Percentiles of measured / predicted that bound the 80% band."""

LOW_Q50, HIGH_Q50 = 25.0, 75.0
"""Percentiles of measured / predicted that bound the 50% band."""


class Band(BaseModel):
    """80% and 50% bands as factors on a prediction: [low x predicted, high x predicted]."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    low: float = Field(gt=0)
    high: float = Field(gt=0)
    low_50: float | None = Field(default=None, gt=0)
    high_50: float | None = Field(default=None, gt=0)
    points: int = Field(ge=1, description="Corpus points it was measured on")
    sources: int | None = Field(default=None, ge=1, description="Datasets those points came from")


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


def weighted_percentiles(values, weights, percentiles) -> np.ndarray:
    """Percentiles of ``values`` where each carries ``weights`` (the midpoint rule: a value's
    cumulative share is counted to the middle of its own weight, interpolated between)."""
    order = np.argsort(values)
    v = np.asarray(values, dtype=float)[order]
    w = np.asarray(weights, dtype=float)[order]
    cumulative = (np.cumsum(w) - 0.5 * w) / w.sum()
    return np.interp(np.asarray(percentiles, dtype=float) / 100.0, cumulative, v)


def _band(rows: list[tuple[str, float]]) -> Band:
    """A band from (source, ratio) rows, a source of n rows weighing n **
    SOURCE_WEIGHT_POWER in all: a new deployment is a new source, so the spread between
    sources is what its error follows, with a large source counting more than a one-point
    one but far less than its size."""
    per_source = Counter(source for source, _ in rows)
    logs = [math.log(ratio) for _, ratio in rows]
    weights = [per_source[source] ** (SOURCE_WEIGHT_POWER - 1.0) for source, _ in rows]
    lo, lo50, hi50, hi = np.exp(
        weighted_percentiles(logs, weights, [LOW_Q, LOW_Q50, HIGH_Q50, HIGH_Q])
    )
    return Band(
        low=float(lo),
        high=float(hi),
        low_50=float(lo50),
        high_50=float(hi50),
        points=len(rows),
        sources=len(per_source),
    )


def _ratio(p: ComparedPoint) -> float | None:
    """measured / predicted in the direction of the figure: for a rate as given; for a
    latency the same (a band on a latency scales it alike)."""
    if not (p.predicted > 0 and math.isfinite(p.predicted) and p.measured > 0):
        return None
    return p.measured / p.predicted


def _family_ratio(p: ComparedPoint) -> tuple[str, float] | None:
    """(metric family, measured / predicted as the family's figure) of a scored point."""
    from capsim.calibration.compare import METRIC_KINDS

    ratio = _ratio(p)
    family = METRIC_KINDS.get(p.metric)
    if not p.scored or ratio is None or family is None:
        return None
    # decode and prompt rates are the inverse of TPOT and TTFT: flip them
    if p.metric in ("decode_tok_s", "prompt_tok_s"):
        ratio = 1.0 / ratio
    return family, ratio


BandRow = tuple[str, str, str, float]
"""(source, hardware class, metric family, measured / predicted)."""


def band_rows(points: list[ComparedPoint], gpu_class: dict[str, str], source_of) -> list[BandRow]:
    """The scored points as band rows (reference-only ones left out)."""
    rows = []
    for p in points:
        fr = _family_ratio(p)
        if fr is not None:
            rows.append((source_of(p), gpu_class.get(p.gpu, "?"), fr[0], fr[1]))
    return rows


def _table_from_rows(rows: list[BandRow]) -> BandTable:
    by_key: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for source, cls, family, ratio in rows:
        by_key.setdefault((POOLED, family), []).append((source, ratio))
        by_key.setdefault((cls, family), []).append((source, ratio))
    bands: dict[str, dict[str, Band]] = {}
    for (cls, family), kept in sorted(by_key.items()):
        sources = len({s for s, _ in kept})
        if cls == POOLED or (len(kept) >= MIN_POINTS and sources >= MIN_SOURCES):
            bands.setdefault(cls, {})[family] = _band(kept)
    pooled = sum(len(v) for (c, _), v in by_key.items() if c == POOLED)
    return BandTable(
        bands=bands,
        note=f"{pooled} scored corpus points from {len({r[0] for r in rows})} datasets, "
        "uncalibrated; 10/25/75/90th percentiles of measured / predicted, a dataset of n "
        f"points weighing n^{SOURCE_WEIGHT_POWER:g}",
    )


def build_band_table(points: list[ComparedPoint], gpu_class: dict[str, str]) -> BandTable:
    """Bands from compared corpus points (reference-only ones left out); ``gpu_class``
    maps a GPU name to its hardware class. A point's source is its dataset."""
    return _table_from_rows(band_rows(points, gpu_class, lambda p: p.dataset))


def default_bands_path() -> Path:
    from capsim.calibration.paths import calibration_dir

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
    """The band table in ``path``, from capsim's cache when this version of the file was
    read before (capsim/catalog/cache.py)."""
    from capsim.catalog.cache import cached_parse
    from capsim.catalog.loader import load_yaml_text

    def parse() -> BandTable:
        from capsim.files import read_input_text

        return BandTable.model_validate(load_yaml_text(read_input_text(path, "band table")))

    return cached_parse("bands", Path(path), [Path(__file__)], BandTable, parse)


def save_band_table(table: BandTable, path: Path) -> Path:
    import yaml

    return write_text_atomic(path, yaml.safe_dump(table.model_dump(mode="json"), sort_keys=False))


def band_coverage(
    points: list[ComparedPoint], gpu_class: dict[str, str], source_of
) -> dict[str, dict[str, float]]:
    """Leave-one-source-out coverage of the uncalibrated bands: for each source
    (``source_of(point)``, e.g. its dataset) a band table is built exactly as
    build_band_table builds the shipped one, from every other source's points, and the
    source's points are checked against it. Returns, per metric family, the share of
    points inside the 50% and 80% bands and the number of points checked; and the same
    shares with every source weighing the same (``sources_inside_50``/``_80``, the mean of
    each source's own share, over ``sources`` sources): the bands are built for the next
    source, and a source's points fall in or out together, so a few large sources decide
    the per-point share."""
    rows = band_rows(points, gpu_class, source_of)
    # per family, per source: [points, inside 50%, inside 80%]
    tally: dict[str, dict[str, list[int]]] = {}
    for source in sorted({r[0] for r in rows}):
        table = _table_from_rows([r for r in rows if r[0] != source])
        for _, cls, family, ratio in (r for r in rows if r[0] == source):
            band, _ = table.band(cls, family)
            if band is None or band.points < 2:
                continue
            t = tally.setdefault(family, {}).setdefault(source, [0, 0, 0])
            t[0] += 1
            t[1] += int(band.low_50 <= ratio <= band.high_50)
            t[2] += int(band.low <= ratio <= band.high)
    out = {}
    for family in sorted(tally):
        per_source = tally[family].values()
        n = sum(t[0] for t in per_source)
        out[family] = {
            "inside_50": sum(t[1] for t in per_source) / n,
            "inside_80": sum(t[2] for t in per_source) / n,
            "points": n,
            "sources_inside_50": float(np.mean([t[1] / t[0] for t in per_source])),
            "sources_inside_80": float(np.mean([t[2] / t[0] for t in per_source])),
            "sources": len(tally[family]),
        }
    return out
