"""The tensor-rate throttle term (physics/tensor_throttle.py): a part whose tensor cores are
cut against its other units (the H20 family) runs compute-bound kernels nearer its peak
than its class reference, and no full-rate part of the class moves."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from capsim.catalog.loader import Section, load_catalog
from capsim.cli.main import app
from capsim.physics.deployment import default_efficiency, tensor_throttle_ratio
from capsim.physics.step import build_step_model
from capsim.physics.tensor_throttle import COMPUTE_EFFICIENCIES, rescaled_efficiency

CAT = load_catalog()
ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def test_the_h20_ratio_is_the_two_balances_of_tensor_and_vector_rates():
    """k = (148 / 44) / (989.5 / 66.9), by hand."""
    k = tensor_throttle_ratio(CAT.gpu("h20"), CAT)
    assert k == pytest.approx((148 / 44) / (989.5 / 66.9), rel=1e-12)
    assert k == pytest.approx(0.2274, abs=1e-4)
    assert tensor_throttle_ratio(CAT.gpu("h20-3e"), CAT) == pytest.approx(k, rel=1e-12)


def test_full_rate_hopper_parts_keep_the_class_values():
    """The reference and the H200 (same die, same clocks) have k = 1; a part without a
    vector figure (H100 PCIe) is not rescaled: all keep the class's compute efficiencies."""
    assert tensor_throttle_ratio(CAT.gpu("h100-sxm"), CAT) == 1.0
    assert tensor_throttle_ratio(CAT.gpu("h200"), CAT) == pytest.approx(1.0, rel=1e-12)
    assert tensor_throttle_ratio(CAT.gpu("h100-pcie"), CAT) is None
    cls = CAT.efficiency.entries["datacenter-hopper"].params
    for name in ("h100-sxm", "h200", "h100-pcie"):
        p = default_efficiency(CAT.gpu(name), CAT)
        for field in ("attention_compute_efficiency", "prefill_compute_efficiency"):
            assert getattr(p, field) == pytest.approx(cls[field], rel=1e-12), (name, field)


def test_classes_without_a_reference_are_never_rescaled():
    for gpu in CAT.gpus.entries.values():
        ref = CAT.efficiency.entries[gpu.hardware_class].reference_gpu
        if ref is None:
            assert tensor_throttle_ratio(gpu, CAT) is None, gpu.name


def test_the_h20s_compute_efficiencies_by_hand():
    """attention 0.45 -> 1 / (1 + (1/0.45 - 1) k), prefill GEMMs 0.73, experts 0.33."""
    k = (148 / 44) / (989.5 / 66.9)
    p = default_efficiency(CAT.gpu("h20"), CAT)
    assert p.attention_compute_efficiency == pytest.approx(1 / (1 + (1 / 0.45 - 1) * k))
    assert p.attention_compute_efficiency == pytest.approx(0.7825, abs=1e-4)
    assert p.prefill_compute_efficiency == pytest.approx(0.9224, abs=1e-4)
    assert p.moe_compute_efficiency == pytest.approx(0.6841, abs=1e-4)
    # bandwidth shares are not tensor-bound: untouched
    ref = default_efficiency(CAT.gpu("h100-sxm"), CAT)
    assert p.bandwidth_efficiency == ref.bandwidth_efficiency
    assert p.kv_bandwidth_efficiency == ref.kv_bandwidth_efficiency


def test_a_value_measured_on_the_gpu_itself_is_kept():
    """A GPU YAML's own efficiency (measured on it) is laid over and never rescaled."""
    gpu = CAT.gpu("h20").model_copy(update={"efficiency": {"attention_compute_efficiency": 0.5}})
    p = default_efficiency(gpu, CAT)
    assert p.attention_compute_efficiency == 0.5
    assert p.prefill_compute_efficiency == pytest.approx(0.9224, abs=1e-4)


def test_a_throttled_part_prefills_faster_than_the_class_values_would_give():
    """Qwen3-235B's 32K-token prefill on 8 H20-3e: the step is shorter with the term, and
    still never faster than the same FLOPs at the 148 TFLOPS peak."""
    gpu, model = CAT.gpu("h20-3e"), CAT.model("qwen3-235b-a22b-instruct-2507")
    import numpy as np

    from capsim.physics.deployment import Deployment

    dep = Deployment(tp=8)
    throttled = build_step_model(CAT, gpu, model, dep, default_efficiency(gpu, CAT))
    plain = build_step_model(
        CAT,
        gpu,
        model,
        dep,
        default_efficiency(gpu, CAT).with_overrides(
            {
                "attention_compute_efficiency": 0.45,
                "prefill_compute_efficiency": 0.73,
                "moe_compute_efficiency": 0.33,
                "compute_efficiency": 0.66,
            }
        ),
    )
    tokens = np.array([32768])
    fast = throttled.step(tokens, np.array([0])).t_total
    slow = plain.step(tokens, np.array([0])).t_total
    assert fast < 0.75 * slow
    step = throttled.step(tokens, np.array([0])).to_dict()
    flops = step["linear_flops"] + step["attention_flops"]  # per GPU
    assert flops > 3e14
    assert fast >= flops / 148e12


