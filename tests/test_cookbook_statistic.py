"""The SGLang cookbook's TTFT and TPOT are medians (P50), and its own figures say so.

The cookbook's renderer labels a cell's ``ttft_ms`` and ``tpot_ms`` "(P50)" unless the page
sets ``latencyPercentile: "Mean"`` (none of the pages in the corpus does), so the datasets
record them as medians. The high-throughput cells rule the mean out without that label: a
closed loop of C clients that runs R rounds of C requests at X requests a second (the cell's
own throughput) spends about C / X in the system per request at steady state, less over the
whole run, because its first round starts with an empty queue and its last drains one; with
the drain as long as a queue of C at rate X, the mean end-to-end latency is at most
C / X x (1 - 1 / (2R)), and the mean TTFT that less the decode, (osl - 1) x TPOT. Every
cell's TTFT is well above that, and close to C / X less the decode, where the median of a
two-round run sits (the second round's requests, half of them, wait a full turn).
"""

from __future__ import annotations

import pytest

from capsim.calibration.published import load_dataset, published_dir

HIGH_THROUGHPUT = (
    "corpus-sglang-cookbook-h200-b200-qwen36-35b-a3b-8k1k-ht",
    "corpus-sglang-cookbook-h200-b200-b300-gemma4-e2b-e4b-8k1k-ht",
)
COOKBOOK = (
    *HIGH_THROUGHPUT,
    "corpus-sglang-cookbook-h200-b200-gb300-glm52-fp8-8k1k",
    "corpus-sglang-cookbook-h200-b200-qwen36-35b-a3b-8k-c1-ttft",
)


def cells(name: str):
    """(scenario, concurrency, {metric: value}) of each cell of a dataset, and the dataset."""
    ds = load_dataset(published_dir() / f"{name}.yaml")
    out = []
    for sc in ds.scenarios:
        by_level: dict[int, dict[str, float]] = {}
        for p in sc.points:
            by_level.setdefault(p.concurrency, {})[p.metric] = p.value
        out += [(sc.name, c, m) for c, m in by_level.items()]
    return ds, out


@pytest.mark.parametrize("name", COOKBOOK)
def test_cookbook_latencies_are_recorded_as_medians_with_the_schema_quoted(name):
    ds, _ = cells(name)
    latencies = [p for sc in ds.scenarios for p in sc.points if p.metric in ("ttft_s", "tpot_s")]
    assert latencies and {p.statistic for p in latencies} == {"median"}
    quotes = [s.quote for s in ds.more_sources]
    assert 'const pct = config.latencyPercentile || "P50";' in quotes


@pytest.mark.parametrize("name", HIGH_THROUGHPUT)
def test_a_mean_ttft_could_not_be_this_long_at_the_cells_own_throughput(name):
    ds, found = cells(name)
    rounds = ds.workload.rounds_per_level
    isl, osl = int(ds.workload.input_tokens), int(ds.workload.output_tokens)
    assert rounds == 2
    for scenario, clients, m in found:
        rate = m["total_tok_s"] / (isl + osl)  # requests a second: every request isl + osl
        turn = clients / rate  # seconds in the system per request at steady state
        decode = (osl - 1) * m["tpot_s"]
        longest_mean = turn * (1 - 1 / (2 * rounds)) - decode
        median = turn - decode
        assert m["ttft_s"] > 1.15 * longest_mean, (scenario, clients)
        assert m["ttft_s"] == pytest.approx(median, rel=0.4), (scenario, clients)
