"""Reading a server's Prometheus ``/metrics``: vLLM, SGLang and llama.cpp series.

Only the text exposition format is parsed (``name{labels} value``); histograms contribute
their ``_sum`` and ``_count`` series. Values of the same name are summed over labels except
where a label is kept (``position`` of speculative-decoding acceptance per position), and
``vllm:cache_config_info``'s labels are kept whole (they carry the KV cache size).
"""

from __future__ import annotations

import re

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
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def parse_labels(text: str | None) -> dict[str, str]:
    return {k: v for k, v in LABEL.findall(text or "")}


def parse_metrics(text: str) -> dict[str, object]:
    """Known series from an exposition: counters and gauges summed over labels,
    acceptance per position keyed ``NAME[position]``, and cache_config_info's labels."""
    values: dict[str, object] = {}
    for raw in text.splitlines():
        if not raw or raw.startswith("#"):
            continue
        m = LINE.match(raw)
        if not m:
            continue
        name, labels, value_text = m.group(1), m.group(3), m.group(4)
        try:
            value = float(value_text)
        except ValueError:
            continue
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
    return values


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
