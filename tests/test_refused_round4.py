"""The fourth hostile-input round of issue 47, on what came in on 2026-12-02: engine
releases (``--engine sglang@X``) and their generations' batch tiers, the engine fields
``weight_only_formats`` and ``admission_reserve.holds_until_finish``, the fused-MoE
efficiency parameters and ``calibrate-kernels`` fused-MoE datasets. Each bad input is exit 2
(or a CapsimUserError in the Python API) with a line naming the flag, file or field."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from capsim.cli.main import app
from tests.test_refused_leftovers import refused

ROOT = Path(__file__).resolve().parent.parent
DB = ROOT / "hardware_db"
runner = CliRunner()
EXPLAIN = ["explain", "--gpu", "h100-sxm", "--model", "llama-3.1-8b"]


@pytest.mark.parametrize("engine", ["sglang@1!0.4", "vllm@1!0.7", "llama.cpp@1!b6918"])
def test_a_release_of_another_epoch_is_no_release(engine):
    """'1!0.4' is a PEP 440 version above every release: it was predicted as the newest
    release without a note (no generation holds it, and its minor number is not above the
    newest's)."""
    refused([*EXPLAIN, "--engine", engine], "is not a release number of")


@pytest.mark.parametrize(
    "engine, example", [("sglang@", "sglang@0.5.19"), ("llama.cpp@", "llama.cpp@b9174")]
)
def test_no_release_after_the_at_sign_names_one_of_the_engines_own(engine, example):
    """The hint's example was vLLM's 0.7.3 for every engine: 'llama.cpp@0.7.3' is refused."""
    from capsim.catalog.loader import load_catalog

    newest = load_catalog().engine(engine[:-1]).releases.newest
    assert example.endswith(newest)
    refused([*EXPLAIN, "--engine", engine], "names no release", f"e.g. {example}")


@pytest.mark.parametrize(
    "gpu, graphs", [("h20", 160), ("rtx-pro-6000", 160), ("gh200", 160), ("h200", 256)]
)
def test_sglang_04_captures_256_only_above_96_gib(gpu, graphs):
    """SGLang 0.4.6's capture list runs to 256 on gpu_mem > 96 * 1024 MiB; a card sold as
    96 GB reports less (the H20 97,871 MiB) and stays at 160 (the row at 96 GB gave 256)."""
    from capsim.catalog.loader import load_catalog

    cat = load_catalog()
    row = cat.engine("sglang@0.4.6").batch_limits(gpu, cat.gpu(gpu).memory_gb)
    assert row.cuda_graph_max_batch == graphs


def engine_overlay(tmp_path: Path, edit, name: str = "sglang") -> Path:
    """A --db folder holding the built-in engine ``name`` with ``edit`` applied to its
    YAML as a dict."""
    import yaml

    data = yaml.safe_load((DB / "engines" / f"{name}.yaml").read_text())
    edit(data)
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return tmp_path


def tiers(data: dict) -> list:
    """The SGLang 0.4 generation's batch_defaults rows."""
    return next(g for g in data["generations"] if g["versions"] == ">=0.4,<0.5")["batch_defaults"]


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda d: tiers(d).clear(), ["batch_defaults", "at least 1 item"]),  # an IndexError
        (lambda d: tiers(d).reverse(), ["row 1 (min_memory_gb 25) is never used", "row 0"]),
        (lambda d: d["batch_defaults"].reverse(), ["batch_defaults: row 1", "is never used"]),
        (lambda d: tiers(d)[1].update(min_memory_gb=97), ["row 1 (min_memory_gb 97) is never"]),
        (lambda d: tiers(d).pop(), ["the last row (min_memory_gb 25) does not apply to every"]),
        (lambda d: tiers(d)[-1].update(except_gpus=["rtx"]), ["except_gpus rtx) does not apply"]),
        (lambda d: tiers(d)[0].update(min_memory_gb=1e300), ["min_memory_gb", "100000"]),
        (lambda d: tiers(d)[-1].update(max_num_batched_tokens=10**40), ["2147483648"]),
        (lambda d: tiers(d)[-1].update(cuda_graph_max_batch=10**40), ["cuda_graph_max_batch"]),
        (lambda d: d["generations"][1].update(versions=""), ["versions: '' names no range"]),
        (lambda d: d["generations"][1].update(versions=">=0.5,<0.4"), ["holds no release"]),
        (lambda d: d["generations"][1].update(versions=">0.4,<=0.4"), ["holds no release"]),
    ],
)
def test_an_engine_overlay_of_batch_tiers_no_gpu_reads_is_refused(tmp_path, edit, says):
    """Rows are read in order, the first that applies winning: a row after one that covers
    it, a last row that leaves GPUs out (they took it anyway) and a generation of no rows
    (an IndexError traceback) or of a range that holds no release or every one were taken
    without a word; so were counts past the flags' 2**31."""
    db = engine_overlay(tmp_path, edit)
    refused(
        ["--db", str(db), *EXPLAIN, "--engine", "sglang@0.4.6"],
        "sglang.yaml",
        "invalid entry",
        *says,
    )


