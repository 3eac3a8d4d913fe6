"""Calibration: the fit recovers known parameters; profiles round-trip; CV runs."""

from __future__ import annotations

import os

import numpy as np
import pytest

from capsim.calibration.compare import compare_dataset
from capsim.calibration.crossval import cross_validate
from capsim.calibration.fit import fit_profile
from capsim.calibration.profiles import load_profile
from capsim.calibration.published import MeasuredPoint, PublishedDataset, load_published
from capsim.catalog.loader import load_catalog
from capsim.physics.deployment import default_efficiency

CAT = load_catalog()


def synthetic(truth: dict[str, float]) -> PublishedDataset:
    """A seed-002-shaped dataset whose 'measurements' are simulations with ``truth``."""
    base = {
        "name": "synthetic",
        "source": {"title": "synthetic: simulated with known parameters"},
        "workload": {
            "kind": "batch",
            "rounds_per_level": 1,
            "input_tokens": "512",
            "output_tokens": "200",
        },
        "metric_definition": "output_tok_s of batch rounds",
        "scenarios": [
            {
                "name": name,
                "gpu": "rtx3090",
                "model": model,
                "quant": "awq-int4",
                "tp": 1,
                # host work in series with the GPU's, so the host overheads these tests
                # fit show in every step
                "flags": {"max_num_seqs": 4, "async_scheduling": False},
                "points": [
                    {"concurrency": c, "metric": "output_tok_s", "value": 1.0, "quote": "synthetic"}
                    for c in (1, 2, 3, 4)
                ],
            }
            for name, model in (("moe", "qwen3-coder-30b-a3b"), ("dense", "qwen2.5-coder-32b"))
        ],
    }
    ds = PublishedDataset.model_validate(base)
    params = default_efficiency(CAT.gpu("rtx3090"), CAT).with_overrides(truth)
    predicted = {(p.scenario, p.concurrency): p.predicted for p in compare_dataset(ds, CAT, params)}
    scenarios = []
    for sc in ds.scenarios:
        points = [
            MeasuredPoint(
                concurrency=p.concurrency,
                metric=p.metric,
                value=predicted[(sc.name, p.concurrency)],
                quote="synthetic",
            )
            for p in sc.points
        ]
        scenarios.append(sc.model_copy(update={"points": points}))
    return ds.model_copy(update={"scenarios": scenarios})


def test_fit_recovers_known_parameters(tmp_path):
    truth = {"bandwidth_efficiency": 0.65, "step_overhead_us": 1500.0}
    ds = synthetic(truth)
    profile = fit_profile([ds], CAT, "synthetic", tuple(truth))
    for name, value in truth.items():
        assert profile.parameters[name].value == pytest.approx(value, rel=0.05), name
        assert profile.parameters[name].identifiable
    assert profile.log_residual_sd < 0.02
    assert max(abs(r.error) for r in profile.residuals) < 0.02
    path = profile.save(tmp_path / "p.yaml")
    again = load_profile(path)
    assert again.parameters == profile.parameters
    assert again.params(CAT, "rtx3090").step_overhead_us == pytest.approx(1500, rel=0.05)


def test_a_profile_comes_from_the_cache_until_its_file_changes(tmp_path, monkeypatch):
    # a prediction reads its profile from capsim's cache (no YAML parser loaded); an edit
    # to the file, or a damaged cache entry, is never served stale
    import capsim.calibration.profiles as profiles

    cache = tmp_path / "cache"
    monkeypatch.setenv("CAPSIM_CACHE_DIR", str(cache))
    ds = synthetic({"step_overhead_us": 1500.0})
    profile = fit_profile([ds], CAT, "cached", ("step_overhead_us",))
    path = profile.save(tmp_path / "p.yaml")
    first = load_profile(path)
    assert len(list(cache.glob("profile-*.json"))) == 1
    profiles._load_profile_version.cache_clear()  # as a new process would
    assert load_profile(path).parameters == first.parameters
    assert load_profile(path).path == str(path.resolve())
    edited = profile.model_copy(update={"name": "edited"})
    edited.save(path)
    os.utime(path, ns=(1, 1))  # a different modification time, whatever the clock
    profiles._load_profile_version.cache_clear()
    assert load_profile(path).name == "edited"
    for cached in cache.glob("profile-*.json"):
        cached.write_bytes(b"not a pickle")
    profiles._load_profile_version.cache_clear()
    assert load_profile(path).name == "edited"


