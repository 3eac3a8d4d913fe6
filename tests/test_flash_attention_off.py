"""llama.cpp without flash attention (its default before b6327, and -fa off since): the
attention scores are written to memory as a matrix and read back (physics/score_terms.py):
attention_score_bytes a score where a layer's scores outgrow the L2, and every query scored
against every cached token."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from capsim.calibration.compare import scenario_config
from capsim.calibration.published import load_dataset
from capsim.catalog.loader import load_catalog
from capsim.cli.main import app
from capsim.engine.setup import engine_deployment
from capsim.physics.deployment import default_efficiency
from capsim.physics.score_terms import score_elements
from capsim.physics.step import build_step_model

CAT = load_catalog()
PUBLISHED = Path(__file__).resolve().parent.parent / "calibration" / "published"
RUNNER = CliRunner()


def step_model(gpu: str = "a100-80g-pcie", engine: str = "llama.cpp", **dep):
    eng, g, m = CAT.engine(engine), CAT.gpu(gpu), CAT.model("llama-3.1-8b")
    deployment = engine_deployment(eng, g, tp=1, quant="fp16", max_num_seqs=4, **dep)
    return build_step_model(CAT, g, m, deployment, default_efficiency(g, CAT, eng))


def test_score_cells_by_hand():
    # one 4,096-token prompt in passes of 512: pass i scores 512 queries against 512 (i + 1)
    # cells, 512^2 x (1 + ... + 8) = 9,437,184 = 4,096 x (4,096 - (4,096 - 512) / 2)
    assert score_elements(4096, 4096, 8) == 512 * 512 * 36 == 9_437_184
    # one pass over cached context: every query against every cell (no causal halving)
    assert score_elements(512, 1024 + 512, 1) == 512 * 1536
    # four decoding sequences in one unified cache: each query against all 4 x 1,001 cells
    assert score_elements(4, 4 * 1001, 1) == 4 * 4004
    assert score_elements(0, 100, 1) == 0.0


def test_a_long_prompt_moves_its_scores_through_dram():
    """Hand-computed for Llama-3.1-8B (32 heads, 32 layers) on an A100 80GB PCIe (40 MB
    L2): a 4,096-token prompt in 8 passes scores 9,437,184 cells a head and layer, a pass's
    tensor is 9,437,184 / 8 x 32 heads x 4 B = 151 MB, so 1 - 40 / 151 of the 20 B a
    score moves reaches DRAM, at the elementwise kernels' bandwidth."""
    sm = step_model(flash_attention=False)
    assert sm.params.attention_score_bytes == 20.0
    step = sm.step([4096], [0])
    spill = 1.0 - 40e6 / (9_437_184 / 8 * 32 * 4)
    expected = 9_437_184 * 32 * 32 * 20.0 * spill
    assert step.score_bytes == pytest.approx(expected, rel=1e-12)
    assert step.t_scores == pytest.approx(expected / sm.elementwise_bw, rel=1e-12)
    assert step.t_scores > 0.1  # over 100 ms on a 0.4-0.5 s prompt: the pp4096 drop
    on = step_model(flash_attention=True).step([4096], [0])
    assert on.score_bytes == 0.0 and on.t_scores == 0.0
    assert step.t_total > on.t_total + step.t_scores * 0.9


def test_a_short_prompt_keeps_its_scores_in_a_large_l2_but_scores_every_cell():
    """pp512 of a 32-head model: 512 x 512 x 32 x 4 B = 33.5 MB, inside an RTX 4090's
    72 MB L2 (no DRAM traffic), not inside an RTX 3090's 6 MB; either way the attention
    FLOPs count all 512 x 512 pairs, not the 512 x 513 / 2 causal ones."""
    big = step_model("rtx4090", flash_attention=False).step([512], [0])
    small = step_model("rtx3090", flash_attention=False).step([512], [0])
    fused = step_model("rtx4090", flash_attention=True).step([512], [0])
    assert big.score_bytes == 0.0 and big.t_scores == 0.0
    assert small.score_bytes == pytest.approx(512 * 512 * 32 * 32 * 20 * (1 - 6e6 / 33_554_432))
    assert big.attention_flops / fused.attention_flops == pytest.approx(
        512 * 512 / (512 * 513 / 2), rel=1e-9
    )


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(st.integers(1, 3000), min_size=1, max_size=5),
    context=st.lists(st.integers(0, 20_000), min_size=5, max_size=5),
)
def test_without_flash_attention_no_step_is_faster_and_the_hot_path_agrees(tokens, context):
    """Invariants: a step without flash attention is never shorter than with it, and the
    simulation's scalar path (scheduled_step_time) equals the breakdown's total."""
    off, on = step_model(flash_attention=False), step_model(flash_attention=True)
    n = np.array(tokens, dtype=float)
    c = np.array(context[: len(tokens)], dtype=float)
    assert off.step_time(n, c) >= on.step_time(n, c) * (1 - 1e-12)
    assert off.scheduled_step_time(n, c) == pytest.approx(off.step(n, c).t_total, rel=1e-9)
    assert not off.takes_moments  # the L2's share is not affine in context


