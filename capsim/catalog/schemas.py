"""The catalog's schema base: ``Strict`` (unknown YAML fields are errors) and ``Source``
(where a figure came from), shared by the catalog's schemas: GPUs (gpu_schema.py), models
and weight formats (model_schema.py), serving engines and efficiency priors
(engine_schema.py).

Units are part of every field name or description. Every entry carries ``sources``: where
its figures came from. A figure that no source gives is ``None`` (null in YAML), never a
guess.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, model_validator

DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "fp4")
"""Tensor-core data types the catalog knows throughput figures for."""


CATALOG_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$"
"""What a catalog entry's name may be: a command line names it (``--gpu``, ``--model``,
comma-separated lists, ``engine@version``) and a file is named after it, so no separator,
comma, '@', space or path part ('' and '../../x' were taken from a --db overlay)."""


def catalog_key(description: str = "Catalog key"):
    """A pydantic Field for an entry's name (CATALOG_KEY_PATTERN)."""
    return Field(pattern=CATALOG_KEY_PATTERN, description=description)


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters (not newline or tab) no catalog text holds."""


class Strict(BaseModel):
    """Base: unknown fields are errors, so a typo in a YAML file is caught; NaN and
    infinity (YAML's .nan and .inf) are no figure any catalog field holds (an overlay's
    weight_bits .inf ended in a traceback sizing the KV cache)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_control_characters(cls, data):
        """A text field with a control character (an escape sequence in a display name
        set the terminal's title and cleared its screen when `gpus show` printed it) is
        refused; newlines and tabs are text."""
        if isinstance(data, dict):
            for key, value in data.items():
                if isinstance(value, str) and CONTROL.search(value):
                    raise ValueError(f"{key} holds a control character ({value[:40]!r})")
        return data


class Source(Strict):
    """Where a figure came from."""

    title: str = Field(description="Document name, e.g. 'NVIDIA Ampere GA102 GPU Architecture'")
    url: str | None = Field(default=None, description="Where to read it")
    quote: str | None = Field(default=None, description="The exact text a figure was taken from")
    note: str | None = Field(default=None, description="How the figure was read or derived")