def test_prior_weight_pulls_a_fit_towards_the_prior_and_keeps_the_data_errors():
    """The step overhead is 3,000 us in the synthetic truth and 400 us in the prior. With
    no pull the fit finds the truth; the stronger the pull towards the prior, the closer
    to 400 the fit ends up. The standard error still comes from the points alone."""
    ds = synthetic({"step_overhead_us": 3000.0})
    fit = ("step_overhead_us",)
    values, stds = [], []
    for weight in (0.0, 2.0, 20.0):
        p = fit_profile([ds], CAT, "pulled", fit, prior_weight=weight, max_evaluations=12)
        p = p.parameters[fit[0]]
        assert p.prior == 400.0
        values.append(p.value)
        stds.append(p.std)
    assert values[0] == pytest.approx(3000, rel=0.05)
    assert 400 < values[2] < values[1] < values[0]
    assert values[2] < 2000  # a weight of 20 wins against eight points
    assert all(std is not None and std > 0 for std in stds)


def test_cross_validation_predicts_left_out_levels():
    ds = synthetic({"step_overhead_us": 1200.0})
    cv = cross_validate([ds], CAT, ("step_overhead_us",), max_evaluations=8)
    assert {p.concurrency for p in cv} == {1, 2, 3, 4}
    assert np.mean([abs(p.error) for p in cv]) < 0.05


def test_cross_validation_refits_stop_at_their_own_tolerance(monkeypatch):
    """A level's refit stops at CV_TOLERANCE, a profile's fit at FIT_TOLERANCE."""
    import capsim.calibration.fit as fit_module
    from capsim.calibration.crossval import CV_TOLERANCE
    from capsim.calibration.least_squares import FIT_TOLERANCE

    seen = []
    real = fit_module.solve

    def solve(*args, **kwargs):
        seen.append(kwargs.get("tolerance"))
        return real(*args, **kwargs)

    monkeypatch.setattr(fit_module, "solve", solve)
    ds = synthetic({"step_overhead_us": 1200.0})
    cross_validate([ds], CAT, ("step_overhead_us",), max_evaluations=8)
    assert seen and set(seen) == {CV_TOLERANCE}
    seen.clear()
    fit_profile([ds], CAT, "whole", ("step_overhead_us",), max_evaluations=8)
    assert set(seen) == {FIT_TOLERANCE} and CV_TOLERANCE > FIT_TOLERANCE


def test_every_published_dataset_loads_and_is_sourced():
    datasets = load_published()
    names = {ds.name.split("-")[0] for ds in datasets}
    assert {"seed000", "seed001", "seed002", "seed004"} <= names
    for ds in datasets:
        for sc in ds.scenarios:
            for p in sc.points:
                assert p.quote.strip()
    seed004 = next(ds for ds in datasets if ds.name.startswith("seed004"))
    for sc in seed004.scenarios:
        for p in sc.points:  # each parsed row cross-checks: per-request = avg / C
            per_request = int(p.note.split("per-request ")[1].split()[0])
            assert abs(per_request - p.value / p.concurrency) <= 0.51


def test_probe_run_files_become_datasets(tmp_path):
    from pathlib import Path

    from capsim.calibration.published import dataset_from_run
    from capsim.errors import CapsimUserError

    ds = dataset_from_run(Path("calibration/runs/cpu-vllm-tiny-qwen3.json"))
    (scenario,) = ds.scenarios
    assert scenario.gpu == "cpu-host" and scenario.model == "tiny-qwen3"
    assert scenario.kv_capacity_tokens == 4096 * 128  # from vllm:cache_config_info
    assert len(scenario.points) == 8 * 7  # 4 levels x 2 runs x 7 metrics (RUN_METRICS)
    assert ds.workload.kind == "closed" and ds.workload.input_tokens == "512"
    points = compare_dataset(ds, CAT)
    assert all(p.predicted > 0 for p in points)
    (tmp_path / "nogpu.json").write_text(
        Path("calibration/runs/cpu-vllm-tiny-qwen3.json")
        .read_text()
        .replace('"gpu": "cpu-host"', '"gpu": null')
    )
    with pytest.raises(CapsimUserError, match="--gpu"):
        dataset_from_run(tmp_path / "nogpu.json")


def test_a_stored_run_finds_its_model_in_the_config_kept_beside_it(tmp_path):
    """A run of a local checkpoint names the folder the server loaded (/v1/models 'root');
    read on another machine, where that folder is gone, the copy of its config.json kept
    beside the run stands in, and a folder of runs is read with the configs left out."""
    import json
    import shutil
    from pathlib import Path

    from capsim.calibration.published import dataset_from_run

    src = Path("calibration/runs/archs-2026-11-27")
    run = json.loads((src / "cpu-vllm-arch-phi3.json").read_text())
    run["header"]["server"]["models"][0]["root"] = str(tmp_path / "gone" / "arch-phi3")
    (tmp_path / "cpu-vllm-arch-phi3.json").write_text(json.dumps(run))
    (scenario,) = dataset_from_run(tmp_path / "cpu-vllm-arch-phi3.json").scenarios
    assert scenario.model == "arch-phi3"  # nothing to import: the served name, unknown
    shutil.copy(src / "arch-phi3.config.json", tmp_path)
    (scenario,) = dataset_from_run(tmp_path / "cpu-vllm-arch-phi3.json").scenarios
    assert scenario.model == str(tmp_path / "arch-phi3.config.json")
    points = compare_dataset(dataset_from_run(tmp_path / "cpu-vllm-arch-phi3.json"), CAT)
    assert points and all(p.predicted > 0 for p in points)
    # a folder: every run in it, none of the kept configs
    datasets = load_published([src])
    assert len(datasets) == 14
    assert all(d.name.startswith("cpu-vllm-arch-") for d in datasets)


