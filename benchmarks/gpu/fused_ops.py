"""The elementwise kernels of a decoder layer, fused the way vLLM runs them.

vLLM compiles its models with torch.compile (Inductor), which fuses the residual add into
RMSNorm, SiLU into the multiply and, for FP8 checkpoints, the activation quantisation into
both. These helpers do the same with ``torch.compile(dynamic=True)`` (one compilation per
helper, whatever the token count), so the benchmarks' layers move what vLLM's do:

- ``add_rms_norm``: read the layer input and the residual, write the new residual and the
  normed input (4 x hidden elements a token; the normed one as FP8 when quantising);
- ``silu_mul``: read the gate and up halves, write their product (3 x FFN width);
- ``quantize``: the FP8 cast of an input no other kernel produced (attention's output).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn

# a benchmark grid meets many shapes and both formats: let each helper keep them all
for _name in ("cache_size_limit", "recompile_limit"):
    if hasattr(torch._dynamo.config, _name):
        setattr(torch._dynamo.config, _name, 256)


def _add_rms_norm(x, residual, weight, eps: float, fp8: bool):
    residual = x + residual
    r = residual.float()
    normed = (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
    return (normed.to(FP8) if fp8 else normed), residual


def _silu_mul(gate_up, fp8: bool):
    half = gate_up.shape[-1] // 2
    out = F.silu(gate_up[..., :half]) * gate_up[..., half:]
    return out.to(FP8) if fp8 else out


def _quantize(x):
    return x.to(FP8)


def add_fused_option(parser) -> None:
    """The benchmarks' ``--fused`` flag (an argparse parser)."""
    parser.add_argument(
        "--fused",
        action="store_true",
        help="vLLM's fused elementwise kernels (torch.compile) instead of eager ones",
    )


add_rms_norm = torch.compile(_add_rms_norm, dynamic=True)
silu_mul = torch.compile(_silu_mul, dynamic=True)
quantize = torch.compile(_quantize, dynamic=True)