@pytest.mark.parametrize(
    ("release", "fused"),
    [
        ("llama.cpp@b2824", False),
        ("llama.cpp@b5863", False),
        ("llama.cpp@b6326", False),
        ("llama.cpp@b6327", True),
        ("llama.cpp@b9174", True),
        ("llama.cpp", True),
        ("vllm", True),
        ("sglang", True),
    ],
)
def test_the_releases_that_run_without_flash_attention(release, fused):
    eng = CAT.engine(release)
    assert eng.flash_attention is fused
    assert step_model("rtx3090", engine=release).scores_materialized is (not fused)


def test_metal_and_vulkan_move_16_bytes_a_score():
    """Metal's V x scores product reads the F32 scores (kernel_mul_mm_f16_f32), without
    CUDA's F16 copy: 4 + 4 + 4 + 4 B."""
    eng, g = CAT.engine("llama.cpp"), CAT.gpu("apple-m2-max")
    assert default_efficiency(g, CAT, eng).attention_score_bytes == 16.0
    # Vulkan's F16 x F32 matmul pipeline reads them too; CUDA (and ROCm's HIP build of it)
    # converts them to an F16 copy first
    vulkan, cuda = CAT.engine("llama.cpp:vulkan"), CAT.engine("llama.cpp")
    assert default_efficiency(CAT.gpu("rtx3090"), CAT, vulkan).attention_score_bytes == 16.0
    assert default_efficiency(CAT.gpu("rtx3090"), CAT, cuda).attention_score_bytes == 20.0


def test_the_flag_and_its_errors():
    base = ["explain", "--gpu", "rtx3090", "--model", "llama-3.1-8b", "--quant", "gguf-q4_k_m"]
    off = RUNNER.invoke(app, [*base, "--engine", "llama.cpp", "--flash-attn", "off"])
    assert off.exit_code == 0, off.output
    assert "flash attention off (--flash-attn off)" in " ".join(off.output.split())
    old = RUNNER.invoke(app, [*base, "--engine", "llama.cpp@b2824"])
    assert "default before b6327" in " ".join(old.output.split())
    auto = RUNNER.invoke(app, [*base, "--engine", "llama.cpp@b2824", "--flash-attn", "auto"])
    assert "default before b6327" in " ".join(auto.output.split())
    on = RUNNER.invoke(app, [*base, "--engine", "llama.cpp@b2824", "--flash-attn", "on"])
    assert "flash attention off" not in " ".join(on.output.split())
    vllm = RUNNER.invoke(app, [*base[:-2], "--engine", "vllm", "--flash-attn", "off"])
    assert vllm.exit_code == 2
    assert "--flash-attn is llama.cpp's" in " ".join(vllm.output.split())
    typo = RUNNER.invoke(app, [*base, "--engine", "llama.cpp", "--flash-attn", "of"])
    assert typo.exit_code == 2
    assert "not on, off or auto" in typo.output and "off" in typo.output
    assert "Traceback" not in typo.output


def test_a_scenario_records_what_the_source_ran():
    ds = load_dataset(PUBLISHED / "corpus-llamacpp-vulkan-disc10879-llama2-7b-q4_0-scoreboard.yaml")
    by_name = {sc.name: sc for sc in ds.scenarios}
    off = scenario_config(ds, by_name["rtx3090-llama-2-7b-gguf-q4_0-llamacpp-vulkan-fa0"], [1])
    on = scenario_config(ds, by_name["rtx3090-llama-2-7b-gguf-q4_0-llamacpp-vulkan-fa1"], [1])
    assert off.flash_attention is False and on.flash_attention is True