def test_a_run_is_simulated_in_the_dtype_its_server_cast_the_weights_to(tmp_path):
    """A float16 or float32 checkpoint that a server ran with --dtype bfloat16 (recorded
    by the probe as an engine flag) runs in bf16, not the checkpoint's dtype: on the CPU
    host fp16 matmuls are seven times slower, so the wrong one puts TTFT off by a factor
    of four. A quantised checkpoint keeps its format (--dtype sets its activations), and
    without the flag a float32 checkpoint is served in bf16 as vLLM's auto dtype does."""
    import json
    from pathlib import Path

    from capsim.calibration.published import dataset_from_run, served_float_format

    src = Path("calibration/runs/archs-2026-11-27")
    run = json.loads((src / "cpu-vllm-arch-phi3.json").read_text())
    run["header"]["server"]["models"][0]["root"] = str(tmp_path / "gone")
    assert run["header"]["deployment"]["engine_flags"]["dtype"] == "bfloat16"
    config = json.loads((src / "arch-phi3.config.json").read_text())
    errors = {}
    for dtype in ("float16", "float32"):
        folder = tmp_path / dtype
        folder.mkdir()
        (folder / "arch-phi3.config.json").write_text(json.dumps({**config, "torch_dtype": dtype}))
        (folder / "cpu-vllm-arch-phi3.json").write_text(json.dumps(run))
        (scenario,) = dataset_from_run(folder / "cpu-vllm-arch-phi3.json").scenarios
        assert scenario.quant == "bf16"
        points = compare_dataset(dataset_from_run(folder / "cpu-vllm-arch-phi3.json"), CAT)
        ttft = [abs(p.error) for p in points if p.metric == "ttft_s"]
        errors[dtype] = sorted(ttft)[len(ttft) // 2]
    assert max(errors.values()) < 0.3, errors
    # no flag: the checkpoint's own dtype, float32 served as bf16
    unflagged = {**run["header"]["deployment"]["engine_flags"]}
    del unflagged["dtype"]
    fp16_config = str(tmp_path / "float16" / "arch-phi3.config.json")
    assert served_float_format(unflagged, fp16_config) is None
    assert served_float_format({"--dtype": "half"}, fp16_config) == "fp16"
    from capsim.catalog.loader import load_catalog
    from capsim.catalog.resolve import resolve_into

    catalog, (fp32,) = resolve_into(
        load_catalog(), [str(tmp_path / "float32" / "arch-phi3.config.json")]
    )
    assert catalog.model(fp32.name).dtype == "bf16"
    # a quantised catalog checkpoint keeps its format
    assert (
        served_float_format({"dtype": "float16"}, "cpatonn/Qwen3-Coder-30B-A3B-Instruct-AWQ-4bit")
        is None
    )


def test_a_probed_server_with_speculation_is_simulated_with_its_measured_acceptance(tmp_path):
    """A run whose deployment states --spec becomes a scenario with that speculation and
    the acceptance per draft position that vLLM's counters report over the whole run."""
    import json
    from pathlib import Path

    from capsim.calibration.published import dataset_from_run
    from capsim.probe.prometheus import PER_POSITION

    run = json.loads(Path("calibration/runs/cpu-vllm-tiny-qwen3.json").read_text())
    run["header"]["deployment"]["spec"] = "ngram:2"
    for i, level in enumerate(run["levels"]):  # 100 drafts per level, accepted 80 and 40
        level["server_deltas"].update(
            {
                "vllm:spec_decode_num_drafts_total": 100.0,
                f"{PER_POSITION}[0]": 80.0 if i % 2 else 70.0,
                f"{PER_POSITION}[1]": 40.0 if i % 2 else 50.0,
            }
        )
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(run))
    (scenario,) = dataset_from_run(path).scenarios
    assert scenario.spec == "ngram:2"
    assert scenario.spec_acceptance == pytest.approx([0.75, 0.45])
    plain = compare_dataset(
        dataset_from_run(Path("calibration/runs/cpu-vllm-tiny-qwen3.json")), CAT
    )
    drafted = compare_dataset(dataset_from_run(path), CAT)
    pairs = [
        (d, p)
        for d, p in zip(drafted, plain, strict=True)
        if p.metric in ("output_tok_s", "tpot_s")
    ]
    assert pairs and all(d.predicted != p.predicted for d, p in pairs)


