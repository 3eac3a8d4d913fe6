"""validate's scenarios in worker processes: the same points, in the datasets' order."""

from __future__ import annotations

from capsim.calibration.compare import compare_or_skip, scenario_cost
from capsim.calibration.published import load_published, published_dir
from capsim.catalog.loader import load_catalog

SMALL = [
    "corpus-client-m3ultra-llamacpp-bench.yaml",
    "corpus-llamacpp-cuda-disc15013-llama2-7b-q4_0-scoreboard.yaml",
    "corpus-ttis-rtx4090-qwen3-4b-vllm-c1-isl-sweep.yaml",
]


def test_scenarios_in_processes_give_the_same_points_in_the_same_order():
    cat = load_catalog()
    datasets = load_published([published_dir() / name for name in SMALL])
    alone, skipped_alone = compare_or_skip(datasets, cat, workers=1)
    seen = []
    spread, skipped_spread = compare_or_skip(
        datasets, cat, workers=2, finished=lambda sc, pts, skip: seen.append(sc.name)
    )
    assert [(p.dataset, p.scenario, p.concurrency, p.metric) for p in spread] == [
        (p.dataset, p.scenario, p.concurrency, p.metric) for p in alone
    ]
    assert [p.predicted for p in spread] == [p.predicted for p in alone]
    assert skipped_spread == skipped_alone
    # every scenario reported once as it finished, whatever the order
    assert sorted(seen) == sorted(sc.name for ds in datasets for sc in ds.scenarios)


def test_scenario_cost_grows_with_requests_and_output():
    ds = load_published(
        [published_dir() / "corpus-sglang-cookbook-h200-b200-qwen36-35b-a3b-8k1k-ht.yaml"]
    )[0]
    small = load_published([published_dir() / SMALL[0]])[0]
    assert scenario_cost(ds, ds.scenarios[0]) > 100 * scenario_cost(small, small.scenarios[0])
