"""Length (and think-time) distributions for workloads, parsed from short strings.

* ``512``: fixed
* ``uniform:256,1024``: integers uniform in [256, 1024]
* ``normal:512,128``: normal with mean 512 and standard deviation 128
* ``lognormal:512,0.6``: lognormal with median 512 and shape sigma 0.6
* ``file:lengths.txt``: resampled from an empirical list (one number per line, or a JSON
  list)

Token lengths are rounded and clipped to at least 1; times are clipped at 0. Normal and
lognormal draws are truncated at their 99.9th percentile.

Draws are stratified (Latin hypercube in one dimension): n draws take one uniform number
from each of n equal slices of [0, 1), in random order, through the distribution's
quantile function. Each draw is still distributed as stated, but a level's lengths
follow the distribution closely even when it has few requests, so a prediction (the
expected value of a measurement) carries less sampling noise of its own.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capsim.engine.limits import MAX_CONTEXT_TOKENS
from capsim.errors import CapsimUserError, plain_float
from capsim.files import loads_json, read_input_text

MAX_LENGTHS_FILE_BYTES = 8 * 2**20
"""Largest lengths file read (``file:PATH``): about a million numbers, far more than an
empirical distribution needs to be resampled, in about 300 MB of memory (a 45 MB file of
nine million took 1.85 GB; issue 47: under 1 GB for any file accepted)."""

KINDS = ("fixed", "uniform", "normal", "lognormal", "file")
Z_999 = 3.090232306167813
"""Standard normal quantile of 0.999: where normal and lognormal draws are truncated."""


MAX_KEPT_VALUES = 65_536
"""Most values of a lengths file kept to draw from: a larger file is kept as this many of
its order statistics, evenly spaced in rank (each the middle of its stratum), which the
stratified draws cannot tell apart (they resolve one part in the number of requests) and
which every worker process receives cheaply. A file of four million values was copied
whole to each configuration a plan simulated and re-sorted at every draw: 300 s where
the distribution's quantiles take well under a second."""


def kept_values(values: list[float]) -> tuple[float, ...]:
    """``values`` sorted, or MAX_KEPT_VALUES of their order statistics where there are
    more."""
    ordered = np.sort(np.asarray(values, dtype=float))
    if ordered.size > MAX_KEPT_VALUES:
        ranks = ((np.arange(MAX_KEPT_VALUES) + 0.5) * ordered.size / MAX_KEPT_VALUES).astype(int)
        ordered = ordered[ranks]
    return tuple(ordered.tolist())


@dataclass(frozen=True)
class LengthSpec:
    kind: str
    a: float = 0.0
    b: float = 0.0
    values: tuple[float, ...] = ()
    text: str = ""

    @property
    def mean(self) -> float:
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        if self.kind == "normal":
            return self.a
        if self.kind == "lognormal":
            return self.a * float(np.exp(self.b**2 / 2))
        return float(np.mean(self._ordered))

    @property
    def maximum(self) -> float:
        """The largest value a draw can take: normal and lognormal draws are truncated at
        their 99.9th percentile (z = 3.09), so validation against max_model_len and the KV
        cache checks exactly what can be sampled."""
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return self.b
        if self.kind == "normal":
            return self.a + Z_999 * self.b
        if self.kind == "lognormal":
            return self.a * float(np.exp(Z_999 * self.b))
        return float(self._ordered[-1])

    def quantile(self, u: np.ndarray) -> np.ndarray:
        """The value below which a share ``u`` (0 to 1) of draws falls, truncated at
        ``maximum``."""
        u = np.asarray(u, dtype=float)
        if self.kind == "fixed":
            return np.full(u.shape, self.a)
        if self.kind == "uniform":
            return self.a + (self.b - self.a) * u
        if self.kind in ("normal", "lognormal"):
            from scipy.special import ndtri  # the normal quantile; scipy loads only here
        if self.kind == "normal":
            return np.minimum(self.a + self.b * ndtri(u), self.maximum)
        if self.kind == "lognormal":
            return np.minimum(self.a * np.exp(self.b * ndtri(u)), self.maximum)
        ordered = self._ordered
        return ordered[np.minimum((u * ordered.size).astype(int), ordered.size - 1)]

    @functools.cached_property
    def _ordered(self) -> np.ndarray:
        """A file's values, sorted, as an array (made once, not at every draw)."""
        return np.sort(np.asarray(self.values, dtype=float))

    def sample(self, rng: np.random.Generator, n: int | tuple[int, ...]) -> np.ndarray:
        """``n`` stratified draws (a count or an array shape) as floats (not rounded),
        truncated at ``maximum``."""
        size = int(np.prod(n))
        u = (rng.permutation(size) + rng.random(size)) / size
        return self.quantile(u).reshape(n)

    def tokens(self, rng: np.random.Generator, n: int | tuple[int, ...]) -> np.ndarray:
        """``n`` token counts (integers >= 1)."""
        return np.maximum(np.rint(self.sample(rng, n)), 1).astype(int)

    def seconds(self, rng: np.random.Generator, n: int | tuple[int, ...]) -> np.ndarray:
        """``n`` durations (>= 0)."""
        return np.maximum(self.sample(rng, n), 0.0)


