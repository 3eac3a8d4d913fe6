#!/usr/bin/env python3
"""Measure the GPU time of prefill on one GPU: GEMMs by row count, causal attention by
prompt length, and whole dense decoder layers over a prompt, per tensor-parallel shard.

Runs on a machine with an NVIDIA GPU and PyTorch (not part of the tests or CI); the
companion of ``decode_layers.py`` (same shapes, sharding and timing by CUDA-graph replay),
for the terms a first token waits on: large-M GEMMs (``prefill_compute_efficiency``) and
prefill attention (``attention_compute_efficiency``). Three kinds of row, written to a JSONL
file as they are measured so an interrupted run keeps what it had:

- ``gemm``: one ``rows x in`` by ``in x out`` GEMM of a model's shard (QKV, output, gate/up,
  down), bf16 or FP8 with per-tensor scales (``torch._scaled_mm``), for row counts from a
  decode batch to a long prompt: achieved TFLOPS and its share of the measured 8192^3 peak.
- ``attention``: causal self-attention over a whole prompt of ``tokens`` tokens with a
  shard's query and KV heads (torch ``scaled_dot_product_attention``, one backend a row:
  cuDNN, whose Hopper kernels are FlashAttention-3-class, and FlashAttention-2), counted as
  4 x heads x head_dim FLOPs per causal (query, key) pair, tokens x (tokens + 1) / 2 pairs.
- ``prefill_layers``: ``n`` decoder layers (RMSNorm, QKV GEMM, causal attention, output GEMM
  and residual, RMSNorm, gate/up GEMM, SiLU-and-multiply, down GEMM and residual) over one
  sequence's prompt of ``new_tokens`` tokens with nothing cached, plus the lm_head on its last
  token (vLLM computes logits only where a token is sampled). Rotary embedding, the KV-cache
  write and sampling are left out.

Units: times in microseconds (``*_us``), rates in TFLOPS (1e12 FLOP/s).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from decode_layers import ShardLayers, load_shape, peaks, shard, timed_graph
from fused_ops import add_fused_option

BF16 = 2  # bytes per element


def timed(fn, target_s: float = 0.25, repeats: int = 3) -> float:
    """Median microseconds of one run of ``fn``: CUDA-graph replays timed with CUDA events
    on a GPU (enough replays for about ``target_s`` a repeat), wall-clock runs on a CPU."""
    if not torch.cuda.is_available():
        fn()
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples)
    # one replay sizes the run, then enough replays for about target_s a repeat
    one = timed_graph(fn, replays=1, repeats=1)
    replays = max(2, min(50, int(target_s / max(one * 1e-6, 1e-6))))
    return timed_graph(fn, replays=replays, repeats=repeats)


def backend_context(name: str):
    """An SDPA backend selector for ``name`` (cudnn, flash, math)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]
    return sdpa_kernel([backend])


def causal_attention(q, k, v, backend: str):
    """Causal SDPA of (1, heads, tokens, hd) queries over (1, kv_heads, tokens, hd) keys and
    values; KV heads are repeated to the query heads first where the backend lacks GQA."""
    with backend_context(backend):
        if k.shape[1] != q.shape[1]:
            try:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            except RuntimeError:
                group = q.shape[1] // k.shape[1]
                k = k.repeat_interleave(group, dim=1)
                v = v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class PrefillLayers(ShardLayers):
    """``n`` decoder layers of one TP shard over a prompt of ``tokens`` tokens."""

    def __init__(
        self,
        shape: dict,
        tp: int,
        n: int,
        tokens: int,
        fmt: str,
        backend: str,
        device: str,
        fused: bool = False,
    ):
        super().__init__(shape, tp, n, fmt, fused, device)
        self.backend, self.tokens = backend, tokens
        self.lm_head = self.randn(self.vocab, self.d)
        self.x = torch.randn(tokens, self.d, device=device, dtype=torch.bfloat16)
        self.residual = torch.zeros_like(self.x)
        self.logits = torch.empty(1, self.vocab, device=device, dtype=torch.bfloat16)

    def attend(self, p: dict, qkv: torch.Tensor) -> torch.Tensor:
        """Causal attention of the prompt's queries over its keys, (tokens, q width)."""
        n, hd = self.tokens, self.hd
        q, k, v = qkv.split([self.h * hd, self.kvh * hd, self.kvh * hd], -1)
        att = causal_attention(
            q.view(n, self.h, hd).transpose(0, 1).unsqueeze(0),
            k.view(n, self.kvh, hd).transpose(0, 1).unsqueeze(0),
            v.view(n, self.kvh, hd).transpose(0, 1).unsqueeze(0),
            self.backend,
        )
        return att.squeeze(0).transpose(0, 1).reshape(n, self.h * hd)

    def step(self) -> None:
        if self.fused:
            h, residual = self.run_fused(self.x, self.residual)
            torch.mm(h[-1:] + residual[-1:], self.lm_head.t(), out=self.logits)
        else:
            x = self.run_eager(self.x)
            torch.mm(x[-1:], self.lm_head.t(), out=self.logits)


