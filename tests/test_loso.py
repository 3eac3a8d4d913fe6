"""Leave-one-source-out errors (issue 46): the registry of priors chosen with corpus
points in view, and validate's predictions with them put back."""

from __future__ import annotations

import pytest

from capsim.calibration.compare import compare_dataset, compare_scenario, simulated_engine
from capsim.calibration.loso import (
    PriorInView,
    leave_one_source_out,
    left_out_overrides,
    load_priors_in_view,
    loso_summaries,
)
from capsim.calibration.published import load_published
from capsim.catalog.loader import load_catalog
from capsim.errors import CapsimUserError
from capsim.physics.deployment import default_efficiency

CAT = load_catalog()
PUBLISHED = {ds.name: ds for ds in load_published()}
PRIORS = load_priors_in_view()


def resolved(sc):
    gpu = CAT.gpu(sc.gpu)
    return gpu, default_efficiency(gpu, CAT, CAT.engine(simulated_engine(sc)))


@pytest.mark.parametrize("prior", PRIORS, ids=lambda p: p.prior[:40])
def test_every_prior_in_view_names_real_sources_and_is_in_effect_there(prior):
    """The registry follows hardware_db: each source it names exists, and the values it
    says were chosen are the ones some scenario of those sources is predicted with (a
    prior changed in the catalog without its entry here fails)."""
    assert set(prior.in_view) <= set(PUBLISHED), set(prior.in_view) - set(PUBLISHED)
    reached = [
        sc.name
        for name in prior.in_view
        for sc in PUBLISHED[name].scenarios
        if prior.in_effect(resolved(sc)[1], resolved(sc)[0].hardware_class, sc.engine)
    ]
    assert reached, prior.prior
    assert prior.chosen != prior.without


def test_a_prior_is_put_back_only_for_its_sources_and_its_classes():
    v0 = next(p for p in PRIORS if "V0" in p.prior)
    source = "corpus-accelmark-llama31-8b-sharegpt-c8-a100"
    gpu, params = resolved(PUBLISHED[source].scenarios[0])
    assert left_out_overrides(PRIORS, source, params, "x") == v0.without
    # the same engine generation in a source nobody looked at keeps its prediction
    assert left_out_overrides(PRIORS, "some-other-source", params, gpu.hardware_class) == {}
    blackwell = next(p for p in PRIORS if "Blackwell" in p.prior)
    hopper = CAT.gpu("h200")
    hopper_params = default_efficiency(hopper, CAT, CAT.engine("sglang"))
    # Hopper carries the same kernel-level values for reasons of its own (its kernel fits)
    assert blackwell.in_effect(hopper_params, "datacenter-blackwell")
    assert not blackwell.in_effect(hopper_params, hopper.hardware_class)


def test_an_engine_bound_prior_is_put_back_for_that_engines_scenarios_only():
    """The early-DeepSeek floor was taken for vLLM with dstack in view; SGLang's value came
    from SGLang's own figures, so its scenarios of the same source keep theirs."""
    name = "corpus-dstack-dsr1-h200-mi300x-3200in-800out"
    by_engine = {sc.engine: sc for sc in PUBLISHED[name].scenarios}
    for engine, put_back in (("vllm", True), ("sglang", False)):
        sc = by_engine[engine]
        gpu, params = resolved(sc)
        assert params.mla_layer_overhead_us == 440.0
        left_out = left_out_overrides(PRIORS, name, params, gpu.hardware_class, sc.engine)
        assert ("mla_layer_overhead_us" in left_out) is put_back, engine
        assert left_out.get("mla_layer_overhead_us", 0.0) == 0.0


def test_left_out_predictions_are_the_sources_simulated_with_the_values_put_back():
    name = "corpus-accelmark-mixtral-8x7b-tp8-sharegpt"
    ds = PUBLISHED[name]
    other = PUBLISHED["corpus-client-rtx4090-vllm-mistral7b"]
    in_sample = compare_dataset(ds, CAT) + compare_dataset(other, CAT)
    left_out = leave_one_source_out([ds, other], in_sample, CAT)
    v0 = next(p for p in PRIORS if "V0" in p.prior)
    by_hand = [
        q for sc in ds.scenarios for q in compare_scenario(ds, sc, CAT, overrides=v0.without)
    ]
    n = len(by_hand)
    assert [p.predicted for p in left_out[:n]] == pytest.approx([q.predicted for q in by_hand])
    assert [p.predicted for p in left_out[:n]] != pytest.approx(
        [p.predicted for p in in_sample[:n]]
    )
    # a source no prior had in view keeps every prediction
    assert left_out[n:] == in_sample[n:]
    rows = loso_summaries(in_sample[:n], left_out[:n])
    every = {r["group"]: r for r in rows if r["points"] == "every point"}
    assert every["throughput"]["left_out_median_abs_error_percent"] != pytest.approx(
        every["throughput"]["in_sample_median_abs_error_percent"]
    )


def test_a_malformed_registry_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="not an efficiency parameter"):
        PriorInView(
            prior="x", chosen={"no_such": 1}, without={"no_such": 2}, in_view=["a"], how="h"
        )
    with pytest.raises(ValueError, match="same parameters"):
        PriorInView(
            prior="x",
            chosen={"step_overhead_us": 1},
            without={"per_sequence_overhead_us": 2},
            in_view=["a"],
            how="h",
        )
    bad = tmp_path / "priors.yaml"
    bad.write_text("prior: not a list\n")
    with pytest.raises(CapsimUserError, match="expected a list"):
        load_priors_in_view(bad)
    bad.write_text("- prior: x\n  chosen: {step_overhead_us: 1}\n")
    with pytest.raises(CapsimUserError, match=r"priors\.yaml"):
        load_priors_in_view(bad)


def test_a_prior_put_back_to_unset_takes_the_path_its_absence_gives():
    """A prior whose 'without' is null (llama.cpp's MMQ share on GeForce Blackwell, which
    ran the 16-bit path before): the source left out is predicted on that path (its
    prompts slower: FP16 cuBLAS at the FP16-accumulate rate instead of int8 MMQ), not
    refused as 'not a valid number'."""
    from pathlib import Path

    from capsim.calibration.compare import compare_dataset
    from capsim.calibration.loso import leave_one_source_out
    from capsim.calibration.published import load_dataset
    from capsim.catalog.loader import load_catalog

    cat = load_catalog()
    root = Path(__file__).resolve().parents[1] / "calibration" / "published"
    ds = load_dataset(root / "corpus-llamacpp-cuda-disc15013-llama2-7b-q4_0-scoreboard.yaml")
    ds = ds.model_copy(update={"scenarios": [s for s in ds.scenarios if s.gpu == "rtx5090"]})
    points = compare_dataset(ds, cat)
    left = leave_one_source_out([ds], points, cat)
    prompt = [(p, q) for p, q in zip(points, left, strict=True) if p.metric == "prompt_tok_s"]
    assert len(prompt) == 1
    in_sample, without = prompt[0]
    assert without.predicted < 0.85 * in_sample.predicted