def test_hardware_classes_name_their_own_fit_set():
    from capsim.calibration.fit import DEFAULT_FIT, class_fit
    from capsim.calibration.least_squares import FIT_BOUNDS

    assert class_fit("consumer-ampere", CAT) == DEFAULT_FIT
    blackwell = class_fit("datacenter-blackwell", CAT)
    assert "per_sequence_overhead_us" in blackwell and blackwell != DEFAULT_FIT
    for name in CAT.efficiency.entries:
        assert set(class_fit(name, CAT)) <= set(FIT_BOUNDS)


def test_levels_use_their_own_mean_output_where_the_source_gives_it():
    """Seed 002's C=4 mean output comes from its swarm wall clock: only the levels whose
    mean differs are predicted differently, and the scenario-wide mean is the fallback."""
    from capsim.calibration.compare import compare_scenario, output_mean_for, scenario_config

    ds = next(d for d in load_published() if d.name.startswith("seed002"))
    sc = next(s for s in ds.scenarios if s.name == "dense-tp1")
    assert output_mean_for(sc, 4) == 1254 and output_mean_for(sc, 1) == 2128
    plain = sc.model_copy(update={"output_mean_tokens_by_level": {}})
    assert output_mean_for(plain, 4) == 2128
    by_level = {(p.concurrency, p.metric): p.predicted for p in compare_scenario(ds, sc, CAT)}
    same_mean = {(p.concurrency, p.metric): p.predicted for p in compare_scenario(ds, plain, CAT)}
    assert by_level[(1, "output_tok_s")] == pytest.approx(same_mean[(1, "output_tok_s")])
    assert by_level[(4, "output_tok_s")] != pytest.approx(same_mean[(4, "output_tok_s")])
    config = scenario_config(ds, sc, [4], 1254)
    assert config.output_tokens.startswith("lognormal:") and config.batch_rounds == 16


def scaled_point(ds: PublishedDataset, scenario: str, level: int, factor: float):
    """``ds`` with one point's measured value multiplied by ``factor``."""
    scenarios = []
    for sc in ds.scenarios:
        points = [
            p.model_copy(update={"value": p.value * factor})
            if (sc.name, p.concurrency) == (scenario, level)
            else p
            for p in sc.points
        ]
        scenarios.append(sc.model_copy(update={"points": points}))
    return ds.model_copy(update={"scenarios": scenarios})


def test_leave_one_point_out_predicts_each_point_without_it():
    # One 'measurement' is 10% above what the true parameters give. Fitted with the other
    # seven, that point is predicted at the truth (error 1/1.1 - 1); fitted in-sample, the
    # fit leans towards it and its error shrinks.
    ds = scaled_point(synthetic({"step_overhead_us": 1200.0}), "moe", 1, 1.1)
    fit = ("step_overhead_us",)
    cv = cross_validate([ds], CAT, fit, max_evaluations=8, scheme="point")
    assert [(p.scenario, p.concurrency) for p in cv] == [
        (sc.name, p.concurrency) for sc in ds.scenarios for p in sc.points
    ]
    errors = {(p.scenario, p.concurrency): p.error for p in cv}
    odd = errors.pop(("moe", 1))
    assert odd == pytest.approx(1 / 1.1 - 1, abs=0.003)
    # the others are fitted with the odd point in, which pulls them up a little
    assert all(0 < e < 0.06 for e in errors.values())
    inside = fit_profile([ds], CAT, "in-sample", fit, max_evaluations=20)
    odd_inside = next(
        r.error for r in inside.residuals if (r.scenario, r.concurrency) == ("moe", 1)
    )
    assert odd_inside > odd + 0.02


def test_the_linearised_leave_one_out_is_refitting_for_a_linear_model():
    """The PRESS identity: for residuals linear in the parameters, each point left out of a
    least-squares fit is predicted with residual r_i / (1 - h_ii), what an explicit refit
    without it gives (residuals tiny next to ROBUST_SCALE, so the soft-L1 weights are 1)."""
    from capsim.calibration.compare import ComparedPoint
    from capsim.calibration.crossval import _left_out

    rng = np.random.default_rng(3)
    jac = rng.normal(size=(9, 2))
    y = jac @ np.array([0.4, -0.2]) + rng.normal(scale=1e-5, size=9)
    x = np.linalg.lstsq(jac, y, rcond=None)[0]
    r = jac @ x - y  # residuals at the optimum, as log(predicted / measured)
    points = [
        ComparedPoint("d", "s", k + 1, "output_tok_s", 100.0, 100.0 * np.exp(r[k]))
        for k in range(9)
    ]
    left = _left_out(points, r, jac, np.ones(2), 0.0, {k: [k] for k in range(9)})
    for k in range(9):
        keep = np.arange(9) != k
        x_k = np.linalg.lstsq(jac[keep], y[keep], rcond=None)[0]
        refit = jac[k] @ x_k - y[k]
        assert np.log(left[k].predicted / left[k].measured) == pytest.approx(refit, rel=1e-6)