def layer_count(shape: dict, tp: int, tokens: int, budget_gb: float) -> int:
    """Layers to build: up to 4, as many as the weights and a layer's activations fit."""
    s = shard(shape, tp)
    d, hd = shape["hidden_size"], shape["head_dim"]
    weights = BF16 * ((s["heads"] + 2 * s["kv_heads"]) * hd * d + d * s["heads"] * hd)
    weights += BF16 * 3 * s["ffn"] * d
    activations = BF16 * tokens * (4 * d + 3 * s["ffn"] + 2 * s["heads"] * hd)
    return max(1, min(4, int((budget_gb * 1e9 - 3 * activations) // weights)))


def gemm_rows(shape: dict, tp: int, rows_list, formats, peak_tflops, device, write) -> None:
    """``gemm`` rows for each of a shard's four GEMMs."""
    s = shard(shape, tp)
    d, hd = shape["hidden_size"], shape["head_dim"]
    gemms = {
        "qkv": ((s["heads"] + 2 * s["kv_heads"]) * hd, d),
        "o": (d, s["heads"] * hd),
        "gate_up": (2 * s["ffn"], d),
        "down": (d, s["ffn"]),
    }
    one = torch.ones((), device=device, dtype=torch.float32)
    for fmt in formats:
        for name, (out_dim, in_dim) in gemms.items():
            weight = torch.randn(out_dim, in_dim, device=device, dtype=torch.bfloat16) * 0.02
            if fmt == "fp8":
                weight = weight.to(torch.float8_e4m3fn)
            for rows in rows_list:
                x = torch.randn(rows, in_dim, device=device, dtype=torch.bfloat16)
                if fmt == "fp8":
                    xq = x.to(torch.float8_e4m3fn)

                    def fn(xq=xq, weight=weight):
                        torch._scaled_mm(
                            xq, weight.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16
                        )
                else:

                    def fn(x=x, weight=weight):
                        F.linear(x, weight)

                us = timed(fn, target_s=0.04)
                tflops = 2 * rows * in_dim * out_dim / (us * 1e-6) / 1e12
                write(
                    {
                        "kind": "gemm",
                        "weights": fmt,
                        "gemm": name,
                        "rows": rows,
                        "in_dim": in_dim,
                        "out_dim": out_dim,
                        "us": us,
                        "tflops": tflops,
                        "share_of_bf16_peak": tflops / peak_tflops,
                        "weight_gb_s": out_dim
                        * in_dim
                        * (1 if fmt == "fp8" else BF16)
                        / (us * 1e-6)
                        / 1e9,
                    }
                )


def attention_rows(heads_list, lengths, backends, hd, device, write) -> None:
    """``attention`` rows: causal prefill attention per (heads, kv_heads), length, backend."""
    for heads, kv_heads in heads_list:
        for tokens in lengths:
            q = torch.randn(1, heads, tokens, hd, device=device, dtype=torch.bfloat16)
            k = torch.randn(1, kv_heads, tokens, hd, device=device, dtype=torch.bfloat16)
            v = torch.randn_like(k)
            for backend in backends:
                try:
                    us = timed(
                        lambda q=q, k=k, v=v, b=backend: causal_attention(q, k, v, b),
                        target_s=0.05,
                    )
                except RuntimeError as exc:
                    print(f"skip attention {backend} h{heads}/{kv_heads} {tokens}: {exc}")
                    continue
                flops = 4 * heads * hd * tokens * (tokens + 1) / 2
                write(
                    {
                        "kind": "attention",
                        "backend": backend,
                        "heads": heads,
                        "kv_heads": kv_heads,
                        "head_dim": hd,
                        "tokens": tokens,
                        "us": us,
                        "tflops": flops / (us * 1e-6) / 1e12,
                    }
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama-3.1-8b,qwen3-32b,llama-3.3-70b")
    ap.add_argument("--tp", default="1,2,4,8")
    ap.add_argument("--tokens", default="512,2048,8192,16384", help="prompt lengths")
    ap.add_argument("--formats", default="bf16,fp8")
    ap.add_argument("--backend", default="cudnn", help="SDPA backend of the layers")
    ap.add_argument("--gemm-rows", default="16,64,128,256,512,1024,2048,4096,8192,16384")
    ap.add_argument(
        "--gemm-shards",
        default="llama-3.1-8b:1,llama-3.3-70b:1,llama-3.3-70b:8",
        help="model:tp shards whose GEMMs to time",
    )
    ap.add_argument("--attention-lengths", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--attention-backends", default="cudnn,flash")
    ap.add_argument("--parts", default="gemm,attention,layers")
    ap.add_argument("--budget-gb", type=float, default=40.0)
    add_fused_option(ap)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    meta = {
        "kind": "meta",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        meta |= {
            "device": props.name,
            "sm_count": props.multi_processor_count,
            "memory_gib": props.total_memory / 2**30,
            **peaks(),
        }
    else:
        meta |= {"device": "cpu", "bf16_gemm_8192_tflops": 1.0}
    parts = set(args.parts.split(","))
    formats = args.formats.split(",")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:

        def write(row: dict) -> None:
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(json.dumps(row), flush=True)

        write(meta)
        peak = meta["bf16_gemm_8192_tflops"]
        if "gemm" in parts:
            rows_list = [int(r) for r in args.gemm_rows.split(",")]
            for spec in args.gemm_shards.split(","):
                name, tp = spec.rsplit(":", 1)
                gemm_rows(load_shape(name), int(tp), rows_list, formats, peak, device, write)
                torch.cuda.empty_cache() if device == "cuda" else None
        if "attention" in parts:
            lengths = [int(t) for t in args.attention_lengths.split(",")]
            heads = [(32, 8), (64, 8), (8, 1)]
            attention_rows(heads, lengths, args.attention_backends.split(","), 128, device, write)
        if "layers" not in parts:
            return
        for name in args.models.split(","):
            shape = load_shape(name)
            for tp in (int(t) for t in args.tp.split(",")):
                for fmt in formats:
                    for tokens in (int(t) for t in args.tokens.split(",")):
                        n = layer_count(shape, tp, tokens, args.budget_gb)
                        try:
                            layers = PrefillLayers(
                                shape, tp, n, tokens, fmt, args.backend, device, args.fused
                            )
                            us = timed(layers.step, target_s=0.1)
                            lm_us = timed(
                                lambda layers=layers: torch.mm(
                                    layers.x[-1:], layers.lm_head.t(), out=layers.logits
                                )
                            )
                        except RuntimeError as exc:  # e.g. a shape a kernel rejects
                            print(f"skip {name} tp{tp} {tokens} {fmt}: {exc}", flush=True)
                            layers = None
                            torch.cuda.empty_cache() if device == "cuda" else None
                            continue
                        write(
                            {
                                "kind": "prefill_layers",
                                "model": name,
                                "weights": fmt,
                                "attention_backend": args.backend,
                                "elementwise": "fused" if args.fused else "eager",
                                "tp_shard": tp,
                                "batch": 1,
                                "new_tokens": tokens,
                                "context": 0,
                                "layers_built": n,
                                "us_per_layer": (us - lm_us) / n,
                                "lm_head_us": lm_us,
                                "weight_bytes_per_layer": layers.weight_bytes_per_layer,
                            }
                        )
                        del layers
                        torch.cuda.empty_cache() if device == "cuda" else None


if __name__ == "__main__":
    main()