def number_text(value: int | float) -> str:
    """A length given as a number, as its text: 1000.0 as '1000' (the digits a token count
    is written in), 2.5 as '2.5'."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def parse_length(
    text: str | int | float, what: str = "length", minimum: float = 0.0, whole: bool = True
) -> LengthSpec:
    """Parse a distribution string (see the module docstring); a fixed value, a uniform
    range's low end and a normal or lognormal centre must be at least ``minimum``. With
    ``whole`` (token counts; not a think time) a fixed value and a file's values must be
    whole numbers ('--output-tokens 1.5' ran as 2), and so must a uniform range's ends; a
    normal or lognormal distribution's draws are rounded."""
    spelled = isinstance(text, str)
    if isinstance(text, int | float):
        text = number_text(text)
    raw = text.strip()
    hint = "use N, uniform:A,B, normal:MEAN,SD, lognormal:MEDIAN,SIGMA or file:PATH"
    try:
        if ":" not in raw:
            value = plain_float(raw)
            if not math.isfinite(value) or value < minimum:
                raise ValueError(f"must be a number >= {minimum:g}")
            if whole and not value.is_integer():
                raise ValueError("a number of tokens is a whole number")
            if whole and spelled and not (raw.isascii() and raw.isdigit()):
                # '1e3' or '1000.0' for a count, as vLLM's --random-input-len refuses them
                raise ValueError(f"write a token count in digits: {int(value)}")
            return within_range(LengthSpec("fixed", value, text=raw), whole)
        kind, _, rest = raw.partition(":")
        kind = kind.lower()
        if kind == "file":
            path = Path(rest)
            try:
                stat = path.stat()
                version = (stat.st_mtime_ns, stat.st_size)
            except OSError:
                version = None  # the reader says what is wrong with it
            values = _file_values(str(path), version, what, minimum, whole)
            return within_range(LengthSpec("file", values=values, text=raw), whole)
        if kind not in KINDS or kind == "fixed":
            raise ValueError(f"unknown distribution '{kind}'")
        a_text, comma, b_text = rest.partition(",")
        if not comma:
            raise ValueError(f"{kind} needs two numbers, {kind}:A,B")
        a, b = plain_float(a_text), plain_float(b_text)
        if not (math.isfinite(a) and math.isfinite(b)):
            raise ValueError("needs finite numbers")
        if kind == "uniform" and not minimum <= a <= b:
            raise ValueError(f"uniform needs {minimum:g} <= A <= B")
        if kind == "uniform" and whole and not (a.is_integer() and b.is_integer()):
            # 'uniform:1.5,2.5' drew 2 tokens each time (draws are whole numbers in [A, B])
            raise ValueError("a uniform range of tokens has whole-number ends")
        if kind in ("normal", "lognormal") and (a <= 0 or a < minimum or b < 0):
            raise ValueError(
                f"needs a centre of at least {max(minimum, 0):g} and a non-negative spread"
            )
        return within_range(LengthSpec(kind, a, b, text=raw), whole)
    except FileNotFoundError:
        raise CapsimUserError(f"{what} file '{raw[5:]}' does not exist", hint=hint) from None
    except ValueError as exc:
        raise CapsimUserError(f"cannot read {what} '{raw}' ({exc})", hint=hint) from None


