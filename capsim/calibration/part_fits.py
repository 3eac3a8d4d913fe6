"""``validate --calibrated``'s work: each dataset part fitted and cross-validated, the parts
spread over the cores, and each scenario simulation told to the parent's progress bar."""

from __future__ import annotations


def point_key(p) -> tuple[str, int, str, str]:
    """A compared point's place in its dataset part: scenario, level, metric and statistic
    (a source may quote a level's TTFT as a mean, a median and a p99)."""
    return p.scenario, p.concurrency, p.metric, p.statistic


def calibration_parts(datasets, cat, skipped: list | None = None) -> list:
    """The datasets as ``validate --calibrated`` fits them, by name: a dataset spanning
    hardware classes is fitted per class, as a calibration would; scenarios capsim cannot
    simulate are left out, and appended to ``skipped`` (SkippedScenario) if given."""
    from capsim.calibration.compare import SkippedScenario, skip_reason
    from capsim.calibration.crossval import group_by_class

    kept = []
    for ds in datasets:
        scenarios = []
        for sc in ds.scenarios:
            reason = skip_reason(ds, sc, cat)
            if reason is None:
                scenarios.append(sc)
            elif skipped is not None:
                skipped.append(SkippedScenario(ds.name, sc.name, len(sc.points), reason))
        if scenarios:
            kept.append(ds.model_copy(update={"scenarios": scenarios}))
    parts = [part for group in group_by_class(kept, cat).values() for part in group]
    return sorted(parts, key=lambda d: d.name)


LINEARISED_POINTS_PER_PARAMETER = 3
"""``validate --calibrated`` leaves points out by refitting a dataset of at most this many
points a fitted parameter, and linearises the fit above it."""


def refits_points(ds, parameters: int, cv: str) -> bool:
    """Whether ``part_errors`` leaves each point of a part out by a refit (``cv`` 'refit',
    or at most LINEARISED_POINTS_PER_PARAMETER points a fitted parameter) rather than
    from the fit linearised at its optimum."""
    return cv != "linearised" or (
        points_of(ds) <= LINEARISED_POINTS_PER_PARAMETER * max(parameters, 1)
    )


def part_errors(
    ds,
    cat,
    fit: tuple[str, ...] | None = None,
    prior_weight: float = 0.0,
    status=None,
    cv: str = "linearised",
    level_cv: str = "linearised",
) -> list[dict]:
    """Uncalibrated, in-sample (fitted on the dataset) and cross-validated (leave one
    concurrency level out; leave one point out) errors of every point of one dataset
    part, every fit pulled towards the priors by ``prior_weight``; ``status(text)``, if
    given, hears which step runs. Each level (``level_cv``) and each point (``cv``) left
    out is refitted ('refit') or predicted from the full fit linearised at its optimum
    ('linearised', crossval.linearised_cross_validation), where the levels and points
    that alone decide a parameter, and every one of a dataset of few points a parameter,
    are refitted."""
    from capsim.calibration.compare import compare_dataset
    from capsim.calibration.crossval import (
        cross_validate,
        leave_one_point_out,
        linearised_cross_validation,
    )
    from capsim.calibration.fit import Sensitivities, fit_profile

    say = status or (lambda text: None)
    say(f"{ds.name}: simulating")
    raw = compare_dataset(ds, cat)
    say(f"{ds.name}: fitting")
    sensitivities = Sensitivities({})
    fitted = fit_profile(
        [ds],
        cat,
        f"{ds.name}-fit",
        fit,
        prior_weight=prior_weight,
        sensitivities=sensitivities,
        record=True,
    )
    inside = fitted.residuals  # every point at the fitted values, in dataset order
    start = fitted.fitted_values
    options = dict(start=start, prior_weight=prior_weight)
    # a few points a parameter are cheap to refit, and the linear picture of the fit is
    # poor there (seed 000: three points, 31.7% linearised against 73.7% refitted)
    linear = not refits_points(ds, len(start), "linearised")
    by_level_linear = by_point = None
    high: list[int] = []
    high_levels: list[int] = []
    if linear and "linearised" in (cv, level_cv):
        say(f"{ds.name}: leaving out (linearised)")
        by_level_linear, by_point, high, high_levels = linearised_cross_validation(
            [ds], cat, start, fitted.held, prior_weight
        )
    if level_cv == "linearised" and by_level_linear is not None:
        by_level = {point_key(p): p for p in by_level_linear}
        if high_levels:  # levels that decide a parameter alone are refitted
            say(f"{ds.name}: refitting {len(high_levels)} level(s) of high leverage")
            again = cross_validate(
                [ds],
                cat,
                fit,
                scheme="level",
                sensitivities=sensitivities,
                only_levels=high_levels,
                **options,
            )
            by_level.update({point_key(p): p for p in again})
    else:
        say(f"{ds.name}: leaving levels out")
        levels = cross_validate(
            [ds], cat, fit, scheme="level", sensitivities=sensitivities, **options
        )
        by_level = {point_key(p): p for p in levels}
    options["held"] = fitted.held  # a point's refit fits what the fit on every point chose
    if cv == "linearised" and by_point is not None:
        if high:  # points that decide a parameter alone are refitted
            say(f"{ds.name}: refitting {len(high)} point(s) of high leverage")
            again = leave_one_point_out([ds], cat, fit, only=high, **options)
            for k, point in zip(high, again, strict=True):
                by_point[k] = point
    else:
        say(f"{ds.name}: leaving points out")
        by_point = cross_validate([ds], cat, fit, scheme="point", **options)
    rows = []
    for r, i, pt in zip(raw, inside, by_point, strict=True):
        c = by_level.get(point_key(r))
        rows.append(
            {
                "dataset": ds.name,
                "scenario": r.scenario,
                "concurrency": r.concurrency,
                "metric": r.metric,
                "statistic": r.statistic,
                "measured": r.measured,
                "uncalibrated": r.error,
                "in_sample": i.error,
                "cross_validated": None if c is None else c.error,
                "cross_validated_point": pt.error,
            }
        )
    return rows