def test_batch_tiers_that_skip_a_gpu_before_a_wider_row_are_taken(tmp_path):
    """A row that skips a GPU (except_gpus) leaves the next row of the same memory
    reachable, as vLLM's A100 rule does."""
    db = engine_overlay(
        tmp_path, lambda d: tiers(d).insert(0, dict(tiers(d)[0], except_gpus=["h20"]))
    )
    r = runner.invoke(app, ["--db", str(db), *EXPLAIN, "--engine", "sglang@0.4.6"])
    assert r.exit_code == 0, r.output


def test_the_catalogs_count_limit_is_the_flags():
    from capsim.catalog.engine_schema import MAX_ENGINE_COUNT as catalog_limit
    from capsim.engine.limits import MAX_ENGINE_COUNT

    assert catalog_limit == MAX_ENGINE_COUNT


@pytest.mark.parametrize(
    "edit, says",
    [
        (
            lambda d: tiers(d)[-1].update(max_num_seqs=True),
            "generations.1.batch_defaults.4.max_num_seqs: a number, not true",
        ),
        (
            lambda d: d["batch_defaults"][0].update(max_num_seqs="1024"),
            "batch_defaults.0.max_num_seqs: a number, not the text '1024'",
        ),
        (
            lambda d: d["params"].update(triton_attention_layer_us=True),
            "params.triton_attention_layer_us: a number, not true",
        ),
        (
            lambda d: d["generations"][3]["class_params"]["datacenter-cdna3"].update(
                moe_compute_efficiency_8bit=True
            ),
            "class_params.datacenter-cdna3.moe_compute_efficiency_8bit: a number, not true",
        ),
        (lambda d: d["params"].update({"a.b": True}), "params.a.b: a number, not true"),
    ],
)
def test_a_boolean_or_text_for_a_number_in_an_engines_lists_and_maps_is_refused(
    tmp_path, edit, says
):
    """pydantic reads true as 1 and "1024" as 1024: the check that refused them in an
    entry's own fields did not look into lists (batch_defaults rows, generations) or maps
    (params, class_params)."""
    db = engine_overlay(tmp_path, edit)
    refused(["--db", str(db), *EXPLAIN, "--engine", "sglang@0.4.6"], "sglang.yaml", says)


@pytest.mark.parametrize(
    "value, says", [("true", "a number, not true"), ("'128'", "a number, not the text '128'")]
)
def test_a_boolean_or_text_for_an_efficiency_parameter_is_refused(tmp_path, value, says):
    text = (DB / "efficiency" / "datacenter-hopper.yaml").read_text()
    (tmp_path / "efficiency").mkdir()
    (tmp_path / "efficiency" / "datacenter-hopper.yaml").write_text(
        text.replace("params:\n", f"params:\n  moe_gemm_half_width: {value}\n", 1)
    )
    refused(
        ["--db", str(tmp_path), "explain", "--gpu", "h100-sxm", "--model", "mixtral-8x7b"],
        "datacenter-hopper.yaml: params.moe_gemm_half_width",
        says,
    )


