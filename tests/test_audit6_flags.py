"""Issue 47, sixth audit: a --set that no model of the command reads, a plan flag that no
searched deployment can take, and capacity's advice for a vLLM DP+EP group."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from capsim.cli.main import app

runner = CliRunner()


@pytest.mark.parametrize(
    "line, says",
    [
        (
            "predict --gpu h100-sxm --model llama-3.1-8b -c 1 --set moe_routing_skew=0.5",
            "--set moe_routing_skew applies to models with routed experts",
        ),
        (
            "explain --gpu h100-sxm --model llama-3.1-8b --set moe_layer_overhead_us=30",
            "--set moe_layer_overhead_us applies to models with routed experts",
        ),
        (
            "explain --gpu h100-sxm --model qwen3-30b-a3b --set mla_layer_floor_share=1",
            "--set mla_layer_floor_share applies to models with multi-head latent attention",
        ),
        (
            "plan --model qwen3-8b --agents 8 --gpus rtx3090 --counts 1 --disaggregation",
            "no deployment searched here has two replicas",
        ),
        (  # unified memory: no link in the catalog to move KV between instances over
            "plan --model qwen3-8b --agents 8 --gpus gb10 --counts 1,2 --disaggregation",
            "no deployment searched here has two replicas",
        ),
    ],
)
def test_a_flag_that_changes_nothing_is_refused(line, says):
    r = runner.invoke(app, line.split(), env={"COLUMNS": "200"})
    assert r.exit_code == 2, r.output
    assert says in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output


def test_a_moe_parameter_with_one_moe_model_among_several_is_taken():
    line = (
        "predict --gpu h100-sxm --model llama-3.1-8b,qwen3-30b-a3b -c 1 --requests 8 "
        "--set moe_routing_skew=0.5 --json"
    )
    r = runner.invoke(app, line.split())
    assert r.exit_code == 0, r.output


def test_capacity_doubles_a_vllm_dp_ep_group_not_one_gpu():
    """vLLM --dp 8 --enable-expert-parallel is one group of 8 GPUs: the replica capacity
    suggests is another such group (simulated), not '--gpus 2'."""
    line = (
        "capacity --gpu h200 --model deepseek-r1 --dp 8 --enable-expert-parallel "
        "--min-agent-tok-s 30 --max-ttft-p90-s 0.5 --input-tokens 3200 --output-tokens 800"
    )
    r = runner.invoke(app, line.split(), env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "--gpus 2)" not in text
    assert "another DP+EP group of 8 GPUs behind a router" in text
    # the TTFT change was simulated, not refused
    assert "DP+EP group of 8 GPUs behind a router (a server each): TTFT p90" in text
