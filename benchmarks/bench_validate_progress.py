"""Benchmark: how many scenario simulations each part of ``validate --calibrated`` runs,
against the estimate its progress bar starts from (part_fits.expected_simulations).

Run:  .venv/bin/python benchmarks/bench_validate_progress.py [DATASET_NAME ...]
(default: five datasets of different shapes; every part runs in this process, in series)

Prints, per dataset part: scenarios, levels, points, simulations counted, the estimate,
and the seconds the part took. The SIMULATIONS_PER_* constants were set from this output.
"""

from __future__ import annotations

import sys
import time

from capsim.calibration.compare import listen_to_simulations
from capsim.calibration.part_fits import (
    calibration_parts,
    expected_simulations,
    part_errors,
    points_of,
)
from capsim.calibration.published import load_published
from capsim.catalog.loader import load_catalog

DEFAULT = [
    "corpus-client-rtx4090-vllm-mistral7b",
    "corpus-ttis-a100-qwen3-1.7b-vllm-c1-isl-sweep",
    "corpus-client-m3ultra-llamacpp-bench",
    "corpus-nim-h100-llama33-70b-fp8-tp2-5000in-500out",
    "corpus-inferencex-h100-gptoss120b-vllm-1k1k",
]


def main(names: list[str]) -> None:
    cat = load_catalog()
    datasets = [d for d in load_published() if d.name in set(names)]
    for part in calibration_parts(datasets, cat):
        counted = [0]
        listen_to_simulations(lambda seconds, n=counted: n.__setitem__(0, n[0] + 1))
        started = time.perf_counter()
        part_errors(part, cat)
        levels = len({p.concurrency for sc in part.scenarios for p in sc.points})
        print(
            f"{part.name}: {len(part.scenarios)} scenarios, {levels} levels, "
            f"{points_of(part)} points: {counted[0]} simulations (estimate "
            f"{expected_simulations(part, None, 'linearised')}), "
            f"{time.perf_counter() - started:.1f} s"
        )
    listen_to_simulations(None)


if __name__ == "__main__":
    main(sys.argv[1:] or DEFAULT)