_simulations_queue = None
"""In a worker of ``calibrated_part_rows``: the queue it tells of each scenario it
simulates (the index of the part it works on and the simulation's seconds), for the
parent's progress bar."""


def _hear_simulations_on(queue) -> None:
    global _simulations_queue
    _simulations_queue = queue


def part_errors_in_worker(args) -> list[dict]:
    """``part_errors`` in a worker process (the catalog read there once, by directory),
    each scenario simulation told to the parent's queue under the part's index."""
    from capsim.calibration.compare import listen_to_simulations
    from capsim.catalog.loader import process_catalog

    index, ds, dirs, fit, prior_weight, cv, level_cv = args
    queue = _simulations_queue
    listen_to_simulations(None if queue is None else lambda s: queue.put((index, s)))
    try:
        return part_errors(ds, process_catalog(dirs), fit, prior_weight, cv=cv, level_cv=level_cv)
    finally:
        listen_to_simulations(None)


SIMULATION_POLL_S = 0.25
"""How often (s) the parent reads the workers' simulation counts while parts run."""


def calibrated_part_rows(
    parts,
    cat,
    fit,
    prior_weight: float,
    cv: str,
    status=None,
    simulated=None,
    level_cv: str = "linearised",
):
    """Yield (index, rows) of each dataset part's ``part_errors`` as it finishes: one part
    a core, each fitted in series within its process (a part's own scenarios are too few
    to keep the cores busy; a pool's worker starts no pool), in series on one core or with
    one part. ``status(text)``, if given, hears which step runs where the parts run in
    series; ``simulated(index, seconds)``, if given, hears of each scenario simulation of
    part ``index`` and its wall-clock seconds (read from the workers every
    SIMULATION_POLL_S)."""
    import multiprocessing
    import queue as queues
    from concurrent.futures import FIRST_COMPLETED, wait

    from capsim.calibration.compare import catalog_dirs, listen_to_simulations
    from capsim.engine.pool import cores_for, worker_pool

    workers = cores_for(len(parts))
    if workers < 2:
        for i, ds in enumerate(parts):
            previous = listen_to_simulations(
                None if simulated is None else lambda s, i=i: simulated(i, s)
            )
            try:
                rows = part_errors(ds, cat, fit, prior_weight, status, cv, level_cv)
            finally:
                listen_to_simulations(previous)
            yield i, rows
        return
    dirs = catalog_dirs(cat)
    heard = multiprocessing.get_context().Queue() if simulated is not None else None

    def tell() -> None:
        while heard is not None:
            try:
                simulated(*heard.get_nowait())
            except queues.Empty:
                return

    with worker_pool(workers, _hear_simulations_on, (heard,)) as pool:
        # the costliest parts first, so that the last to finish is a small one (ordered by
        # points, the Gemma-4 cells' 6 points of 1-3 s simulations ran last, alone)
        order = sorted(range(len(parts)), key=lambda i: -part_cost(parts[i], fit, cv, level_cv))
        futures = {
            pool.submit(
                part_errors_in_worker, (i, parts[i], dirs, fit, prior_weight, cv, level_cv)
            ): i
            for i in order
        }
        pending = set(futures)
        while pending:
            finished, pending = wait(
                pending, timeout=SIMULATION_POLL_S, return_when=FIRST_COMPLETED
            )
            tell()
            for future in finished:
                yield futures[future], future.result()


def part_cost(
    ds, fit: tuple[str, ...] | None = None, cv: str = "linearised", level_cv: str = "linearised"
) -> float:
    """A dataset part's relative cost in ``validate --calibrated``: its expected scenario
    simulations (``expected_simulations``) times the tokens a simulation of its scenarios
    sends (requests x (prompt + output) a level, summed over levels; a scenario capsim
    refuses counts one token). Only the order of the parts reads it."""
    from capsim.calibration.compare import scenario_cost

    tokens = sum(scenario_cost(ds, sc) for sc in ds.scenarios)
    simulations = expected_simulations(ds, fit, cv, level_cv)
    return simulations / max(len(ds.scenarios), 1) * max(tokens, 1.0)


