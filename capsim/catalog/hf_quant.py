"""The weight format a Hugging Face checkpoint states in its own files.

A checkpoint says how its weights are stored in one of four places, read in this order:

1. ``quantization_config`` in config.json (``compression_config`` in older
   compressed-tensors exports, which vLLM reads as the same): AWQ, GPTQ, FP8, MXFP4,
   compressed-tensors, ModelOpt, bitsandbytes, AutoRound;
2. ``hf_quant_config.json`` beside config.json, NVIDIA ModelOpt's file (``producer`` and a
   ``quantization`` block with ``quant_algo``: FP8, NVFP4, W4A16_AWQ, ..., or
   MIXED_PRECISION with a ``quantized_layers`` map naming each layer's algorithm); vLLM
   reads it the same way (its ModelOpt config lists ``hf_quant_config.json`` among its
   config file names);
3. an MLX ``quantization`` block (``bits``, ``group_size``, optionally ``mode``) that
   mlx-lm writes into config.json;
4. none of these: the torch dtype (bf16 or fp16).

A repository's name ending (``-AWQ-4bit``, ``-FP8``) is the fallback the resolver applies
when the files say nothing (capsim.catalog.resolve).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "bf16", "half": "fp16"}
"""The 16-bit format a checkpoint's torch dtype is served in. vLLM serves a float32
checkpoint in the platform's first supported dtype ("Downcast for float32 models":
_resolve_auto_dtype in vllm/config/model.py), bfloat16 on x86 and Arm CPUs and on GPUs
that support it; float16 and bfloat16 checkpoints keep their own."""

FFN_NAME = re.compile(r"mlp|ffn|expert", re.IGNORECASE)
"""Names of feed-forward weights in a checkpoint's per-layer quantisation lists."""

MODELOPT_ALGOS = {
    "FP8": "fp8",
    "FP8_PER_CHANNEL_PER_TOKEN": "fp8",
    "FP8_PB_WO": "fp8",
    "MXFP8": "fp8",
    "NVFP4": "nvfp4",
    "NVFP4_AWQ": "nvfp4",
    "NVFP4_SVD": "nvfp4",
    "W4A16_NVFP4": "nvfp4",
    "W4A8_NVFP4_FP8": "nvfp4",
    "W4A16_AWQ": "awq-int4",
    "W4A8_AWQ": "awq-int4",
    "W4A8_MXFP4_FP8": "mxfp4",
    "W8A16": "w8a16-int8",
    "W8A8_SQ_PER_CHANNEL": "int8",
}
"""ModelOpt ``quant_algo`` names and the catalog format with each one's weight storage: the
per-layer algorithms its exporter writes (nvidia-modelopt 0.47.0,
modelopt/torch/export/quant_utils.py) and FP8_PB_WO, which vLLM 0.33's ModelOpt config also
accepts (vllm/model_executor/layers/quantization/modelopt.py)."""

MLX_MODES = {"mxfp4": "mxfp4", "nvfp4": "nvfp4", "mxfp8": "fp8"}
"""MLX's floating-point quantisation modes and the catalog format of each; its default
mode, affine, is ``mlx-<bits>bit`` (hardware_db/quant_formats/mlx-*.yaml)."""


def quant_of_config(
    cfg: dict[str, Any],
    outer: dict[str, Any] | None = None,
    quant_file: dict[str, Any] | None = None,
) -> str:
    """The catalog weight format a checkpoint's files describe (see the module docstring):
    ``cfg`` is config.json's text part, ``outer`` the whole file, ``quant_file`` the parsed
    hf_quant_config.json if the checkpoint has one. An unknown method comes back as its own
    name, for the caller to report."""
    outer = outer or {}
    quant = _first_dict(cfg, outer, "quantization_config", "compression_config")
    method = str(quant.get("quant_method", "")).lower()
    if not method and isinstance(quant_file, dict):
        block = quant_file.get("quantization")
        if isinstance(block, dict):
            quant, method = block, "modelopt"
    if str(quant.get("quant_algo") or "").upper() == "MIXED_PRECISION" or (
        not method and quant.get("quant_algo")
    ):
        method = "modelopt"  # ModelOpt's block, whatever quant_method it sits under
    mlx = _first_dict(cfg, outer, "quantization")
    if not method and (mlx or quant).get("bits") is not None:
        return _mlx_format(mlx or quant)
    if method:
        return _method_format(method, quant)
    return torch_dtype_format(cfg, outer)


def torch_dtype_format(cfg: dict[str, Any], outer: dict[str, Any] | None = None) -> str:
    """The 16-bit format of an unquantised checkpoint's torch dtype (bf16 or fp16)."""
    outer = outer or {}
    raw = str(cfg.get("torch_dtype") or cfg.get("dtype") or outer.get("torch_dtype") or "bf16")
    # a dtype that is no torch dtype ('int3') comes back as itself, for the caller to report
    return DTYPE_NAMES.get(raw, raw)


def _first_dict(cfg: dict[str, Any], outer: dict[str, Any], *keys: str) -> dict[str, Any]:
    for source in (cfg, outer):
        for key in keys:
            value = source.get(key)
            if isinstance(value, dict) and value:
                return value
    return {}


