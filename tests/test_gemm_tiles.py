"""Block-FP8 dense GEMMs on a one-tile kernel (physics/gemm_tiles.py): hand-computed cases,
where the term applies, and its invariants."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capsim.catalog.hf_import import model_from_hf_config
from capsim.catalog.loader import load_catalog
from capsim.physics.deployment import Deployment, default_efficiency
from capsim.physics.gemm_tiles import dense_gemms, gemm_blocks, wave_share
from capsim.physics.step import StepModel

CATALOG = load_catalog()
DATA = Path(__file__).parent / "data"


def tiled(gpu="h200", model="deepseek-r1", quant="fp8", tp=8, tile=128.0):
    g = CATALOG.gpu(gpu)
    params = default_efficiency(g, CATALOG)
    if tile is not None:
        params = params.with_overrides({"block_fp8_gemm_tile_columns": tile})
    return StepModel(g, CATALOG.model(model), CATALOG.quant(quant), Deployment(tp=tp), params)


def test_wave_share_by_hand():
    assert wave_share(17, 132) == pytest.approx(17 / 132)
    assert wave_share(132, 132) == 1.0
    # 288 blocks on 132 multiprocessors: three waves, the last a fifth full
    assert wave_share(288, 132) == pytest.approx(288 / 396)
    assert gemm_blocks(2112, 1, 128) == 17
    assert gemm_blocks(2112, 129, 128) == 34  # a second row of tiles from 129 rows


def test_deepseek_gemms_at_tp8_by_hand():
    """DeepSeek-R1 at TP 8: the q/kv down-projection whole on every GPU (1,536 + 512 + 64
    columns), the rest split eight ways."""
    gemms = {g.name: g for g in dense_gemms(CATALOG.model("deepseek-r1"), 8, 8)}
    assert gemms["q/kv down-projection"].columns == 2112
    assert gemms["q/kv down-projection"].weights == 2112 * 7168 * 61
    assert gemms["q up-projection"].columns == 128 * 192 // 8
    assert gemms["o projection"].columns == 7168
    assert gemms["dense FFN gate-up"].weights == 2 * (18432 // 8) * 7168 * 3
    assert gemms["shared expert gate-up"].columns == 2 * 2048 // 8
    assert gemms["shared expert down"].weights == 7168 * 256 * 58
    # each takes its bits from its weight group (memory.weight_bytes's parts)
    assert {g.part for g in gemms.values() if g.name.startswith("shared")} == {"experts"}
    assert {g.part for g in gemms.values() if g.name.startswith("dense")} == {"mlp"}
    assert gemms["o projection"].part == "attention"


def test_one_gemm_extra_time_by_hand():
    """The q/kv down-projection alone: 15.1 MB a layer at 17 / 132 of the H200's
    bandwidth share, less the time at the full share."""
    sm = tiled()
    gemm, size = next((g, b) for g, b in sm.block_fp8_gemms if g.name == "q/kv down-projection")
    assert size == pytest.approx(2112 * 7168 * 61 * CATALOG.quant("fp8").bits_per_weight / 8)
    expected = size * (132 / 17 - 1) / sm.dense_bw
    others = sum(
        b * (1 / wave_share(gemm_blocks(g.columns, 4, 128), 132) - 1)
        for g, b in sm.block_fp8_gemms
        if g is not gemm
    )
    assert sm.block_fp8_tile_seconds(4) == pytest.approx(expected + others / sm.dense_bw)
    # in the step: the decode step's dense-weight time grows by exactly the term
    plain = tiled(tile=None)
    with_tiles = sm.step([1] * 4, [500] * 4)
    without = plain.step([1] * 4, [500] * 4)
    assert with_tiles.t_block_fp8_tiles == pytest.approx(sm.block_fp8_tile_seconds(4))
    assert with_tiles.t_dense_memory - without.t_dense_memory == pytest.approx(
        with_tiles.t_block_fp8_tiles
    )


@pytest.mark.parametrize(
    "gpu, model, quant, why",
    [
        ("h200", "llama-3.1-8b", "fp8", "per-tensor FP8: no block-scaled release"),
        ("h200", "deepseek-r1", "awq-int4", "not FP8"),
        ("h20-3e", "deepseek-r1", "fp8", "multiprocessors unknown"),
    ],
)
def test_the_term_applies_only_where_every_fact_is_known(gpu, model, quant, why):
    tp = 8 if model == "deepseek-r1" else 1
    sm = tiled(gpu, model, quant, tp=tp)
    assert sm.block_fp8_gemms == [], why
    assert sm.block_fp8_tile_seconds(1) == 0.0


def test_engine_releases_set_the_tile():
    """vLLM's PyPI wheels ran CUTLASS's one-tile kernel on Hopper from 0.8 to 0.19; 0.20
    vendored DeepGEMM; SGLang is not this kernel."""

    def tile(engine):
        params = default_efficiency(CATALOG.gpu("h200"), CATALOG, CATALOG.engine(engine))
        return params.block_fp8_gemm_tile_columns

    assert tile("vllm@0.11.0") == 128
    assert tile("vllm@0.19.1") == 128
    assert tile("vllm@0.24.0") is None
    assert tile("vllm@0.7.3") is None  # the early DeepSeek generation holds its kernels
    assert tile("sglang") is None


def test_importing_a_block_fp8_config_keeps_its_block():
    import json

    path = DATA / "hf_configs_catalog" / "deepseek-ai--DeepSeek-V3" / "config.json"
    model = model_from_hf_config(json.loads(path.read_text()), "dsv3-import")
    assert model.dtype == "fp8"
    assert model.fp8_weight_block == 128
    assert CATALOG.model("deepseek-v3").fp8_weight_block == 128


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.integers(min_value=1, max_value=20_000),
    tp=st.sampled_from([1, 2, 4, 8]),
    gpu=st.sampled_from(["h100-sxm", "h200", "h20"]),
)
def test_the_term_is_never_negative_and_vanishes_when_the_waves_are_full(tokens, tp, gpu):
    sm = tiled(gpu, "deepseek-r1", "fp8", tp=tp)
    extra = sm.block_fp8_tile_seconds(tokens)
    assert extra >= 0.0 and math.isfinite(extra)
    sms = CATALOG.gpu(gpu).sm_count
    full = all(gemm_blocks(g.columns, tokens, 128) % sms == 0 for g, _ in sm.block_fp8_gemms)
    assert (extra == 0.0) == full


def test_explain_names_the_term():
    import json

    from typer.testing import CliRunner

    from capsim.cli.main import app

    args = ["explain", "--gpu", "h200", "--model", "deepseek-r1", "--tp", "8", "--batch", "4"]
    runner = CliRunner()
    old = runner.invoke(app, [*args, "--engine", "vllm@0.11.0"], env={"COLUMNS": "200"})
    assert old.exit_code == 0, old.output
    words = " ".join(old.output.split())
    assert "block-FP8 GEMMs' idle" in words and "132 multiprocessors" in words
    shown = json.loads(runner.invoke(app, [*args, "--engine", "vllm@0.11.0", "--json"]).output)
    assert shown["efficiency"]["block_fp8_gemm_tile_columns"] == 128
    assert shown["decode"]["t_block_fp8_tiles"] == pytest.approx(tiled().block_fp8_tile_seconds(4))
    new = runner.invoke(app, [*args, "--json"])
    assert json.loads(new.output)["decode"]["t_block_fp8_tiles"] == 0.0


@pytest.mark.parametrize(
    "quant, block",
    [
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, 128),
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, None),  # per-tensor
        ({"quant_method": "fp8", "weight_block_size": [1, 128]}, None),  # not square
        ({"quant_method": "fp8", "weight_block_size": [True, True]}, None),
        ({"quant_method": "awq", "weight_block_size": [128, 128]}, None),
    ],
)
def test_the_block_is_read_only_from_a_square_fp8_block(quant, block):
    from capsim.catalog.hf_quant import fp8_weight_block_of_config

    assert fp8_weight_block_of_config({"quantization_config": quant}) == block
