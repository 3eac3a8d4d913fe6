"""llama.cpp's compute backends (--engine llama.cpp:vulkan): a backend's parameters lay over
the engine's for the classes it names, it runs on the vendors it lists, and a measurement
names the one it ran on."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from capsim.calibration.compare import simulated_engine
from capsim.calibration.published import Scenario
from capsim.catalog.loader import engine_base, load_catalog
from capsim.cli.main import app
from capsim.errors import CapsimUserError
from capsim.physics.deployment import default_efficiency

CAT = load_catalog()


def test_vulkan_lays_its_parameters_over_the_amd_classes_only():
    xtx = CAT.gpu("rx7900xtx")
    rocm = default_efficiency(xtx, CAT, CAT.engine("llama.cpp"))
    vulkan = default_efficiency(xtx, CAT, CAT.engine("llama.cpp:vulkan"))
    assert (rocm.bandwidth_efficiency, rocm.compute_efficiency) == (0.7, 0.4)
    assert (vulkan.bandwidth_efficiency, vulkan.compute_efficiency) == (0.85, 0.56)
    # on an NVIDIA card it keeps CUDA's priors, but for what its own kernels do differently:
    # without flash attention its F16 x F32 matmul reads the F32 scores (16 B a score, not
    # CUDA's 20 with an F16 copy; physics/score_terms.py)
    g = CAT.gpu("rtx3090")
    on_vulkan = default_efficiency(g, CAT, CAT.engine("llama.cpp:vulkan"))
    on_cuda = default_efficiency(g, CAT, CAT.engine("llama.cpp"))
    assert (on_vulkan.attention_score_bytes, on_cuda.attention_score_bytes) == (16.0, 20.0)
    assert on_vulkan.with_overrides({"attention_score_bytes": 20.0}) == on_cuda
    # the vendor's own backend named explicitly is the default
    assert default_efficiency(xtx, CAT, CAT.engine("llama.cpp:rocm")) == rocm


def test_a_backend_and_a_release_combine_and_the_base_name_is_the_engine():
    e = CAT.engine("llama.cpp:vulkan@b2824")
    assert (e.name, e.backend, e.version) == ("llama.cpp", "vulkan", "b2824")
    assert e.generation is not None  # the build before int8 MMQ
    assert engine_base("llama.cpp:vulkan@b2824") == "llama.cpp"


@pytest.mark.parametrize(
    ("ref", "fragment"),
    [
        ("llama.cpp:vulcan", "did you mean 'vulkan'"),
        ("llama.cpp:", "names no backend"),
        ("vllm:vulkan", "vllm has: none"),
    ],
)
def test_an_unknown_backend_is_a_user_error(ref, fragment):
    with pytest.raises(CapsimUserError) as err:
        CAT.engine(ref)
    assert fragment in err.value.message


def test_a_backend_off_its_vendors_is_refused_with_exit_2():
    with pytest.raises(CapsimUserError, match="does not run on amd GPUs"):
        default_efficiency(CAT.gpu("rx7900xtx"), CAT, CAT.engine("llama.cpp:metal"))
    args = ["predict", "--gpu", "rx7900xtx", "--model", "llama-2-7b", "--quant", "gguf-q4_0"]
    result = CliRunner().invoke(app, [*args, "--engine", "llama.cpp:metal", "--concurrency", "1"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_a_measurement_names_its_backend():
    sc = Scenario(
        name="x",
        engine="llama.cpp",
        engine_version="b6918 (2f68ce7cf)",
        backend="vulkan",
        gpu="rx7900xtx",
        model="llama-2-7b",
        quant="gguf-q4_0",
        points=[{"concurrency": 1, "metric": "decode_tok_s", "value": 180.0, "quote": "q"}],
    )
    assert simulated_engine(sc) == "llama.cpp:vulkan@b6918 (2f68ce7cf)"
    assert CAT.engine(simulated_engine(sc)).backend == "vulkan"