def test_a_point_that_alone_decides_a_parameter_has_leverage_one():
    # leverage is the hat matrix's diagonal; a parameter only one point moves is that
    # point's alone (h = 1), where r / (1 - h) has no finite answer and the point is refitted
    from capsim.calibration.crossval import LEVERAGE_CEILING, _leverage

    rng = np.random.default_rng(5)
    jac = np.column_stack([rng.normal(size=6), np.r_[1.0, np.zeros(5)]])
    r = np.full(6, 1e-6)
    h = _leverage(r, jac, np.ones(2), 0.0)
    hat = jac @ np.linalg.pinv(jac.T @ jac) @ jac.T
    assert h == pytest.approx(np.diag(hat), abs=1e-9)
    assert h[0] == pytest.approx(1.0) and h[0] > LEVERAGE_CEILING
    assert all(h[1:] < LEVERAGE_CEILING)


def test_linearised_leave_one_point_out_agrees_with_refitting():
    # the synthetic odd point of the test above: one simulation a parameter instead of a fit
    # a point, and the same predictions within half a percent
    from capsim.calibration.crossval import linearised_cross_validation

    ds = scaled_point(synthetic({"step_overhead_us": 1200.0}), "moe", 1, 1.1)
    fit = ("step_overhead_us",)
    full = fit_profile([ds], CAT, "in-sample", fit, max_evaluations=20)
    refit = cross_validate([ds], CAT, fit, max_evaluations=8, scheme="point")
    levels, points, high, high_levels = linearised_cross_validation([ds], CAT, full.fitted_values)
    assert high == [] and high_levels == []  # eight points, one parameter: none decides it
    assert [(p.scenario, p.concurrency) for p in points] == [
        (p.scenario, p.concurrency) for p in refit
    ]
    for lin, ref in zip(points, refit, strict=True):
        assert lin.error == pytest.approx(ref.error, abs=0.005), (lin, ref)
    odd = next(p for p in points if (p.scenario, p.concurrency) == ("moe", 1))
    assert odd.error == pytest.approx(1 / 1.1 - 1, abs=0.005)
    assert {p.concurrency for p in levels} == {p.concurrency for p in points}


def test_a_profile_applies_the_parameters_it_was_fitted_with_held():
    """consumer-ampere-vllm was fitted with host work in series: it holds
    async_host_overlap at 0, so applying it restores that physics under its fitted values."""
    from capsim.calibration.profiles import find_profile

    profile = find_profile("auto", "consumer-ampere")
    assert profile.held == {"async_host_overlap": 0.0}
    params = profile.params(CAT, "rtx3090")
    assert params.async_host_overlap == 0.0
    assert params.step_overhead_us == pytest.approx(profile.parameters["step_overhead_us"].value)


def test_a_dataset_spanning_hardware_classes_is_split_per_class():
    from capsim.calibration.crossval import group_by_class
    from capsim.calibration.published import load_published

    (mixed,) = [
        ds
        for ds in load_published()
        if len({CAT.gpu(sc.gpu).hardware_class for sc in ds.scenarios}) > 1
    ][:1]
    groups = group_by_class([mixed], CAT)
    assert len(groups) > 1
    for hw_class, parts in groups.items():
        (part,) = parts
        assert part.name == mixed.name
        assert {CAT.gpu(sc.gpu).hardware_class for sc in part.scenarios} == {hw_class}
    assert sum(len(p.scenarios) for ps in groups.values() for p in ps) == len(mixed.scenarios)


def test_profiles_are_fitted_per_hardware_class_and_engine():
    """capsim calibrate fits one profile a (hardware class, engine): llama.cpp's points
    on a class fit another profile than vLLM's, and a dataset spanning both is split."""
    from capsim.calibration.crossval import group_by_class_and_engine, profile_engine
    from capsim.calibration.published import load_published

    corpus = load_published()
    groups = group_by_class_and_engine(corpus, CAT)
    for (hw_class, engine), parts in groups.items():
        for part in parts:
            assert {profile_engine(sc) for sc in part.scenarios} == {engine}
            assert {CAT.gpu(sc.gpu).hardware_class for sc in part.scenarios} == {hw_class}
    engines_of = {}
    for hw_class, engine in groups:
        engines_of.setdefault(hw_class, set()).add(engine)
    assert any({"vllm", "llama.cpp"} <= e for e in engines_of.values())
    assert "other" not in {engine for _, engine in groups}  # simulated as vLLM
    scenarios = sum(len(p.scenarios) for ps in groups.values() for p in ps)
    assert scenarios == sum(len(ds.scenarios) for ds in corpus)


