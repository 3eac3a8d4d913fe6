"""Benchmark: the live tests' calibration loop replayed on stored probe runs.

    .venv/bin/python benchmarks/bench_live_loop.py [--noise-z Z] [RUN.json ...]

Each run (vLLM's CPU build, a tiny model, C=1, 2, 4, 8, 16, 512 in / 128 out, three
interleaved runs of 32 requests) is fitted on C=1, 2 and 4 as tests/live/test_live_vllm.py
does (capsim chooses the parameters) and predicts C=8 and 16; prints each held-out error
(output tok/s, TPOT, TTFT p50 against the runs' mean), the fitted parameters, and the worst
error per run. Without arguments: the loops stored in calibration/runs/loops-2026-11-27 and
the c16 runs of 2026-11-26. ``--noise-z`` overrides selection.NOISE_Z (0: the test off).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import capsim.calibration.selection as selection
from capsim.calibration.compare import compare_dataset
from capsim.calibration.fit import fit_profile, fitted_params
from capsim.calibration.published import dataset_from_run
from capsim.catalog.loader import load_catalog

RUNS = Path(__file__).parent.parent / "calibration" / "runs"
FIGURES = {
    ("output_tok_s", "mean"): "tok/s",
    ("tpot_s", "mean"): "TPOT",
    ("ttft_s", "median"): "TTFT",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="*", type=Path)
    parser.add_argument("--noise-z", type=float, default=None)
    args = parser.parse_args()
    if args.noise_z is not None:
        selection.NOISE_Z = args.noise_z
    runs = args.runs or sorted((RUNS / "loops-2026-11-27").glob("*.json")) + sorted(
        RUNS.glob("cpu-vllm-*-c16-*.json")
    )
    catalog = load_catalog()
    worst = []
    for path in runs:
        measured = dataset_from_run(path)
        profile = fit_profile([measured.at_levels({1, 2, 4})], catalog, path.stem)
        held_out = measured.at_levels({8, 16})
        train = measured.at_levels({1, 2, 4})
        predicted = compare_dataset(held_out, catalog, fitted_params(profile, [train], catalog))
        groups: dict[tuple, list] = {}
        for p in predicted:
            if (p.metric, p.statistic) in FIGURES:
                groups.setdefault((FIGURES[p.metric, p.statistic], p.concurrency), []).append(p)
        errors = {
            key: 100 * (pts[0].predicted / np.mean([p.measured for p in pts]) - 1)
            for key, pts in sorted(groups.items())
        }
        worst.append(max(abs(e) for e in errors.values()))
        fitted = {k: float(f"{v.value:.3g}") for k, v in profile.parameters.items()}
        figures = " ".join(f"{name} C={c} {e:+.1f}%" for (name, c), e in errors.items())
        print(f"{path.stem}: {figures} | fitted {fitted}", flush=True)
    print(f"worst error per run: median {np.median(worst):.1f}%, max {max(worst):.1f}%")


if __name__ == "__main__":
    main()