def _method_format(method: str, quant: dict[str, Any]) -> str:
    given = quant.get("bits", quant.get("w_bit"))
    bits = 4 if given is None else _int(given, 0)
    if not 1 <= bits <= 16:  # 'x' or 0 was read as 4 bits
        raise ValueError(f"quantization_config bits is {given!r}, not a bit width of 1 to 16")
    if method in ("fp8", "fbgemm_fp8", "ptpc_fp8", "mxfp8"):
        return "fp8"
    if method == "mxfp4":
        return "mxfp4"
    if method == "awq":
        return "awq-int4"
    if method == "gptq":
        return "gptq-int4" if bits == 4 else "w8a16-int8"
    if method in ("auto-round", "intel/auto-round", "autoround"):
        return "w4a16"
    if method == "compressed-tensors":
        return _compressed_tensors_format(quant)
    if method in ("modelopt", "modelopt_fp4", "modelopt_mixed"):
        return _modelopt_format(quant)
    if method == "bitsandbytes":
        return "bnb-nf4" if quant.get("load_in_4bit", True) else "w8a16-int8"
    return method


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _modelopt_format(quant: dict[str, Any]) -> str:
    """A ModelOpt block's format. MIXED_PRECISION checkpoints name an algorithm per layer;
    the feed-forward weights' one decides (routed experts first, then the MLPs: they hold
    most of a transformer's weights), else the most common one."""
    algo = str(quant.get("quant_algo") or "").upper()
    if algo == "MIXED_PRECISION" and quant.get("moe_quant_algo"):
        algo = str(quant["moe_quant_algo"]).upper()  # the routed experts' own algorithm
    if algo == "MIXED_PRECISION":
        layers = quant.get("quantized_layers")
        layers = layers if isinstance(layers, dict) else {}
        per_layer = [
            (str(name).lower(), str(spec.get("quant_algo") or "").upper())
            for name, spec in layers.items()
            if isinstance(spec, dict) and spec.get("quant_algo")
        ]
        experts = [a for name, a in per_layer if "expert" in name]
        ffn = [a for name, a in per_layer if FFN_NAME.search(name)]
        common = Counter(experts or ffn or [a for _, a in per_layer]).most_common(1)
        if not common:
            return "modelopt-mixed_precision"
        algo = common[0][0]
    return MODELOPT_ALGOS.get(algo, f"modelopt-{algo.lower() or 'unknown'}")


def _mlx_format(block: dict[str, Any]) -> str:
    mode = str(block.get("mode") or "affine").lower()
    if mode in MLX_MODES:
        return MLX_MODES[mode]
    return f"mlx-{_int(block.get('bits'), 0)}bit"


def _compressed_tensors_format(quant: dict[str, Any]) -> str:
    """The weight format of a compressed-tensors (llm-compressor) quantization_config. In a
    mixed-precision one the group that targets the feed-forward weights decides."""
    top = str(quant.get("format", "")).lower()
    groups = quant.get("config_groups")
    groups = [g for g in groups.values() if isinstance(g, dict)] if isinstance(groups, dict) else []
    groups.sort(key=lambda g: not any(FFN_NAME.search(str(t)) for t in g.get("targets") or []))
    for group in groups:
        found = _compressed_group_format(group, top)
        if found:
            return found
    return {"nvfp4-pack-quantized": "nvfp4", "mxfp4-pack-quantized": "mxfp4"}.get(
        top, "compressed-tensors"
    )


def _compressed_group_format(group: dict[str, Any], top: str) -> str | None:
    kind_of_format = str(group.get("format") or top).lower()
    if "mxfp4" in kind_of_format:
        return "mxfp4"
    if "nvfp4" in kind_of_format:
        return "nvfp4"
    weights = group.get("weights") if isinstance(group.get("weights"), dict) else {}
    bits = _int(weights.get("num_bits"), 0)
    kind = str(weights.get("type", "int")).lower()
    if kind == "float" and bits == 8:
        return "fp8"
    if kind == "float" and bits == 4:  # OCP MX groups of 32, NVIDIA's of 16
        return "mxfp4" if _int(weights.get("group_size"), 16) == 32 else "nvfp4"
    if bits == 4:  # int: llm-compressor's W4A16 preset groups 128, Kimi K2.5's 32
        return "w4a16-g32" if _int(weights.get("group_size"), 128) == 32 else "w4a16"
    if bits == 8:
        return "int8" if group.get("input_activations") else "w8a16-int8"
    return None


def fp8_weight_block_of_config(
    cfg: dict[str, Any], outer: dict[str, Any] | None = None
) -> int | None:
    """The square weight block of a block-scaled FP8 checkpoint (quantization_config
    ``quant_method: fp8`` with ``weight_block_size: [b, b]``), None for any other."""
    quant = _first_dict(cfg, outer or {}, "quantization_config", "compression_config")
    if str(quant.get("quant_method", "")).lower() != "fp8":
        return None
    block = quant.get("weight_block_size")
    if (
        isinstance(block, list)
        and len(block) == 2
        and all(type(b) is int and b >= 1 for b in block)
        and block[0] == block[1]
    ):
        return block[0]
    return None
