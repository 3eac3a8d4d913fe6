"""Kernel-level decode measurements (calibration/kernels) against the step model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from capsim.calibration.kernels import (
    KernelRow,
    compare_kernels,
    fit_kernel_params,
    load_kernel_dataset,
    mape,
    measured_step_us,
    usable,
)
from capsim.catalog.loader import load_catalog
from capsim.physics.step import Deployment, build_step_model, default_efficiency

CAT = load_catalog()
H100 = Path(__file__).resolve().parents[1] / "calibration/kernels/h100-sxm-decode-layers.json"


@pytest.fixture(scope="module")
def h100():
    return load_kernel_dataset(H100)


def hopper_params_with(**overrides):
    return default_efficiency(CAT.gpu("h100-sxm"), CAT).with_overrides(overrides)


def row(**kw) -> KernelRow:
    base = dict(
        model="llama-3.1-8b",
        weights="bf16",
        tp_shard=1,
        batch=1,
        context=16,
        layers_built=8,
        us_per_layer=100.0,
        lm_head_us=50.0,
        weight_bytes_per_layer=1.0,
        kv_bytes_per_layer=1.0,
        achieved_gb_s=1.0,
        run=0,
    )
    return KernelRow(**{**base, **kw})


def test_dataset_has_provenance_and_both_formats(h100):
    assert h100.source["script"] == "benchmarks/gpu/decode_layers.py"
    assert h100.runs[0]["device"] == "NVIDIA H100 80GB HBM3"
    assert {r.weights for r in h100.rows} == {"bf16", "fp8"}
    assert {r.tp_shard for r in h100.rows} == {1, 2, 4, 8}


def test_whole_model_time_is_layers_times_per_layer_plus_lm_head():
    # llama-3.1-8b has 32 decoder layers: 32 x 100 + 50 us
    assert measured_step_us(row(), CAT) == pytest.approx(3250.0)


def test_attention_rows_without_enough_blocks_are_left_out(h100):
    # 132 multiprocessors; llama-3.1-8b at TP=8 keeps one KV head per GPU
    assert usable(row(tp_shard=8, batch=64, context=32768), h100, CAT) is False
    assert usable(row(tp_shard=8, batch=256, context=32768), h100, CAT) is True
    assert usable(row(tp_shard=8, batch=1, context=16), h100, CAT) is True


def test_kernel_seconds_is_the_step_without_host_overheads_and_communication():
    # async scheduling off: host work then adds to the step rather than hiding under it
    dep = Deployment(tp=2, quant="bf16", async_scheduling=False)
    sm = build_step_model(CAT, "h100-sxm", "llama-3.3-70b", dep)
    new, ctx = np.ones(64, dtype=int), np.full(64, 2048)
    bd = sm.step(new, ctx)
    p = sm.params
    host = (p.step_overhead_us + 64 * p.per_sequence_overhead_us) * 1e-6
    kernels = sm.kernel_seconds(new, ctx)
    assert kernels == pytest.approx(bd.t_total - host - bd.t_communication)
    # batch 1, no context: weight bytes over the weight bandwidth plus the kernel floor
    one = sm.kernel_seconds(np.ones(1, dtype=int), np.zeros(1))
    floor = 80 * p.layer_overhead_graph_us * 1e-6
    assert one == pytest.approx(sm.dense_weight_bytes / sm.dense_bw + floor, rel=0.02)


def test_hopper_class_defaults_reproduce_the_h100_measurements(h100):
    points = compare_kernels(h100, CAT)
    assert len(points) == 262
    assert mape(points) < 8.0
    assert max(abs(p.error) for p in points) < 0.30


def test_fit_recovers_the_class_file_and_beats_generic_priors(h100):
    fit = fit_kernel_params(h100, CAT)
    defaults = CAT.efficiency.entries["datacenter-hopper"].params
    for name, value in fit.values.items():
        assert value == pytest.approx(defaults[name], abs=max(3 * fit.std[name], 0.01))
    # a wrong prior makes the error worse: the fit does something
    worse = compare_kernels(
        h100, CAT, hopper_params_with(bandwidth_efficiency=0.5, layer_overhead_graph_us=0.0)
    )
    assert mape(worse) > 2 * fit.mape_fitted


def test_h100_fit_predicts_the_h200_out_of_sample():
    # the H200 has 1.43x the H100's bandwidth and the same SMs: the parameters fitted on
    # the H100 must carry over through the catalog's bandwidth alone
    h200 = load_kernel_dataset(H100.with_name("h200-decode-layers.json"))
    assert h200.runs[0]["device"] == "NVIDIA H200"
    points = compare_kernels(h200, CAT)
    assert len(points) == 262
    assert mape(points) < 10.0
    assert abs(np.mean([p.error for p in points])) < 0.05
