"""Leave-one-source-out error (issue 46): each published source predicted with the priors
that were chosen while looking at it put back to what they would have been without it.

Most priors come from datasheets, kernel benchmarks and engine source code, and no corpus
point had a say in them; for those a source's leave-one-source-out prediction is its
in-sample one. ``calibration/priors_in_view.yaml`` lists the others: each names the
parameter values a choice set (``chosen``), the values it would have had without the
sources in view (``without``), and those sources (``in_view``). A scenario of a source in
view whose resolved parameters carry the chosen values is simulated again with the
``without`` values laid over them; every other point keeps its prediction.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from capsim.calibration.compare import (
    METRIC_KINDS,
    ComparedPoint,
    compare_in_worker,
    error_summary,
    simulated_engine,
)
from capsim.calibration.paths import calibration_dir
from capsim.calibration.published import PublishedDataset
from capsim.catalog.loader import Catalog, format_validation_error, load_yaml_text
from capsim.engine.levels import catalog_dirs
from capsim.engine.pool import cores_for, worker_pool
from capsim.errors import CapsimUserError
from capsim.files import read_input_text
from capsim.physics.deployment import default_efficiency
from capsim.physics.efficiency import EfficiencyParams


class PriorInView(BaseModel):
    """A prior chosen while corpus points were in view."""

    model_config = ConfigDict(extra="forbid")

    prior: str = Field(description="Which prior, and the catalog file that holds it")
    chosen: dict[str, float | None] = Field(
        min_length=1, description="Parameter values it set (null: it unset an optional one)"
    )
    without: dict[str, float | None] = Field(
        min_length=1,
        description="The values each parameter would have without the sources (null: "
        "unset, the path the parameter's absence gives)",
    )
    in_view: list[str] = Field(min_length=1, description="Corpus datasets looked at")
    hardware_classes: list[str] | None = Field(
        None,
        description="Only GPUs of these classes (where other classes carry the same values "
        "for reasons of their own); None: wherever the values are in effect",
    )
    engines: list[str] | None = Field(
        None,
        description="Only scenarios run on these engines (where another engine carries the "
        "same values for reasons of its own); None: every engine",
    )
    how: str = Field(description="What was looked at, and how it swayed the choice")

    @model_validator(mode="after")
    def _same_parameters(self) -> PriorInView:
        known = set(EfficiencyParams.model_fields)
        for name in (*self.chosen, *self.without):
            if name not in known:
                raise ValueError(f"'{name}' is not an efficiency parameter")
        if set(self.chosen) != set(self.without):
            raise ValueError("chosen and without must name the same parameters")
        return self

    def in_effect(
        self, params: EfficiencyParams, hardware_class: str, engine: str | None = None
    ) -> bool:
        """Whether a GPU of ``hardware_class`` resolved to ``params`` carries this prior
        (``engine``: the scenario's engine, as its dataset names it)."""
        if self.hardware_classes is not None and hardware_class not in self.hardware_classes:
            return False
        if self.engines is not None and engine not in self.engines:
            return False
        return all(
            getattr(params, name) is None
            if value is None
            else getattr(params, name) is not None
            and math.isclose(getattr(params, name), value, rel_tol=1e-9)
            for name, value in self.chosen.items()
        )


def priors_in_view_path() -> Path:
    return calibration_dir() / "priors_in_view.yaml"


def load_priors_in_view(path: Path | None = None) -> list[PriorInView]:
    """The registry (default: calibration/priors_in_view.yaml)."""
    path = path or priors_in_view_path()
    text = read_input_text(path, "priors-in-view registry")
    data = load_yaml_text(text)
    if not isinstance(data, list):
        raise CapsimUserError(f"{path}: expected a list of priors, got {type(data).__name__}")
    from pydantic import TypeAdapter

    try:  # validated as one list, so an error's location starts with the entry's index
        return TypeAdapter(list[PriorInView]).validate_python(data)
    except ValidationError as exc:
        raise CapsimUserError(format_validation_error(path, exc, text)) from None


def left_out_overrides(
    priors: list[PriorInView],
    dataset: str,
    params: EfficiencyParams,
    hardware_class: str,
    engine: str | None = None,
) -> dict[str, float]:
    """The parameter values a scenario of ``dataset`` (on a GPU of ``hardware_class``,
    resolved to ``params``, run on ``engine``) is predicted with when its source is left
    out: every prior with it in view and in effect there, put back."""
    overrides: dict[str, float] = {}
    for prior in priors:
        if dataset in prior.in_view and prior.in_effect(params, hardware_class, engine):
            overrides.update(prior.without)
    return overrides


def leave_one_source_out(
    datasets: list[PublishedDataset],
    points: list[ComparedPoint],
    catalog: Catalog,
    priors: list[PriorInView] | None = None,
    overrides: dict[str, float] | None = None,
) -> list[ComparedPoint]:
    """``points`` (validate's in-sample comparison of ``datasets``, made with efficiency
    ``overrides`` if any) as each source is predicted with the priors chosen while looking
    at it put back: the scenarios such a prior reaches are simulated again (``overrides``
    still laid over last), every other point is returned as it was."""
    priors = load_priors_in_view() if priors is None else priors
    overrides = overrides or {}
    in_view = {name for prior in priors for name in prior.in_view}
    jobs = []
    for ds in (d for d in datasets if d.name in in_view):  # no other source is put back
        for sc in ds.scenarios:
            try:
                gpu = catalog.gpu(sc.gpu)
                params = default_efficiency(gpu, catalog, catalog.engine(simulated_engine(sc)))
            except CapsimUserError:
                continue  # a scenario validate skipped: it has no in-sample points either
            params = params.with_overrides(overrides) if overrides else params
            put_back = left_out_overrides(priors, ds.name, params, gpu.hardware_class, sc.engine)
            if put_back:
                jobs.append((ds, sc, catalog_dirs(catalog), None, {**put_back, **overrides}))
    workers = cores_for(len(jobs))
    if workers > 1:
        with worker_pool(workers) as pool:
            results = list(pool.map(compare_in_worker, jobs))
    else:
        results = [compare_in_worker(job) for job in jobs]
    # a scenario's points come back in the order of its measurements, as validate's did
    redone: dict[tuple[str, str], Iterator[ComparedPoint]] = {
        (ds.name, sc.name): iter(again) for (ds, sc, *_), again in zip(jobs, results, strict=True)
    }
    out = []
    for p in points:
        again = redone.get((p.dataset, p.scenario))
        if again is None:
            out.append(p)
            continue
        twin = next(again)
        assert (twin.concurrency, twin.metric, twin.measured) == (
            p.concurrency,
            p.metric,
            p.measured,
        )
        out.append(replace(p, predicted=twin.predicted))
    return out


def loso_summaries(in_sample: list[ComparedPoint], left_out: list[ComparedPoint]) -> list[dict]:
    """In-sample and leave-one-source-out errors side by side (issue 46): every point and
    the counted ones by metric family, the counted ones by accelerator; each row has the
    in-sample median absolute error, the left-out one and the left-out median signed."""

    def family(p):
        return METRIC_KINDS.get(p.metric, p.metric)

    groups = [
        ("every point", lambda p: True, family),
        ("counted", lambda p: p.scored, family),
        ("counted", lambda p: p.scored, lambda p: p.gpu),
    ]
    rows = []
    for label, keep, key in groups:
        inside = error_summary([p for p in in_sample if keep(p)], key)
        outside = {r["group"]: r for r in error_summary([p for p in left_out if keep(p)], key)}
        for r in inside:
            o = outside[r["group"]]
            rows.append(
                {
                    "points": label,
                    "group": r["group"],
                    "count": r["points"],
                    "in_sample_median_abs_error_percent": r["median_abs_error_percent"],
                    "left_out_median_abs_error_percent": o["median_abs_error_percent"],
                    "left_out_median_optimism_percent": o["median_optimism_percent"],
                }
            )
    return rows