def test_a_level_fold_chooses_its_parameters_from_the_full_fits_simulations(monkeypatch):
    """validate --calibrated: each leave-a-level-out fold chooses what to fit from the rows
    of its own points in the simulations the fit on every point ran for its choice, which
    are the fold's own simulations (a level does not depend on the others simulated): the
    same choice, and none simulated again."""
    from capsim.calibration import least_squares
    from capsim.calibration.crossval import without_level
    from capsim.calibration.fit import Sensitivities, choose_parameters, fit_setup

    ds = scaled_point(synthetic({"step_overhead_us": 1200.0}), "moe", 1, 1.3)
    _, names, base = fit_setup([ds], CAT, None)
    kept = Sensitivities({})
    choose_parameters([ds], CAT, names, base, None, kept, record=True)
    assert len(kept.runs) == len(names) + 1  # the priors, then each candidate moved
    folds = {level: without_level(ds, level) for level in (1, 3)}
    fresh = {level: choose_parameters([f], CAT, names, base, None) for level, f in folds.items()}
    calls = []
    original = least_squares.FitProblem.residuals

    def counted(self, x):
        calls.append(1)
        return original(self, x)

    monkeypatch.setattr(least_squares.FitProblem, "residuals", counted)
    for level, fold in folds.items():
        assert choose_parameters([fold], CAT, names, base, None, kept) == fresh[level]
    assert calls == []
    # points it never simulated are simulated
    other = synthetic({"step_overhead_us": 600.0}).model_copy(update={"name": "another"})
    choose_parameters([other], CAT, names, base, None, kept)
    assert len(calls) == len(names) + 1


def test_validate_calibrated_fits_its_parts_on_every_core_with_the_serial_answer(monkeypatch):
    """validate --calibrated spreads dataset parts over worker processes (one a core, each
    fitting in series); the rows are those of fitting them one after another."""
    from capsim.calibration.part_fits import calibrated_part_rows

    one = scaled_point(synthetic({"step_overhead_us": 1200.0}), "moe", 1, 1.2)
    two = synthetic({"step_overhead_us": 500.0}).model_copy(update={"name": "another"})
    parts, fit = [one, two], ("step_overhead_us",)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    runs = {"pooled": [], "serial": []}  # (part, seconds) of each scenario simulation
    pooled = dict(
        calibrated_part_rows(
            parts, CAT, fit, 0.0, "linearised", None, lambda i, s: runs["pooled"].append((i, s))
        )
    )
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    heard = []
    serial = dict(
        calibrated_part_rows(
            parts,
            CAT,
            fit,
            0.0,
            "linearised",
            heard.append,
            lambda i, s: runs["serial"].append((i, s)),
        )
    )
    assert sorted(pooled) == [0, 1] and heard  # in series, each step is told
    for i in (0, 1):
        assert [r["dataset"] for r in pooled[i]] == [parts[i].name] * 8
        assert pooled[i] == serial[i]  # the same simulations, to the bit
    # every simulation of each part reaches the parent, from the workers too (the pooled
    # parts simulate in fresh processes, the serial ones partly from the kept results)
    for name, heard_runs in runs.items():
        assert {i for i, _ in heard_runs} == {0, 1}, name
        assert all(s >= 0 for _, s in heard_runs)
    assert len(runs["pooled"]) >= len(runs["serial"]) > 2


def test_fit_progress_counts_seconds_of_simulation_and_never_passes_the_total():
    """validate --calibrated's bar (FitProgress): a part's work is its expected
    simulations times the length of its own (the mean of the others before its first),
    held below CAP of that until it finishes, when it becomes what the part took."""
    from capsim.calibration.part_fits import FitProgress, expected_simulations

    one = scaled_point(synthetic({"step_overhead_us": 1200.0}), "moe", 1, 1.2)
    two = synthetic({"step_overhead_us": 500.0}).model_copy(update={"name": "another"})
    work = FitProgress([one, two], ("step_overhead_us",), "linearised")
    expected = [expected_simulations(ds, ("step_overhead_us",), "linearised") for ds in (one, two)]
    assert work.expected == expected and all(n > 0 for n in expected)
    assert work.total() == pytest.approx(sum(expected))  # 1 s a simulation before any
    assert work.completed() == 0
    work.simulated(0, 2.0)
    work.simulated(0, 4.0)  # part 0: 3 s a simulation; part 1 not started takes the mean
    assert work.total() == pytest.approx(3.0 * sum(expected))
    assert work.completed() == pytest.approx(6.0)
    for _ in range(10 * expected[0]):  # far more than expected: held below the total
        work.simulated(0, 3.0)
        assert work.completed() < work.total()
    work.finish(0)
    took = 6.0 + 30.0 * expected[0]
    assert work.completed() == pytest.approx(took)
    assert work.total() == pytest.approx(took + 3.0 * expected[1])
    work.simulated(0, 100.0)  # heard after the part finished (the queue lags): ignored
    assert work.completed() == pytest.approx(took)
    work.simulated(1, 1.0)
    work.finish(1)
    assert work.completed() == pytest.approx(work.total()) == pytest.approx(took + 1.0)


