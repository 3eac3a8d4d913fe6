"""Start-up time of the command: median wall time of `capsim --help`, `capsim gpus` and
`capsim models` over several runs (each a fresh process).

    python benchmarks/bench_startup.py [runs]
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main(runs: int = 8) -> None:
    exe = shutil.which("capsim") or str(Path(sys.executable).parent / "capsim")
    for args in (["--help"], ["gpus"], ["models"]):
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            subprocess.run([exe, *args], capture_output=True, check=True)
            times.append(time.perf_counter() - started)
        print(
            f"capsim {' '.join(args):8s} median {statistics.median(times):.3f} s, "
            f"best {min(times):.3f} s"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
