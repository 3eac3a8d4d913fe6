"""Benchmark: leaving a concurrency level out by refitting against predicting it from the
fit on every point linearised at its optimum (``validate --calibrated --level-cv``).

Run:  .venv/bin/python benchmarks/bench_level_cv.py [DATASET_NAME ...]
(default: every dataset part of calibration/published with two levels or more, in series
in this process; about 10 minutes on the 2-core development machine)

Prints, per part: points, the seconds of the fit on every point, of the levels' refits and
of the linearisation, and the median absolute leave-a-level-out error each way; then the
medians over every point and the share of points whose two errors differ by more than 5
points. The linearised figures here are the raw linear picture: validate refits the levels
of high leverage on top (crossval._group_leverage).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from capsim.calibration.crossval import cross_validate, linearised_cross_validation
from capsim.calibration.fit import Sensitivities, fit_profile
from capsim.calibration.part_fits import calibration_parts, point_key
from capsim.calibration.published import load_published
from capsim.catalog.loader import load_catalog


def main(names: list[str]) -> None:
    cat = load_catalog()
    datasets = [d for d in load_published() if not names or d.name in set(names)]
    refits, linears = [], []
    seconds = {"fit": 0.0, "refit": 0.0, "linearised": 0.0}
    for ds in calibration_parts(datasets, cat):
        if len({p.concurrency for sc in ds.scenarios for p in sc.points}) < 2:
            continue
        sensitivities = Sensitivities({})
        t0 = time.perf_counter()
        fitted = fit_profile([ds], cat, "full", None, sensitivities=sensitivities, record=True)
        t1 = time.perf_counter()
        start = fitted.fitted_values
        refit = cross_validate(
            [ds], cat, None, scheme="level", sensitivities=sensitivities, start=start
        )
        t2 = time.perf_counter()
        linear, _, _, high_levels = linearised_cross_validation([ds], cat, start, fitted.held)
        t3 = time.perf_counter()
        by_refit = {point_key(p): p.error for p in refit}
        by_linear = {point_key(p): p.error for p in linear}
        keys = [k for k in by_refit if k in by_linear]
        r = np.array([by_refit[k] for k in keys])
        lin = np.array([by_linear[k] for k in keys])
        refits += r.tolist()
        linears += lin.tolist()
        seconds["fit"] += t1 - t0
        seconds["refit"] += t2 - t1
        seconds["linearised"] += t3 - t2
        if keys:
            print(
                f"{ds.name}: {len(keys)} points, fit {t1 - t0:.1f} s, refits {t2 - t1:.1f} s, "
                f"linearised {t3 - t2:.1f} s; leave a level out {100 * np.median(abs(r)):.1f}% "
                f"refitted, {100 * np.median(abs(lin)):.1f}% linearised"
                + (f" (levels of high leverage: {high_levels})" if high_levels else ""),
                flush=True,
            )
    r, lin = np.array(refits), np.array(linears)
    print(
        f"every point ({r.size}): {100 * np.median(abs(r)):.1f}% refitted, "
        f"{100 * np.median(abs(lin)):.1f}% linearised; {np.mean(abs(r - lin) > 0.05):.0%} of "
        f"points differ by more than 5 points; seconds: fit {seconds['fit']:.0f}, refits "
        f"{seconds['refit']:.0f}, linearised {seconds['linearised']:.0f}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