def length_field(value, what: str):
    """``value`` (a schema's token-length field) if parse_length reads it as a length of
    at least one token, else a ValueError saying why (for a pydantic field validator:
    datasets, run files and probe configs refuse what predict would)."""
    if value is None:
        return value
    try:
        parse_length(value if isinstance(value, int | float) else str(value), what, minimum=1.0)
    except CapsimUserError as exc:
        raise ValueError(exc.message) from None
    return value


def within_range(spec: LengthSpec, whole: bool = True) -> LengthSpec:
    """``spec`` if its largest draw is at most MAX_CONTEXT_TOKENS tokens, else a ValueError
    (``whole``: token counts; a think time's ceiling is the workload's own, in seconds):
    'normal:1e300,1' became a request of max_tokens -2**63 in the probe, and a 300-digit
    token count in predict's messages."""
    largest = spec.maximum
    if whole and (not math.isfinite(largest) or largest > MAX_CONTEXT_TOKENS):
        shown = f"{largest:,.0f}" if math.isfinite(largest) and largest < 1e30 else "past 1e30"
        raise ValueError(
            f"draws reach {shown}; at most {MAX_CONTEXT_TOKENS:,} tokens, the longest context "
            "a model takes"
        )
    return spec


@functools.lru_cache(maxsize=16)
def _file_values(
    path: str, version: tuple | None, what: str, minimum: float, whole: bool
) -> tuple[float, ...]:
    """The values a lengths file holds (kept_values), read once per version of the file
    (``version``: its modification time and size): a plan checks its lengths in every
    configuration it builds, and re-reading a large file each time took minutes."""
    content = read_input_text(Path(path), f"{what} file", MAX_LENGTHS_FILE_BYTES)
    try:
        numbers = parsed = loads_json(content)
    except json.JSONDecodeError:
        numbers, parsed = content.split(), None
    if not isinstance(numbers, list):
        numbers = [numbers]
    try:
        if any(isinstance(v, bool) for v in numbers):  # JSON true is not the number 1
            raise TypeError
        if isinstance(parsed, list) and any(isinstance(v, str) for v in numbers):
            raise TypeError  # a JSON list's "20" is text, not the number 20
        values = [plain_float(v) if isinstance(v, str) else float(v) for v in numbers]
    except (TypeError, ValueError, OverflowError):
        if isinstance(parsed, list):
            quoted = next((v for v in numbers if isinstance(v, str)), None)
            if quoted is not None:
                shown = quoted if len(quoted) <= 40 else quoted[:37] + "..."
                raise ValueError(
                    f"holds the text {shown!r}, not a number: write it without quotes"
                ) from None
        bad = next(str(v) for v in numbers if not _is_number(v))
        shown = bad if len(bad) <= 40 else bad[:37] + "..."
        raise ValueError(f"holds something other than numbers: {shown!r}") from None
    if not values:
        raise ValueError("empty file")
    if not all(math.isfinite(v) and v >= minimum for v in values):
        raise ValueError(f"every value must be a number >= {minimum:g}")
    if whole and not all(v.is_integer() for v in values):
        raise ValueError("numbers of tokens are whole numbers")
    return kept_values(values)


def _is_number(value: object) -> bool:
    if isinstance(value, bool):
        return False
    try:
        plain_float(value) if isinstance(value, str) else float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return False
    return True
