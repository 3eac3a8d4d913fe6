"""Values a file or a flag states that the physics cannot take are refused where they are
read, naming the file, field or flag (issue 47's fourth audit): efficiency shares and
power exponents, a calibration profile's spreads, correlations and values, a dataset's
scenarios and flags, and the cache folder keeps the files that are not capsim's."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from capsim.calibration.profiles import find_profile, profiles_dir
from capsim.cli.main import app

PROFILE = profiles_dir() / "consumer-ampere-vllm.yaml"
PREDICT = ["predict", "--gpu", "rtx3090", "--model", "llama-3.1-8b", "-c", "2"]
PREDICT += ["--output-tokens", "16", "--requests", "4"]


def run(args, **env):
    return CliRunner().invoke(app, args, env=env or None)


def test_an_efficiency_share_below_a_thousandth_or_a_power_exponent_past_3_is_refused():
    out = run([*PREDICT, "--set", "bandwidth_efficiency=1e-300"])
    assert out.exit_code == 2 and "greater than or equal to 0.001" in out.output, out.output
    out = run([*PREDICT, "--power-limit", "300", "--set", "compute_power_exponent=1e7"])
    assert out.exit_code == 2 and "compute_power_exponent" in out.output, out.output
    assert "Traceback" not in out.output
    assert run([*PREDICT, "--set", "bandwidth_efficiency=0.002"]).exit_code == 0


def mended_profile(tmp_path, mend) -> str:
    data = yaml.safe_load(PROFILE.read_text())
    mend(data)
    path = tmp_path / "mended.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def first_parameter(data) -> dict:
    return next(iter(data["parameters"].values()))


MENDS = {
    "a correlation of NaN": lambda d: d.update(
        correlation={a: {b: float("nan")} for a, b in [list(d["parameters"])[:2]]}
    ),
    "a correlation of 7": lambda d: d.update(
        correlation={a: {b: 7.0} for a, b in [list(d["parameters"])[:2]]}
    ),
    "a spread of 1e300": lambda d: d.update(log_residual_sd=1e300),
    "a cross-validated spread of -5": lambda d: d.update(cv_log_residual_sd=-5.0),
    "an unknown metric family": lambda d: d.update(metric_log_sd={"bogus": 0.1}),
    "an infinite standard error": lambda d: first_parameter(d).update(std=float("inf")),
    "a value outside its own bounds": lambda d: first_parameter(d).update(value=1e-300),
    "an unknown parameter": lambda d: d["held"].update(bogus_us=3.0),
}


def test_a_profile_that_states_what_cannot_be_is_a_user_error(tmp_path):
    assert len(yaml.safe_load(PROFILE.read_text())["parameters"]) >= 2
    for what, mend in MENDS.items():
        out = run([*PREDICT, "--profile", mended_profile(tmp_path, mend)])
        assert out.exit_code == 2, (what, out.output)
        assert "mended.yaml" in out.output and "Traceback" not in out.output, (what, out.output)


def test_profile_auto_checks_the_class_of_the_file_it_finds(tmp_path):
    """A file named for the H100's class that holds the RTX 3090's profile was applied."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "datacenter-hopper-vllm.yaml").write_text(PROFILE.read_text())
    out = run(
        ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "-c", "1"],
        CAPSIM_PROFILE_DIR=str(folder),
    )
    assert out.exit_code == 2 and "consumer-ampere" in out.output, out.output
    assert find_profile("auto", "consumer-ampere") is not None  # the shipped one still serves


def test_the_cache_prunes_only_its_own_files(tmp_path, monkeypatch):
    """CAPSIM_CACHE_DIR may name a folder of the user's: files there that match capsim's
    prefixes but not its key-named files are kept (three of six were deleted)."""
    folder = tmp_path / "cache"
    folder.mkdir()
    mine = [folder / f"{kind}-notes{i}.json" for kind in ("catalog", "profile") for i in range(6)]
    for path in mine:
        path.write_text("the user's")
    out = run([*PREDICT], CAPSIM_CACHE_DIR=str(folder))
    assert out.exit_code == 0, out.output
    assert all(path.read_text() == "the user's" for path in mine)
    assert any(p.name not in {m.name for m in mine} for p in folder.iterdir())  # it cached


