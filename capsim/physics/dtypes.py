"""Bytes per element of the tensors a step moves: activations, and the KV cache for each
``--kv-cache-dtype`` vLLM accepts."""

from __future__ import annotations

from capsim.catalog.model_schema import Model
from capsim.errors import CapsimUserError

ACTIVATION_BYTES = 2
"""Bytes per activation element (bf16/fp16 activations)."""


KV_DTYPE_BYTES: dict[str, float | None] = {
    "auto": None,  # the model's activation dtype (16-bit)
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
"""Bytes per KV element for each ``--kv-cache-dtype`` vLLM accepts."""


def kv_dtype_bytes(kv_dtype: str, model: Model) -> float:
    """Bytes per KV-cache element for a ``--kv-cache-dtype`` value."""
    key = kv_dtype.lower()
    if key not in KV_DTYPE_BYTES:
        raise CapsimUserError(
            f"unknown KV cache dtype '{kv_dtype}'",
            hint="use one of: " + ", ".join(KV_DTYPE_BYTES),
        )
    value = KV_DTYPE_BYTES[key]
    return float(value) if value is not None else float(ACTIVATION_BYTES)
