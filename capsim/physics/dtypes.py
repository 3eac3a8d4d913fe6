"""Bytes per element of the tensors a step moves: activations, and the KV cache for each
``--kv-cache-dtype`` vLLM accepts."""

from __future__ import annotations

from capsim.arguments import require
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


def check_kv_dtype(kv_dtype: str, flag: str = "") -> str:
    """``kv_dtype`` as KV_DTYPE_BYTES' key (lower case); a value vLLM does not accept is a
    user error listing those it does (``flag``, e.g. '--kv-dtype', opens the message)."""
    if not isinstance(kv_dtype, str):  # the Python API's
        require(kv_dtype, str, flag or "kv_dtype", "a KV cache dtype name (a string)")
    key = kv_dtype.lower()
    if key not in KV_DTYPE_BYTES:
        raise CapsimUserError(
            f"{flag + ': ' if flag else ''}unknown KV cache dtype '{kv_dtype}'",
            hint="use one of: " + ", ".join(KV_DTYPE_BYTES),
        )
    return key


def kv_dtype_bytes(kv_dtype: str, model: Model) -> float:
    """Bytes per KV-cache element for a ``--kv-cache-dtype`` value."""
    value = KV_DTYPE_BYTES[check_kv_dtype(kv_dtype)]
    return float(value) if value is not None else float(ACTIVATION_BYTES)
