#!/usr/bin/env python3
"""Measure the GPU time of dense decoder layers in a decode step, per tensor-parallel shard.

Runs on a machine with an NVIDIA GPU and PyTorch (not part of the tests or CI). For each
catalog model shape, tensor-parallel shard (heads, KV heads and FFN width divided by TP the
way vLLM shards them, KV heads replicated below one per GPU), batch size and context length,
it builds ``n`` decoder layers with random bf16 weights and a KV cache, captures one decode
step (one new token per sequence) in a CUDA graph, and times graph replays with CUDA events.
There is no all-reduce: one GPU measures what each rank computes between all-reduces.

What each layer runs, in order: RMSNorm, fused QKV GEMM, KV-cache write at the new position,
attention over the cache (flash-decoding layout: each KV head's query group as a short query
block), output GEMM and residual add, RMSNorm, fused gate/up GEMM, SiLU-and-multiply, down
GEMM and residual add. Rotary embedding and sampling are left out. It also times the lm_head
(vocab-parallel) GEMM, a device-to-device copy and a large bf16 GEMM for the peaks.

Rows are written to a JSONL file as they are measured (one per configuration) so an
interrupted run keeps what it had.

Units: times in microseconds (``*_us``), bytes in bytes, bandwidth in GB/s (1e9 B/s).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from fused_ops import add_fused_option

ROOT = Path(__file__).resolve().parents[2]
BF16 = 2  # bytes per element


def load_shape(name: str) -> dict:
    """Dimensions of a dense catalog model (hardware_db/models/NAME.yaml)."""
    doc = yaml.safe_load((ROOT / "hardware_db" / "models" / f"{name}.yaml").read_text())
    keys = (
        "num_layers",
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_kv_heads",
        "head_dim",
        "vocab_size",
    )
    return {k: doc[k] for k in keys}


def shard(shape: dict, tp: int) -> dict:
    """Per-GPU sizes under tensor parallelism (vLLM's column/row-parallel split)."""
    return {
        "heads": shape["num_attention_heads"] // tp,
        "kv_heads": max(1, shape["num_kv_heads"] // tp),
        "ffn": shape["intermediate_size"] // tp,
        "vocab": math.ceil(shape["vocab_size"] / tp),
    }


def timed_graph(fn, replays: int = 20, repeats: int = 5) -> float:
    """Median microseconds of one replay of ``fn`` captured in a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / replays)
    del graph
    return statistics.median(samples)


class ShardLayers:
    """``n`` decoder layers' weights of one TP shard (random bf16, or FP8 with per-tensor
    scales) and their GEMMs; ``fused`` picks vLLM's fused elementwise kernels."""

    def __init__(
        self,
        shape: dict,
        tp: int,
        n: int,
        fmt: str = "bf16",
        fused: bool = False,
        device: str | None = None,
    ):
        s = shard(shape, tp)
        self.fmt, self.fused = fmt, fused
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        d, hd = shape["hidden_size"], shape["head_dim"]
        self.d, self.vocab = d, s["vocab"]
        self.h, self.kvh, self.hd, self.ffn = s["heads"], s["kv_heads"], hd, s["ffn"]
        qkv_out = (self.h + 2 * self.kvh) * hd

        def lin(*size):
            weight = self.randn(*size)
            return weight.to(torch.float8_e4m3fn) if fmt == "fp8" else weight

        self.layers = [
            {
                "norm1": self.ones(d),
                "qkv": lin(qkv_out, d),
                "o": lin(d, self.h * hd),
                "norm2": self.ones(d),
                "gate_up": lin(2 * self.ffn, d),
                "down": lin(d, self.ffn),
            }
            for _ in range(n)
        ]
        self.one = torch.ones((), device=self.device, dtype=torch.float32)
        weight_elem = 1 if fmt == "fp8" else BF16
        self.weight_bytes_per_layer = weight_elem * (
            qkv_out * d + d * self.h * hd + 3 * self.ffn * d
        )

    def randn(self, *size) -> torch.Tensor:
        return torch.randn(*size, device=self.device, dtype=torch.bfloat16) * 0.02

    def ones(self, *size) -> torch.Tensor:
        return torch.ones(*size, device=self.device, dtype=torch.bfloat16)

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x @ weight.T in bf16, or as an FP8 GEMM with per-tensor scales (activation
        quantised to FP8 first by its own kernel, as vLLM's unfused FP8 linear does)."""
        return self.gemm(x.to(torch.float8_e4m3fn) if self.fmt == "fp8" else x, weight)

    def gemm(self, xq: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """xq @ weight.T for an input already in the weights' format (FP8: quantised by the
        fused kernel that produced it)."""
        if self.fmt != "fp8":
            return F.linear(xq, weight)
        return torch._scaled_mm(
            xq, weight.t(), scale_a=self.one, scale_b=self.one, out_dtype=torch.bfloat16
        )

    def attend(self, p: dict, qkv: torch.Tensor) -> torch.Tensor:
        """Attention of layer ``p`` given its fused QKV projection, (tokens, q width)."""
        raise NotImplementedError

    def run_eager(self, x: torch.Tensor) -> torch.Tensor:
        """Every layer with PyTorch's separate elementwise kernels (RMSNorm, residual add,
        SiLU, multiply, FP8 casts); the last layer's output."""
        for p in self.layers:
            hn = F.rms_norm(x, (x.shape[-1],), p["norm1"], 1e-6)
            x = x + self.linear(self.attend(p, self.linear(hn, p["qkv"])), p["o"])
            hn = F.rms_norm(x, (x.shape[-1],), p["norm2"], 1e-6)
            gu = self.linear(hn, p["gate_up"])
            x = x + self.linear(F.silu(gu[:, : self.ffn]) * gu[:, self.ffn :], p["down"])
        return x

    def run_fused(
        self, h: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer with vLLM's fused elementwise kernels (fused_ops); the last layer's
        output and the residual stream, whose sum is the hidden state."""
        from fused_ops import add_rms_norm, quantize, silu_mul

        fp8 = self.fmt == "fp8"
        for p in self.layers:
            hn, residual = add_rms_norm(h, residual, p["norm1"], 1e-6, fp8)
            att = self.attend(p, self.gemm(hn, p["qkv"]))
            h = self.gemm(quantize(att) if fp8 else att, p["o"])
            hn, residual = add_rms_norm(h, residual, p["norm2"], 1e-6, fp8)
            h = self.gemm(silu_mul(self.gemm(hn, p["gate_up"]), fp8), p["down"])
        return h, residual


class Layers(ShardLayers):
    """``n`` decoder layers of one TP shard with a KV cache for ``batch`` x ``context``."""

    def __init__(
        self,
        shape: dict,
        tp: int,
        n: int,
        batch: int,
        context: int,
        fmt: str = "bf16",
        fused: bool = False,
    ):
        super().__init__(shape, tp, n, fmt, fused)
        self.batch, self.context = batch, context
        for p in self.layers:
            p["k_cache"] = self.randn(batch, self.kvh, context + 1, self.hd)
            p["v_cache"] = self.randn(batch, self.kvh, context + 1, self.hd)
        self.x = torch.randn(batch, self.d, device=self.device, dtype=torch.bfloat16)
        self.out = torch.empty_like(self.x)
        self.residual = torch.zeros_like(self.x)
        self.kv_bytes_per_layer = BF16 * 2 * batch * self.kvh * (context + 1) * self.hd

    def attend(self, p: dict, qkv: torch.Tensor) -> torch.Tensor:
        """Write the new token's K and V into layer ``p``'s cache and attend over it (each
        KV head's query group as a short query block), (batch, q width)."""
        b, g = self.batch, self.h // self.kvh
        q, k, v = qkv.split([self.h * self.hd, self.kvh * self.hd, self.kvh * self.hd], -1)
        p["k_cache"][:, :, self.context] = k.view(b, self.kvh, self.hd)
        p["v_cache"][:, :, self.context] = v.view(b, self.kvh, self.hd)
        att = F.scaled_dot_product_attention(
            q.view(b, self.kvh, g, self.hd), p["k_cache"], p["v_cache"]
        )
        return att.reshape(b, self.h * self.hd)

    def step(self) -> None:
        if self.fused:
            h, residual = self.run_fused(self.x, self.residual)
            torch.add(h, residual, out=self.out)
        else:
            self.out.copy_(self.run_eager(self.x))


def layer_count(shape: dict, tp: int, batch: int, context: int, budget_gb: float) -> int:
    """Layers to build: up to 8, as many as fit the memory budget, at least 4 (so the
    weights far exceed L2 and replays cannot be served from cache)."""
    s = shard(shape, tp)
    d, hd = shape["hidden_size"], shape["head_dim"]
    weights = BF16 * ((s["heads"] + 2 * s["kv_heads"]) * hd * d + d * s["heads"] * hd)
    weights += BF16 * 3 * s["ffn"] * d
    kv = BF16 * 2 * batch * s["kv_heads"] * (context + 1) * hd
    return min(8, int(budget_gb * 1e9 // (weights + kv)))


def peaks() -> dict:
    """Device-to-device copy bandwidth and an 8192^3 bf16 GEMM rate."""
    a = torch.empty(int(2e9), dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    copy_us = timed_graph(lambda a=a, b=b: b.copy_(a), replays=10)
    a = b = None
    m = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    n = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(m)
    gemm_us = timed_graph(lambda: torch.mm(m, n, out=out), replays=10)
    return {
        "copy_gb_s_read_plus_write": 2 * 2e9 / (copy_us * 1e-6) / 1e9,
        "bf16_gemm_8192_tflops": 2 * 8192**3 / (gemm_us * 1e-6) / 1e12,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama-3.1-8b,qwen3-32b,llama-3.3-70b")
    ap.add_argument("--tp", default="1,2,4,8")
    ap.add_argument("--batches", default="1,8,32,64,128,256,512")
    ap.add_argument("--contexts", default="16,2048")
    ap.add_argument("--formats", default="bf16", help="bf16 and/or fp8 weights")
    ap.add_argument("--budget-gb", type=float, default=55.0)
    add_fused_option(ap)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    meta = {
        "kind": "meta",
        "device": props.name,
        "sm_count": props.multi_processor_count,
        "memory_gib": props.total_memory / 2**30,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **peaks(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        f.write(json.dumps(meta) + "\n")
        f.flush()
        print(json.dumps(meta), flush=True)
        for name in args.models.split(","):
            shape = load_shape(name)
            for tp in (int(t) for t in args.tp.split(",")):
                s = shard(shape, tp)
                lm_w = torch.randn(
                    s["vocab"], shape["hidden_size"], device="cuda", dtype=torch.bfloat16
                )
                for batch in (int(b) for b in args.batches.split(",")):
                    xb = torch.randn(
                        batch, shape["hidden_size"], device="cuda", dtype=torch.bfloat16
                    )
                    lm_out = torch.empty(batch, s["vocab"], device="cuda", dtype=torch.bfloat16)
                    lm_us = timed_graph(lambda xb=xb, w=lm_w, o=lm_out: torch.mm(xb, w.t(), out=o))
                    for fmt in args.formats.split(","):
                        for context in (int(c) for c in args.contexts.split(",")):
                            n = layer_count(shape, tp, batch, context, args.budget_gb)
                            if n < 4:
                                continue
                            try:
                                layers = Layers(shape, tp, n, batch, context, fmt, args.fused)
                                us = timed_graph(layers.step)
                            except RuntimeError as exc:  # e.g. a shape a kernel rejects
                                print(f"skip {name} tp{tp} b{batch} {fmt}: {exc}", flush=True)
                                layers = None
                                torch.cuda.empty_cache()
                                continue
                            row = {
                                "kind": "decode_layers",
                                "model": name,
                                "weights": fmt,
                                "elementwise": "fused" if args.fused else "eager",
                                "tp_shard": tp,
                                "batch": batch,
                                "context": context,
                                "layers_built": n,
                                "us_per_layer": us / n,
                                "lm_head_us": lm_us,
                                "weight_bytes_per_layer": layers.weight_bytes_per_layer,
                                "kv_bytes_per_layer": layers.kv_bytes_per_layer,
                                "achieved_gb_s": (
                                    layers.weight_bytes_per_layer + layers.kv_bytes_per_layer
                                )
                                / (us / n * 1e-6)
                                / 1e9,
                            }
                            f.write(json.dumps(row) + "\n")
                            f.flush()
                            print(json.dumps(row), flush=True)
                            del layers
                            torch.cuda.empty_cache()
                lm_w = None
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