@given(
    e=st.floats(min_value=1e-3, max_value=1.0),
    k1=st.floats(min_value=1e-3, max_value=10.0),
    k2=st.floats(min_value=1e-3, max_value=10.0),
)
def test_rescaling_is_a_share_that_falls_as_the_tensor_cores_gain_on_the_rest(e, k1, k2):
    """k = 1 is the identity; the result stays in (0, 1]; a smaller k (tensor cores slower
    against the rest) never lowers it; k < 1 never lowers e and k > 1 never raises it."""
    a, b = rescaled_efficiency(e, k1), rescaled_efficiency(e, k2)
    assert 0 < a <= 1 and 0 < b <= 1
    assert math.isclose(rescaled_efficiency(e, 1.0), e, rel_tol=1e-12)
    if k1 <= k2:
        assert a >= b * (1 - 1e-12)
    if k1 <= 1:
        assert a >= e * (1 - 1e-12)
    else:
        assert a <= e * (1 + 1e-12)


@given(
    peak=st.floats(min_value=10.0, max_value=5000.0),
    more=st.floats(min_value=1.0, max_value=10.0),
    e=st.floats(min_value=0.01, max_value=1.0),
)
def test_more_tensor_peak_never_lowers_the_achieved_rate(peak, more, e):
    """A higher peak raises k and so lowers the share, but peak x share still never falls:
    P / (1 + c P) grows with P."""
    ref = 989.5 / 66.9

    def achieved(p):
        return p * rescaled_efficiency(e, (p / 44) / ref)

    assert achieved(peak * more) >= achieved(peak) * (1 - 1e-12)


def test_every_rescaled_name_is_an_efficiency_parameter():
    from capsim.physics.efficiency import EfficiencyParams

    for name in COMPUTE_EFFICIENCIES:
        assert name in EfficiencyParams.model_fields
        assert name in EfficiencyParams().groups["compute"]


def test_explain_names_the_term_with_its_ratio():
    r = runner.invoke(app, ["explain", "--gpu", "h20", "--model", "qwen3-30b-a3b"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "tensor-rate throttle: h20 has 148 dense 16-bit tensor TFLOPS beside 44" in text
    assert "k = 0.227" in text and "attention 0.45 -> 0.78" in text
    r = runner.invoke(app, ["explain", "--gpu", "h100-sxm", "--model", "qwen3-30b-a3b"])
    assert r.exit_code == 0 and "tensor-rate throttle" not in r.output


def test_a_reference_gpu_of_another_class_is_refused_by_file(tmp_path):
    text = (ROOT / "hardware_db" / "efficiency" / "datacenter-hopper.yaml").read_text()
    assert "reference_gpu: h100-sxm" in text
    folder = tmp_path / "db" / "efficiency"
    folder.mkdir(parents=True)
    (folder / "datacenter-hopper.yaml").write_text(
        text.replace("reference_gpu: h100-sxm", "reference_gpu: a100-80g")
    )
    r = runner.invoke(
        app, ["--db", str(tmp_path / "db"), "explain", "--gpu", "h20", "--model", "qwen3-8b"]
    )
    assert r.exit_code == 2, r.output
    assert "reference_gpu 'a100-80g' is not a GPU of class 'datacenter-hopper'" in r.output
    assert "datacenter-hopper.yaml" in r.output


def test_a_faster_copy_of_the_h20_is_never_slower():
    """Scaling the H20's tensor peaks up (k rises, shares fall) still shortens its prefill."""
    import numpy as np

    from capsim.physics.deployment import Deployment

    gpu = CAT.gpu("h20")
    peaks = {k: v * 3 for k, v in gpu.tensor_tflops.model_dump().items() if v is not None}
    faster = gpu.model_copy(
        update={
            "name": "h20-faster",
            "aliases": [],
            "tensor_tflops": gpu.tensor_tflops.model_copy(update=peaks),
        }
    )
    gpus = Section(CAT.gpus.kind, dict(CAT.gpus.entries), dict(CAT.gpus.origin))
    gpus.add(faster, CAT.gpus.origin["h20"])
    cat = dataclasses.replace(CAT, gpus=gpus)
    model = CAT.model("qwen3-8b")
    times = []
    for g in (gpu, faster):
        sm = build_step_model(cat, g, model, Deployment(), default_efficiency(g, cat))
        times.append(sm.step(np.array([8192]), np.array([0])).t_total)
    assert times[1] < times[0]