@pytest.mark.parametrize(
    "overrides, says",
    [
        ({"moe_gemm_half_width": 0}, "moe_gemm_half_width=0: input should be greater than 0"),
        ({"moe_gemm_half_width": float("nan")}, "moe_gemm_half_width is nan"),
        ({"moe_gemm_half_width": 1e300}, "at most 10,000,000"),
        ({"moe_gemm_half_width": True}, "moe_gemm_half_width is True: an efficiency parameter is"),
        ({"moe_dequant_compute_efficiency": 2.0}, "less than or equal to 1"),
        ({"moe_dequant_bandwidth_efficiency": -1}, "greater than or equal to 0.001"),
        ({"moe_gemm_half_widht": 1.0}, "unknown efficiency parameter 'moe_gemm_half_widht'"),
    ],
)
def test_python_api_efficiency_overrides_out_of_range_are_a_user_error(overrides, says):
    """A bad override reached the simulation and ended in a pydantic ValidationError or a
    ValueError (predict, capacity, validate); True was taken as 1."""
    import capsim

    with pytest.raises(capsim.CapsimUserError, match="efficiency_overrides") as info:
        capsim.predict(
            gpu="h100-sxm", model="mixtral-8x7b", concurrency=[1], efficiency_overrides=overrides
        )
    assert says in str(info.value)
    with pytest.raises(capsim.CapsimUserError, match=r"^overrides: ") as info:
        capsim.validate(overrides=overrides)
    assert says in str(info.value)


def test_an_unknown_override_gets_did_you_mean():
    import capsim

    with pytest.raises(capsim.CapsimUserError) as info:
        capsim.validate(overrides={"moe_gemm_half_widht": 1.0})
    assert "moe_gemm_half_width" in info.value.suggestions


@pytest.mark.parametrize(
    "name",
    [
        "moe_gemm_half_width=100",
        "moe_gemm_half_rows=50",
        "moe_dequant_compute_efficiency=0.5",
        "moe_dequant_bandwidth_efficiency=0.5",
    ],
)
def test_explain_refuses_a_routed_expert_parameter_for_a_dense_model(name):
    """predict refused these (they change no step), explain took them without a word: the
    fused-MoE terms of 2026-12-02 were missing from the MoE-only parameters."""
    refused([*EXPLAIN, "--set", name], f"--set {name.split('=')[0]} applies to models with")


KERNELS = ROOT / "calibration" / "kernels"


def moe_dataset(tmp_path: Path, edit) -> Path:
    """The stored Hopper fused-MoE timings with ``edit`` applied, as a file."""
    import json

    data = json.loads((KERNELS / "hopper-fused-moe-public.json").read_text())
    edit(data)
    path = tmp_path / "moe.json"
    path.write_text(json.dumps(data))
    return path


def row0(**fields):
    return lambda d: d["rows"][0].update(fields)


@pytest.mark.parametrize(
    "edit, says",
    [
        (row0(model="llama-3.1-8b"), ["rows.0.model: llama-3.1-8b has no routed experts"]),
        (row0(gpu="h100-sxmm"), ["rows.0.gpu: unknown gpu 'h100-sxmm'"]),
        (row0(model="qwen3-30b-a3bb"), ["rows.0.model: unknown model"]),
        (row0(weights="fp88"), ["rows.0.weights: unknown quant format 'fp88'"]),
        (row0(tp_shard=3), ["rows.0.tp_shard: tensor parallel size 3 does not divide"]),
        (row0(gpu="a100-80gb"), ["rows.1.gpu: h100-sxm is a datacenter-hopper GPU, and row 0"]),
        (row0(source=99), ["row 0 names source 99, and the file lists 4 source(s)"]),
        (lambda d: d.update(sources=[]), ["sources: List should have at least 1 item"]),
        (lambda d: d["rows"].append(dict(d["rows"][0])), ["rows 0 and 40 are the same"]),
        (row0(batch=True), ["rows.0.batch: Input should be a valid integer"]),
        (row0(us="40"), ["rows.0.us: Input should be a valid number"]),
        (row0(us=1e-300), ["rows.0.us: Input should be greater than or equal to 1"]),
        (lambda d: d.update(name="\x1b]0;x\x07"), ["name: holds a control character"]),
        (lambda d: d["caveats"].append("\x1b[2J"), ["caveats: holds a control character"]),
        (lambda d: d.update(kind="fused_moee"), ["kind 'fused_moee' is no kind", "fused_moe"]),
    ],
)
def test_a_fused_moe_dataset_the_step_model_cannot_time_is_refused(tmp_path, edit, says):
    """A dense model ended in a ValueError traceback; a row's unknown GPU, a TP shard
    that does not divide the model or another hardware class was refused without naming
    the file or the row; a source index past the sources, a duplicate row, a boolean or
    text for a number and a time of 1e-300 us (a MAPE of 1e300%) were fitted; an escape
    sequence in the name reached the terminal; a mistyped kind was read as a layer dataset
    and listed 360 missing fields."""
    path = moe_dataset(tmp_path, edit)
    refused(["calibrate-kernels", str(path)], *says)