def points_of(ds) -> int:
    return sum(len(sc.points) for sc in ds.scenarios)


SIMULATIONS_PER_FIT = 50
"""Scenario simulations the fit on every point of a dataset part takes, each scenario
counted once (its choice of parameters, the stagewise start, the joint fit with its
Jacobians and the held-value search). Counted on 2026-12-01 with
benchmarks/bench_validate_progress.py, levels and points linearised: 50 for the RTX 4090
Mistral part (one scenario, 5 levels), 165 for InferenceX's gpt-oss-120b 1k/1k (3
scenarios: 55 each), 94 for NIM's Llama-3.3-70B (one scenario, 8 levels). The estimate a
progress bar needs, not a figure of capsim's."""

SIMULATIONS_PER_LEVEL_REFIT = 20
"""Scenario simulations one level's refit takes (its fold starts at the fit on every
point and reuses that fit's choice of parameters): the RTX 4090 Mistral part's five folds
took about 110 simulations (2026-12-01, before the default became linearised)."""

SIMULATIONS_PER_POINT_REFIT = 6
"""Scenario simulations one point's refit takes (the parameters the fit on every point
chose, from its optimum): the TTIS A100 Qwen3-1.7B part, 4 scenarios of one level and
6 points every one refitted, took 328 simulations with its fit (2026-12-01)."""

DEFAULT_FITTED_PARAMETERS = 3
"""Parameters a fit is taken to choose where --fit does not say (the estimate of whether
a part's points are left out by refits or linearised)."""


def expected_simulations(
    ds, fit: tuple[str, ...] | None, cv: str, level_cv: str = "linearised"
) -> int:
    """About how many scenario simulations ``part_errors`` runs for a dataset part, per
    scenario: the fit on every point (SIMULATIONS_PER_FIT), a refit a level left out where
    there are two levels or more and levels are refitted (``level_cv`` 'refit', or few
    points a parameter; SIMULATIONS_PER_LEVEL_REFIT), a refit a point where points are
    refitted (``cv`` 'refit', or few points a parameter; SIMULATIONS_PER_POINT_REFIT), and
    one simulation a parameter and one more where the fit is linearised."""
    scenarios = len(ds.scenarios)
    levels = len({p.concurrency for sc in ds.scenarios for p in sc.points})
    parameters = len(fit) if fit else DEFAULT_FITTED_PARAMETERS
    few = refits_points(ds, parameters, "linearised")
    each = SIMULATIONS_PER_FIT
    if levels >= 2 and (level_cv != "linearised" or few):
        each += SIMULATIONS_PER_LEVEL_REFIT * levels
    if refits_points(ds, parameters, cv):
        each += SIMULATIONS_PER_POINT_REFIT * points_of(ds)
    if not few and "linearised" in (cv, level_cv):
        each += parameters + 1
    return scenarios * each


class FitProgress:
    """How far ``validate --calibrated`` has come, in seconds of simulation: each part's
    work is its expected simulations (``expected_simulations``) times the seconds its own
    simulations took so far (before its first, the mean of the parts heard from, or 1 s),
    and it counts as done up to CAP of that until the part finishes, when its estimate
    becomes what it took. Simulations run at the wall clock's pace on each busy core, so a
    bar over these seconds shows a time left from the first simulation on."""

    CAP = 0.95

    def __init__(self, parts, fit: tuple[str, ...] | None, cv: str, level_cv: str = "linearised"):
        self.expected = [expected_simulations(ds, fit, cv, level_cv) for ds in parts]
        self.simulations = [0] * len(parts)
        self.seconds = [0.0] * len(parts)
        self.finished: set[int] = set()

    def simulated(self, index: int, seconds: float) -> None:
        """Part ``index`` ran a scenario simulation of ``seconds``."""
        if index not in self.finished:
            self.simulations[index] += 1
            self.seconds[index] += seconds

    def finish(self, index: int) -> None:
        self.finished.add(index)

    def _per_simulation(self) -> float:
        heard = [i for i, n in enumerate(self.simulations) if n]
        if not heard:
            return 1.0
        return sum(self.seconds[i] for i in heard) / sum(self.simulations[i] for i in heard)

    def _work(self, index: int, mean: float) -> float:
        if index in self.finished:
            return self.seconds[index]
        n = self.simulations[index]
        each = self.seconds[index] / n if n else mean
        return max(self.expected[index], n / self.CAP) * each

    def total(self) -> float:
        mean = self._per_simulation()
        return sum(self._work(i, mean) for i in range(len(self.expected)))

    def completed(self) -> float:
        """Seconds simulated so far: a running part's stay below CAP of its work, which
        ``_work`` never lets fall under its seconds / CAP."""
        return sum(self.seconds)
