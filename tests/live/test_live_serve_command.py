"""The ``vllm serve`` lines ``capsim plan`` prints parse with vLLM's own argument parser
(issue 48: a winner copied into a shell with vLLM installed must not fail on its flags).

tests/live/run_live.sh sets CAPSIM_VLLM_PYTHON to the interpreter of the vLLM build it
installs; each line is split as a shell would (the note after '#' is a comment) and handed
to the parser ``vllm serve`` builds (make_arg_parser on a FlexibleArgumentParser), then to
EngineArgs.from_cli_args, which is where vLLM reads the values into its configuration.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from capsim.api import plan
from capsim.catalog.loader import load_catalog
from capsim.physics.speculative import SpecConfig
from capsim.planner.search import Candidate, PlanRequest
from capsim.planner.serve_command import vllm_serve_command, winner_serve_command

pytestmark = pytest.mark.live

# run in vLLM's interpreter: every line in argv form on stdin, one verdict per line out
PARSE_WITH_VLLM = r"""
import json, sys
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:  # releases before the launchers package
    from vllm.entrypoints.openai.cli_args import make_arg_parser
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
from vllm.engine.arg_utils import AsyncEngineArgs

verdicts = []
for argv in json.load(sys.stdin):
    parser = make_arg_parser(FlexibleArgumentParser(exit_on_error=False))
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:
            raise ValueError(f"unrecognized arguments: {unknown}")
        args.model = args.model_tag
        engine = AsyncEngineArgs.from_cli_args(args)
        verdicts.append({"ok": True, "model": engine.model, "tp": engine.tensor_parallel_size})
    except (SystemExit, Exception) as e:
        verdicts.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
print(json.dumps(verdicts))
"""


def vllm_python() -> str:
    python = os.environ.get("CAPSIM_VLLM_PYTHON")
    if python:
        return python
    reason = "no vLLM interpreter: run tests/live/run_live.sh, which sets CAPSIM_VLLM_PYTHON"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def parse_with_vllm(lines: list[str]) -> list[dict]:
    """vLLM's verdict on each ``vllm serve ...`` line."""
    argvs = []
    for line in lines:
        words = shlex.split(line, comments=True)
        assert words[:2] == ["vllm", "serve"], line
        argvs.append(words[2:])
    done = subprocess.run(
        [vllm_python(), "-c", PARSE_WITH_VLLM],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_flag_a_plan_line_can_carry_parses_with_vllms_own_parser():
    every_flag = Candidate(
        gpu="h100-sxm",
        count=4,
        tp=2,
        model="m",
        quant="fp8",
        kv_dtype="fp8",
        spec=SpecConfig(method="mtp", num_tokens=2, acceptance=0.7),
        power_limit_w=500,
        max_num_seqs=64,
        expert_parallel=True,
    )
    lines = [
        vllm_serve_command(every_flag, "Org/Model", 64, max_model_len=40_000),
        vllm_serve_command(
            Candidate(gpu="rtx3090", count=1, tp=1, model="m", quant="bf16", kv_dtype="auto"),
            "Org/Model",
            256,
        ),
    ]
    assert "--speculative-config" in lines[0] and "--quantization fp8" in lines[0]
    assert "--enable-expert-parallel" in lines[0]
    verdicts = parse_with_vllm(lines)
    assert all(v["ok"] for v in verdicts), list(zip(lines, verdicts, strict=True))
    assert [v["tp"] for v in verdicts] == [2, 1]
    # the parser is strict: a flag vLLM does not have is refused, so a pass means something
    (bad,) = parse_with_vllm([lines[1] + " --tensor-paralel-size 2"])
    assert not bad["ok"] and "tensor-paralel-size" in bad["error"]


def test_the_lines_a_plan_prints_parse_with_vllms_own_parser():
    request = PlanRequest(
        models=("qwen3-coder-30b-a3b",),
        agents=8,
        gpus=("rtx3090", "h100-sxm"),
        gpu_counts=(1, 2),
    )
    outcome = plan(request)
    catalog = load_catalog()
    lines = sorted({winner_serve_command(e, catalog) for e in outcome.configurations})
    assert len(lines) >= 5
    verdicts = parse_with_vllm(lines)
    assert all(v["ok"] for v in verdicts), [
        (line, v) for line, v in zip(lines, verdicts, strict=True) if not v["ok"]
    ]
    for line, verdict in zip(lines, verdicts, strict=True):
        assert verdict["model"] == shlex.split(line)[2]