def test_a_scenario_simulated_again_with_the_same_parameters_is_not_run_again(monkeypatch):
    """compare_datasets keeps its recent simulations: the same parameters give the same
    points without simulating; other parameters, another scenario object (a fold's copy)
    or overrides are simulated."""
    import capsim.calibration.compare as compare

    ds = synthetic({})
    calls = []
    real = compare.compare_scenario
    monkeypatch.setattr(
        compare, "compare_scenario", lambda *a, **k: calls.append(a[1].name) or real(*a, **k)
    )
    params = default_efficiency(CAT.gpu("rtx3090"), CAT)
    first = compare.compare_datasets([ds], CAT, params)
    assert calls == ["moe", "dense"]
    again = compare.compare_datasets([ds], CAT, params)
    assert calls == ["moe", "dense"] and again == first
    faster = params.with_overrides({"bandwidth_efficiency": 0.5})
    moved = compare.compare_datasets([ds], CAT, faster)
    assert len(calls) == 4 and [p.predicted for p in moved] != [p.predicted for p in first]
    compare.compare_datasets([ds], CAT, params, overrides={"step_overhead_us": 900.0})
    assert len(calls) == 6
    copy = ds.model_copy(update={"scenarios": [ds.scenarios[0].model_copy()]})
    compare.compare_datasets([copy], CAT, params)
    assert len(calls) == 7


def test_llama_bench_decode_is_simulated_from_an_empty_context():
    """llama-bench's tg test generates from an empty context, apart from its pp test
    (workload decode_context_tokens: 1): Llama 2 7B's decode (32 full-size KV heads) is
    faster there than after the pp512 prompt, and the prompt's figure does not move."""
    from pathlib import Path

    from capsim.calibration.compare import compare_dataset
    from capsim.calibration.published import load_dataset
    from capsim.catalog.loader import load_catalog

    cat = load_catalog()
    root = Path(__file__).resolve().parents[1] / "calibration" / "published"
    ds = load_dataset(root / "corpus-llamacpp-cuda-disc15013-llama2-7b-q4_0-scoreboard.yaml")
    ds = ds.model_copy(update={"scenarios": [s for s in ds.scenarios if s.gpu == "rtx3090"]})
    assert ds.workload.decode_context_tokens == 1
    after_prompt = ds.model_copy(
        update={"workload": ds.workload.model_copy(update={"decode_context_tokens": None})}
    )
    apart = {p.metric: p.predicted for p in compare_dataset(ds, cat)}
    joined = {p.metric: p.predicted for p in compare_dataset(after_prompt, cat)}
    assert apart["prompt_tok_s"] == joined["prompt_tok_s"]
    assert apart["decode_tok_s"] > 1.03 * joined["decode_tok_s"]


def test_fixed_length_batch_rounds_are_simulated_once_with_the_same_figures():
    # every round of fixed lengths starts on an idle engine, so the source's one round
    # gives the figures that EXPECTED_VALUE_ROUNDS rounds gave; drawn lengths keep them
    from capsim.calibration import compare
    from capsim.calibration.compare import EXPECTED_VALUE_ROUNDS, compare_scenario, rounds_for

    assert rounds_for(None, "512", "32") == 1
    assert rounds_for(3, "512", "32") == 3
    assert rounds_for(None, "512", "lognormal:100,0.3") == EXPECTED_VALUE_ROUNDS
    assert rounds_for(None, "uniform:100,200", "32") == EXPECTED_VALUE_ROUNDS
    (ds,) = [d for d in load_published() if d.name.endswith("batched-pp512")]
    sc = min(ds.scenarios, key=lambda s: len(s.points))
    assert compare.scenario_config(ds, sc, [2]).batch_rounds == 1
    once = compare_scenario(ds, sc, CAT)
    many_config = compare.scenario_config(ds, sc, sorted({p.concurrency for p in sc.points}))
    many_config = many_config.model_copy(update={"batch_rounds": EXPECTED_VALUE_ROUNDS})
    from capsim.engine.simulate import predict

    levels = {int(lv.level): lv.metrics for lv in predict(many_config, CAT).levels}
    for p in once:
        assert p.predicted == pytest.approx(
            compare.point_value(levels[p.concurrency], p.metric, p.statistic), rel=1e-9
        )