def dataset_with(tmp_path, mend) -> str:
    from capsim.calibration.published import published_dir

    source = published_dir() / "corpus-accelmark-llama31-8b-sharegpt-c8-a100.yaml"
    data = yaml.safe_load(source.read_text())
    mend(data, data["scenarios"][0])
    path = tmp_path / "mended-dataset.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


DATASET_MENDS = {
    "the same scenario twice": (lambda d, s: d["scenarios"].append(s), "listed twice"),
    "an unknown server flag": (lambda d, s: s["flags"].update(bogus=1), "unknown server flag"),
    "max_num_seqs 2.5": (lambda d, s: s["flags"].update(max_num_seqs=2.5), "whole number"),
    "a NaN mean output": (lambda d, s: s.update(output_mean_tokens=float("nan")), "finite"),
    "a KV cache of 1e18": (lambda d, s: s.update(kv_capacity_tokens=10**18), "less than"),
    "acceptance without a drafter": (lambda d, s: s.update(spec_acceptance=0.7), "without"),
    "a measured 1e-300": (lambda d, s: s["points"][0].update(value=1e-300), "greater than"),
    "a power limit of -100 W": (lambda d, s: s.update(power_limit_w=-100.0), "power_limit_w"),
    "tp 16384": (lambda d, s: s.update(tp=16384), "tp"),
}


def test_a_dataset_that_states_what_cannot_be_is_named_in_the_error(tmp_path):
    for what, (mend, words) in DATASET_MENDS.items():
        out = run(["validate", dataset_with(tmp_path, mend)])
        assert out.exit_code == 2, (what, out.output)
        assert words in out.output and "Traceback" not in out.output, (what, out.output)
        assert "--power-limit" not in out.output and "--tp" not in out.output, (what, out.output)


def test_calibrate_refuses_a_fit_that_misses_by_more_than_any_calibration_bridges(tmp_path):
    """Measurements 1e7 times the simulation's (a unit slip): the fit's log spread (16) is
    past what a profile may hold, so calibrate says so instead of writing a profile that
    capsim would then refuse to read."""
    from capsim.calibration.published import published_dir

    data = yaml.safe_load(
        (published_dir() / "corpus-client-rtx3090-llamacpp-vulkan.yaml").read_text()
    )
    for scenario in data["scenarios"]:
        for point in scenario["points"]:
            point["value"] = min(point["value"] * 1e7, 1e12)
    path = tmp_path / "off.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    out = run(["calibrate", str(path), "--out", str(tmp_path / "profiles")])
    assert out.exit_code == 2 and "no calibration bridges" in out.output, out.output
    assert not list((tmp_path / "profiles").glob("*.yaml"))


def test_a_cache_folder_of_only_spaces_counts_as_unset(tmp_path, monkeypatch):
    """CAPSIM_CACHE_DIR='  ' made a folder named two spaces in the current directory and
    filled it (issue 47's fuzzing); CAPSIM_DB of spaces was already read as unset."""
    from capsim.catalog.cache import cache_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CAPSIM_CACHE_DIR", "  ")
    assert cache_dir().name == "capsim" and cache_dir().is_absolute()
    monkeypatch.setenv("CAPSIM_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"


def test_a_relative_cache_folder_is_ignored_with_a_note(tmp_path, monkeypatch):
    """CAPSIM_CACHE_DIR=rel/cache made a cache folder in whatever directory each command
    ran from; a relative path is ignored with a note (as XDG's variables are), '~' is the
    home folder (it made a folder named '~')."""
    from capsim.catalog.cache import cache_dir
    from capsim.notices import take_notices

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the fallback: not the real one
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home" / ".cache"))
    take_notices()
    monkeypatch.setenv("CAPSIM_CACHE_DIR", "rel/cache")
    assert cache_dir().is_absolute() and cache_dir().name == "capsim"
    assert any("not an absolute path" in n for n in take_notices())
    out = run([*PREDICT], CAPSIM_CACHE_DIR="rel/cache")
    assert out.exit_code == 0 and "not an absolute path" in out.output, out.output
    assert not (tmp_path / "rel").exists()
    monkeypatch.setenv("CAPSIM_CACHE_DIR", "~/capsim-cache")
    assert cache_dir() == tmp_path / "home" / "capsim-cache"
