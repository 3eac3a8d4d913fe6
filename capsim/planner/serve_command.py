"""The ``vllm serve`` line a plan prints for a configuration: the checkpoint to serve (a
published one in the plan's weight format where the catalog knows it), TP, max_num_seqs,
``--max-model-len`` where the KV cache cannot hold the model's whole context, the KV dtype
and speculation flags, and notes for what the line cannot say (power limits, replicas,
nodes)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from capsim.physics.memory import vllm_default_batch_limits

if TYPE_CHECKING:
    from capsim.catalog.loader import Catalog
    from capsim.planner.search import Candidate, Evaluated


NIXL_KV_TRANSFER_CONFIG = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
"""vLLM's --kv-transfer-config for a P/D server of either role with NIXL, as vLLM's NIXL
examples and llm-d's P/D guides pass it to both the prefill and the decode servers."""


def effective_max_num_seqs(c: Candidate, cat: Catalog) -> int:
    """The max_num_seqs the engine simulated for a candidate (vLLM's default if unset)."""
    return c.max_num_seqs or vllm_default_batch_limits(cat.gpu(c.gpu))[1]


def serve_repo(model, quant: str) -> tuple[str, bool]:
    """The repository to serve ``model`` in ``quant`` from: a published checkpoint in that
    format where the catalog knows one (True), else the release repository (False)."""
    for ckpt in model.checkpoints:
        if ckpt.quant == quant:
            return ckpt.hf_id, True
    return model.hf_id, quant == model.dtype


def winner_serve_command(e: Evaluated, cat: Catalog) -> str:
    """The ``vllm serve`` line for an evaluated configuration: the catalog's checkpoint in
    its format if there is one, its engine's max_num_seqs, and --max-model-len where the
    KV cache cannot hold the model's whole context."""
    c = e.candidate
    model = cat.model(c.model)
    hf_id, in_format = serve_repo(model, c.quant)
    longest = model.max_position_embeddings or math.inf
    limit = e.max_model_len if e.max_model_len and e.max_model_len < longest else None
    return vllm_serve_command(c, hf_id, effective_max_num_seqs(c, cat), limit, in_format)


def vllm_serve_command(
    c: Candidate,
    hf_id: str,
    max_num_seqs: int,
    max_model_len: int | None = None,
    checkpoint_in_format: bool | None = None,
) -> str:
    """The ``vllm serve`` line for a configuration (one per DP replica). ``max_model_len``
    (the longest sequence its KV cache allows) becomes ``--max-model-len`` where given:
    vLLM refuses to start when the model's own context length does not fit.
    ``checkpoint_in_format``: whether ``hf_id`` already holds the weights in ``c.quant``
    (None: judged from the format, as before)."""
    parts = [
        f"vllm serve {hf_id}",
        f"--tensor-parallel-size {c.tp}",
        f"--max-num-seqs {max_num_seqs}",
    ]
    if max_model_len is not None:
        parts.append(f"--max-model-len {max_model_len}")
    in_format = checkpoint_in_format
    if c.quant == "fp8" and not in_format and not hf_id.lower().endswith("fp8"):
        parts.append("--quantization fp8")
    if c.kv_dtype != "auto":
        parts.append(f"--kv-cache-dtype {c.kv_dtype}")
    data_parallel_experts = c.expert_parallel and c.dp > 1 and not c.prefill_replicas
    if data_parallel_experts:  # one EP group of every GPU, attention in dp ranks
        parts.append(f"--data-parallel-size {c.dp}")
    if c.expert_parallel:
        parts.append("--enable-expert-parallel")
    if c.prefill_replicas:
        parts.append(f"--kv-transfer-config '{NIXL_KV_TRANSFER_CONFIG}'")
    if c.spec is not None:
        parts.append(
            '--speculative-config \'{"method": "mtp", "num_speculative_tokens": '
            f"{c.spec.num_tokens}}}'"
        )
    command = " ".join(parts)
    notes = []
    if c.tp > 1 and c.interconnect != "auto":
        notes.append(f"TP over {c.interconnect}")
    if c.power_limit_w is not None:
        notes.append(f"nvidia-smi -pl {c.power_limit_w:.0f} on each GPU")
    if c.quant not in ("bf16", "fp16", "fp8") and not in_format:
        notes.append(f"needs a checkpoint of this model in {c.quant}")
    if c.prefill_replicas:
        notes.append(
            f"{c.prefill_replicas} prefill and {c.dp} decode servers of this line behind a "
            "P/D proxy (vLLM's toy_proxy_server.py, llm-d or Dynamo)"
        )
    elif c.nodes > 1:
        notes.append(
            f"{c.nodes} nodes, {c.count // c.tp} replicas each ({c.dp} in all) behind a router"
        )
    elif c.dp > 1 and not data_parallel_experts:
        notes.append(f"x{c.dp} replicas (--data-parallel-size {c.dp}, or one server per GPU group)")
    if notes:
        command += "   # " + "; ".join(notes)
    return command
