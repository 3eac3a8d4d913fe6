"""Measure this host's memory bandwidth and matrix throughput (for the cpu-host entry).

Run:  .venv/bin/python benchmarks/bench_host.py

Bandwidth: the best of several numpy copies of a 512 MiB array (read + write bytes / time).
Compute: the best of several float32 matrix products of 2048 x 2048 (2 n^3 FLOPs / time),
numpy's BLAS on all cores. These are what a CPU serving engine can reach at best; vLLM's
CPU build computes in bf16 with its own kernels.
"""

from __future__ import annotations

import time

import numpy as np


def bandwidth_gb_s(size_mib: int = 512, repeats: int = 5) -> float:
    src = np.ones(size_mib * 2**20 // 8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best / 1e9


def matmul_tflops(n: int = 2048, repeats: int = 5) -> float:
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e12


if __name__ == "__main__":
    print(f"memory bandwidth: {bandwidth_gb_s():.1f} GB/s (copy, read + write)")
    print(f"float32 matmul:   {matmul_tflops():.3f} TFLOPS")