def test_a_layer_dataset_name_of_control_characters_is_refused(tmp_path):
    import json

    data = json.loads((KERNELS / "h100-sxm-decode-layers.json").read_text())
    data["name"] = "\x1b[2Jx"
    path = tmp_path / "layers.json"
    path.write_text(json.dumps(data))
    refused(["calibrate-kernels", str(path)], "name: holds a control character")


def test_a_fused_moe_dataset_of_more_shapes_than_a_fit_can_build_is_refused(tmp_path, monkeypatch):
    """A fit builds a step model for each (GPU, model, weights, tp_shard) at every
    evaluation: 5,000 shapes took two minutes. The stored file holds 5."""
    import capsim.calibration.moe_kernels as moe

    monkeypatch.setattr(moe, "MAX_MOE_SHAPES", 4)
    path = moe_dataset(tmp_path, lambda d: None)
    refused(["calibrate-kernels", str(path)], "more than 4 shapes", "split the file")


def test_every_stored_fused_moe_dataset_passes_the_row_checks():
    from capsim.calibration.moe_kernels import MAX_MOE_SHAPES, check_moe_rows, load_moe_dataset
    from capsim.catalog.loader import load_catalog

    cat = load_catalog()
    for path in sorted(KERNELS.glob("*fused-moe*.json")):
        ds = load_moe_dataset(path)
        check_moe_rows(ds, cat, path)
        assert len({(r.gpu, r.model, r.weights, r.tp_shard) for r in ds.rows}) <= MAX_MOE_SHAPES


@pytest.mark.parametrize(
    "edit, says",
    [
        (
            lambda d: d.update(weight_formats=["bf16", "fp16"], weight_only_formats=["mxfp4"]),
            "weight_only_formats: 'mxfp4' is a format sglang does not load (weight_formats)",
        ),
        (
            lambda d: d.update(weight_formats=["bf16", "awq-int4"], auto_formats=["fp8"]),
            "auto_formats: 'fp8' is a format sglang does not load",
        ),
        (
            lambda d: d["batch_defaults"].insert(
                0, dict(d["batch_defaults"][0], except_gpus=["a10O"])
            ),
            "batch_defaults.0.except_gpus: 'a10O' begins no GPU's name",
        ),
        (
            lambda d: tiers(d).insert(0, dict(tiers(d)[0], except_gpus=["h2O"])),
            "generations.1.batch_defaults.0.except_gpus: 'h2O' begins no GPU's name",
        ),
    ],
)
def test_an_engine_entry_that_would_never_apply_is_refused(tmp_path, edit, says):
    """A weight_only_formats or auto_formats entry the engine does not load (--quant
    refuses it, --quant auto skips it) and an except_gpus prefix of no GPU changed nothing,
    without a word."""
    db = engine_overlay(tmp_path, edit)
    refused(["--db", str(db), *EXPLAIN, "--engine", "sglang@0.4.6"], "sglang.yaml", says)
