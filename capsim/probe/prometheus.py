"""Reading a server's Prometheus ``/metrics``: vLLM, SGLang and llama.cpp series.

Only the text exposition format is parsed (``name{labels} value``); histograms contribute
their ``_sum`` and ``_count`` series. Values of the same name are summed over labels except
where a label is kept (``position`` of speculative-decoding acceptance per position), and
``vllm:cache_config_info``'s labels are kept whole (they carry the KV cache size). A line
that is not a comment, blank or ``name{labels} value`` is skipped and counted, so one
garbled line costs that line and not the scrape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+([^\s]+)")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

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


def parse_labels(text: str | None) -> dict[str, str]:
    return {k: v for k, v in LABEL.findall(text or "")}


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
        m = LINE.match(line)
        value = _number(m.group(4)) if m else None
        if value is None:
            out.skipped += 1
            if out.first_skipped is None:
                out.first_skipped = line[:120]
            continue
        name, labels = m.group(1), m.group(3)
        if name == "vllm:cache_config_info":
            values["cache_config"] = parse_labels(labels)
            continue
        if name == PER_POSITION:
            pos = parse_labels(labels).get("position", "?")
            key = f"{name}[{pos}]"
            values[key] = float(values.get(key, 0.0)) + value
            continue
        if name in COUNTERS or name in GAUGES:
            values[name] = float(values.get(name, 0.0)) + value
    return out


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


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
