"""Reading a server's Prometheus ``/metrics``: vLLM, SGLang and llama.cpp series.

The text exposition format is parsed by prometheus_client's parser, one sample line at a
time: a line it refuses is skipped and counted, so one garbled line costs that line and
not the scrape. Histograms contribute their ``_sum`` and ``_count`` series. Values of the
same name are summed over labels except where a label is kept (``position`` of
speculative-decoding acceptance per position), and ``vllm:cache_config_info``'s labels are
kept whole (they carry the KV cache size).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?=[{\s])")

COUNTERS = (
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_hits_total",
    "vllm:request_success_total",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:num_requests_total",
    "llamacpp:prompt_tokens_total",
    "llamacpp:tokens_predicted_total",
)
GAUGES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
    "llamacpp:kv_cache_usage_ratio",
)
GENERATION_COUNTERS = (
    "vllm:generation_tokens_total",
    "sglang:generation_tokens_total",
    "llamacpp:tokens_predicted_total",
)
"""Output tokens the server counted, by engine."""
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
KNOWN = frozenset((*COUNTERS, *GAUGES, PER_POSITION, "vllm:cache_config_info"))
"""The series a scrape reads; only their lines go through the parser."""


def parse_sample_line(line: str) -> tuple[str, dict[str, str], float] | None:
    """(name, labels, value) of one exposition sample line, read by prometheus_client's
    parser; None where it refuses the line."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        samples = [s for f in text_string_to_metric_families(line + "\n") for s in f.samples]
    except (ValueError, TypeError, IndexError, KeyError):
        return None
    if len(samples) != 1:
        return None
    sample = samples[0]
    return sample.name, dict(sample.labels), float(sample.value)


@dataclass
class Exposition:
    """What one scrape gave: the known series, and the lines that could not be read."""

    values: dict[str, object] = field(default_factory=dict)
    skipped: int = 0
    first_skipped: str | None = None


class ScrapeLog:
    """How the scrapes of one level went: failures by reason, unparseable lines."""

    def __init__(self) -> None:
        self.scrapes = 0
        self.failed: dict[str, int] = {}
        self.skipped = 0
        self.first_skipped: str | None = None

    def add(self, exposition: Exposition) -> Exposition:
        """Count a scrape that answered (returns it)."""
        self.scrapes += 1
        self.skipped += exposition.skipped
        self.first_skipped = self.first_skipped or exposition.first_skipped
        return exposition

    def fail(self, problem: str) -> None:
        """Count a scrape that failed (``HTTP 404``, ``ConnectError``)."""
        self.scrapes += 1
        self.failed[problem] = self.failed.get(problem, 0) + 1

    def note(self) -> str | None:
        """One line for the level's ``metrics_note``; None when every scrape was clean."""
        parts = []
        if self.failed:
            reasons = ", ".join(f"{k} x{n}" for k, n in self.failed.items())
            failed = sum(self.failed.values())
            parts.append(f"{failed} of {self.scrapes} scrapes failed ({reasons})")
        if self.skipped:
            parts.append(
                f"{self.skipped} unparseable lines skipped (first: {self.first_skipped!r})"
            )
        return "/metrics: " + "; ".join(parts) if parts else None


def parse_exposition(text: str) -> Exposition:
    """Known series from an exposition: counters and gauges summed over labels,
    acceptance per position keyed ``NAME[position]``, and cache_config_info's labels;
    unparseable lines are skipped and counted."""
    out = Exposition()
    values = out.values
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        named = METRIC_NAME.match(line)
        if named is not None and named.group(0) not in KNOWN:
            continue  # a series capsim does not read (histogram buckets and the like)
        parsed = parse_sample_line(line) if named is not None else None
        if parsed is None:
            out.skipped += 1
            if out.first_skipped is None:
                out.first_skipped = line[:120]
            continue
        name, labels, value = parsed
        if not math.isfinite(value):  # NaN or an infinity: read, but nothing to add
            continue
        if name == "vllm:cache_config_info":
            values["cache_config"] = labels
            continue
        if name == PER_POSITION:
            key = f"{name}[{labels.get('position', '?')}]"
            values[key] = float(values.get(key, 0.0)) + value
            continue
        if name in COUNTERS or name in GAUGES:
            values[name] = float(values.get(name, 0.0)) + value
    return out


def parse_metrics(text: str) -> dict[str, object]:
    """The known series of an exposition (see ``parse_exposition``)."""
    return parse_exposition(text).values


def counter_deltas(before: dict[str, object], after: dict[str, object]) -> dict[str, float]:
    """Increase of every counter between two scrapes."""
    out = {}
    for key, value in after.items():
        if not isinstance(value, float):
            continue
        base = key.split("[")[0]
        if base in COUNTERS or base == PER_POSITION:
            prev = before.get(key, 0.0)
            out[key] = value - (prev if isinstance(prev, float) else 0.0)
    return out


def gauge_peaks(samples: list[dict[str, object]]) -> dict[str, float]:
    peaks: dict[str, float] = {}
    for sample in samples:
        for key, value in sample.items():
            if key in GAUGES and isinstance(value, float):
                peaks[key] = max(peaks.get(key, value), value)
    return peaks


def acceptance_per_position(deltas: dict[str, float]) -> list[float] | None:
    """vLLM's per-position acceptance rate over a level: accepted at position i / drafts."""
    drafts = deltas.get("vllm:spec_decode_num_drafts_total")
    if not drafts:
        return None
    positions = sorted(
        (int(k.split("[")[1].rstrip("]")), v)
        for k, v in deltas.items()
        if k.startswith(PER_POSITION + "[")
    )
    return [v / drafts for _, v in positions] or None