def test_a_point_refit_fits_what_the_fit_on_every_point_chose(monkeypatch):
    # without --fit, each point's refit fits the parameters of the fit on every point
    # (its start) over the values that fit held, not every candidate of the class, which
    # the remaining points cannot pin down
    from capsim.calibration import crossval
    from capsim.calibration.crossval import leave_one_point_out

    ds = scaled_point(synthetic({"step_overhead_us": 1200.0}), "moe", 1, 1.1)
    full = fit_profile([ds], CAT, "in-sample", ("step_overhead_us",), max_evaluations=20)
    sizes, bases = [], []
    real = crossval.solve

    def spy(problem, x0, *args, **kwargs):
        sizes.append((tuple(problem.names), len(x0)))
        bases.append(problem.base)
        return real(problem, x0, *args, **kwargs)

    monkeypatch.setattr(crossval, "solve", spy)
    held = {"per_sequence_overhead_us": 77.0}
    out = leave_one_point_out(
        [ds], CAT, None, max_evaluations=8, start=full.fitted_values, only=[0], held=held
    )
    assert sizes == [(("step_overhead_us",), 1)]
    assert bases[0].per_sequence_overhead_us == 77.0
    assert len(out) == 1


def test_a_left_out_level_is_predicted_over_its_engine_releases_priors():
    # a fold's fitted values lie over the base it was fitted on: the GPU's defaults with
    # the scenarios' engine release's priors (vLLM 0.7's host loop here), not the newest
    # vLLM's (the dstack vLLM 0.7 folds predicted their left-out levels up to 207% off)
    from capsim.calibration.compare import compare_dataset

    ds = synthetic({})
    old = ds.model_copy(
        update={
            "scenarios": [
                sc.model_copy(update={"engine_version": "0.7.3"}) for sc in ds.scenarios[:1]
            ]
        }
    )
    measured = {(p.scenario, p.concurrency): p.predicted for p in compare_dataset(old, CAT)}
    points = [
        p.model_copy(update={"value": measured[(old.scenarios[0].name, p.concurrency)]})
        for p in old.scenarios[0].points
    ]
    old = old.model_copy(
        update={"scenarios": [old.scenarios[0].model_copy(update={"points": points})]}
    )
    cv = cross_validate([old], CAT, ("bandwidth_efficiency",), max_evaluations=8)
    assert {p.concurrency for p in cv} == {1, 2, 3, 4}
    assert max(abs(p.error) for p in cv) < 0.02, [p.error for p in cv]


def test_validate_calibrated_runs_the_costliest_parts_first():
    # a part's cost is its expected simulations times the tokens a simulation sends: the
    # SGLang cookbook's high-throughput cells (8k prompts, thousands of requests a level)
    # lead, however few their points; a synthetic batch part's cost grows with its prompts
    from capsim.calibration.part_fits import calibration_parts, part_cost

    parts = calibration_parts(load_published(), CAT)
    first = max(parts, key=part_cost)
    assert first.name.startswith("corpus-sglang-cookbook") and first.name.endswith("-ht")
    ds = synthetic({})
    longer = ds.model_copy(
        update={"workload": ds.workload.model_copy(update={"input_tokens": "2048"})}
    )
    assert part_cost(longer) == pytest.approx(part_cost(ds) * (2048 + 200) / (512 + 200))


def test_a_level_that_alone_decides_a_parameter_has_group_leverage_one():
    # a level's leverage is the largest eigenvalue of its block of the hat matrix: 1 when a
    # parameter moves only that level's points (left out, the linear picture has no answer
    # and validate refits the level), below the ceiling for levels sharing the parameters
    from capsim.calibration.crossval import LEVERAGE_CEILING, _group_leverage

    rng = np.random.default_rng(7)
    jac = np.column_stack([rng.normal(size=9), np.r_[1.0, 0.5, 0.0, np.zeros(6)]])
    groups = {1: [0, 1], 2: [2, 3, 4], 4: [5, 6, 7, 8]}
    h = _group_leverage(np.full(9, 1e-6), jac, np.ones(2), 0.0, groups)
    assert h[1] == pytest.approx(1.0) and h[1] > LEVERAGE_CEILING
    assert h[2] < LEVERAGE_CEILING and h[4] < LEVERAGE_CEILING
    hat = jac @ np.linalg.pinv(jac.T @ jac) @ jac.T
    assert h[4] == pytest.approx(np.linalg.eigvalsh(hat[np.ix_([5, 6, 7, 8], [5, 6, 7, 8])]).max())
