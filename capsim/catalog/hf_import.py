"""Turn a Hugging Face config.json into a catalog model entry (``capsim models import-hf``).

The mapping reads the keys the major families use (Llama, Qwen2/3, Qwen3-MoE, Qwen3.5 and
Qwen3-Next hybrids, DeepSeek-V2/V3 MLA, GLM-4.5, gpt-oss, Mistral/Mixtral). Multimodal
configs are read from their ``text_config``. Anything the config does not say stays at the
schema default, and the entry's source records the file it came from.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from capsim.catalog.hf_quant import fp8_weight_block_of_config, quant_of_config
from capsim.catalog.loader import format_validation_error
from capsim.catalog.model_schema import MAX_LAYERS, Model
from capsim.errors import CapsimUserError
from capsim.files import loads_json, write_text_atomic

QUANT_FILE = "hf_quant_config.json"
"""NVIDIA ModelOpt's file beside config.json that states a checkpoint's quantisation."""
STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
QWEN2_FAMILY = {"qwen2", "qwen2_moe"}
GATED_ATTENTION = {"qwen3_next"}
"""Architectures whose q_proj always also produces an output gate, which their configs do not
state (public Qwen3-Next implementations, e.g. the MLX ports, build q_proj as
num_attention_heads x head_dim x 2)."""
ALWAYS_SLIDING = {"mistral", "mixtral"}
SLIDING_BELOW_CONTEXT = {"phi3"}
"""Architectures whose every layer is windowed by config.json's sliding_window where it is
shorter than max_position_embeddings: Phi-3-mini/medium-4k set 2047 of 4096, which vLLM
applies to every layer (its model-level window); Phi-3.5-mini sets 262144, beyond its
131072 positions, so no layer of its is windowed."""

UNGATED_FFN = {
    "gpt2",
    "gpt_neo",
    "gpt_neox",
    "gptj",
    "codegen",
    "opt",
    "bloom",
    "falcon",
    "mpt",
    "phi",
    "gpt_bigcode",
    "starcoder2",
}
"""Architectures whose MLP is up-projection, activation, down-projection (two matrices, no
gate: transformers' GPT2MLP, GPTNeoXMLP, GPTJMLP, OPT's fc1/fc2, BloomMLP, FalconMLP,
MptMLP, PhiMLP, GPTBigCodeMLP, Starcoder2MLP); their configs say nothing of it."""

CONFIG_ALIASES = {
    "num_hidden_layers": ("n_layer", "n_layers", "num_layers"),
    "hidden_size": ("n_embd", "n_embed", "d_model"),
    "num_attention_heads": ("n_head", "n_heads", "num_heads"),
    "intermediate_size": ("n_inner", "ffn_dim", "ffn_hidden_size"),
}
"""Older architectures' names for the standard keys (GPT-2, GPT-J and CodeGen: n_layer,
n_embd, n_head, n_inner; OPT: ffn_dim; BLOOM: n_layer, n_head; MPT: n_layers, d_model,
n_heads; GPT-Neo: num_layers, num_heads)."""


def read_config(path: Path) -> dict[str, Any]:
    """Read config.json, with a clear error if it is missing or not JSON."""
    from capsim.files import read_input_text

    text = read_input_text(path, "config file")
    try:
        data = loads_json(text)
    except json.JSONDecodeError as exc:
        raise CapsimUserError(f"'{path}' is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CapsimUserError(f"'{path}' does not hold a JSON object")
    check_whole_numbers(data, path)
    return data


WHOLE_NUMBER_KEYS = frozenset(
    [
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "intermediate_size",
        "intermediate_size_mlp",
        "dense_intermediate_size",
        "head_dim",
        "global_head_dim",
        "num_global_key_value_heads",
        "kv_lora_rank",
        "q_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "num_experts",
        "n_routed_experts",
        "num_local_experts",
        "num_experts_per_tok",
        "top_k_experts",
        "experts_per_token",
        "moe_intermediate_size",
        "expert_intermediate_size",
        "shared_expert_intermediate_size",
        "moe_shared_expert_intermediate_size",
        "shared_intermediate_size",
        "n_shared_experts",
        "first_k_dense_replace",
        "moe_layer_freq",
        "interleave_moe_layer_step",
        "moe_latent_size",
        "num_kv_shared_layers",
        "hidden_size_per_layer_input",
        "vocab_size_per_layer_input",
        "sliding_window",
        "sliding_window_pattern",
        "max_position_embeddings",
        "attention_chunk_size",
        "full_attention_interval",
        "no_rope_layer_interval",
        "linear_conv_kernel_dim",
        "linear_key_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_value_head_dim",
        "mamba_head_dim",
        "mamba_num_heads",
        "n_groups",
        "ssm_state_size",
        "conv_kernel",
        "index_head_dim",
        "index_n_heads",
        "index_topk",
        "mtp_num_hidden_layers",
        "num_nextn_predict_layers",
    ]
)
"""config.json keys that count things (layers, heads, widths, experts): whole numbers. A
3.5 there was rounded down without a word; now it is an error naming the key."""

POSITIVE_KEYS = frozenset(
    {
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "vocab_size",
        # 0 was read as 'not given' (as many KV heads as heads; no context limit)
        "num_key_value_heads",
        "max_position_embeddings",
    }
)


LISTED_COUNT_KEYS = frozenset({"moe_layer_freq"})
"""Counting keys a config may give as a list, one entry a layer (MiniMax-M3's
moe_layer_freq)."""

BOOLEAN_KEYS = frozenset(
    {
        "tie_word_embeddings",
        "attention_bias",
        "attn_output_gate",
        "attention_k_eq_v",
        "use_double_wide_mlp",
        "enable_moe_block",
        "multi_query",
        "new_decoder_architecture",
        "use_sparse_attention",
    }
)
"""config.json keys capsim reads as true or false: "false" was read as true (a text that is
not empty), [] and 0 as false, the weights counted with or without their tied embedding
(issue 47, round 5)."""


def check_whole_numbers(data: Any, path: Path, where: str = "") -> None:
    """Refuse a counting key (WHOLE_NUMBER_KEYS) whose value is not a whole number (a list
    or an object too, where LISTED_COUNT_KEYS does not take one: [] was read as not given),
    a model's core sizes (POSITIVE_KEYS) that are not positive and a BOOLEAN_KEYS value that
    is not true, false or null, anywhere in the config (the text_config of a multimodal one
    too)."""
    items = (
        data.items()
        if isinstance(data, dict)
        else enumerate(data)
        if isinstance(data, list)
        else ()
    )
    for key, value in items:
        at = f"{where}.{key}" if where else str(key)
        if key in BOOLEAN_KEYS and value is not None and not isinstance(value, bool):
            raise CapsimUserError(
                f"'{path}': {at} is {value!r:.40}; it must be true or false",
                hint="pass the config.json of the model as published, unedited",
            )
        listed = isinstance(value, (dict, list)) and key not in LISTED_COUNT_KEYS
        if key in WHOLE_NUMBER_KEYS and listed:
            raise CapsimUserError(
                f"'{path}': {at} is {value!r:.40}; it counts {key.replace('_', ' ')} and "
                "must be a whole number",
                hint="pass the config.json of the model as published, unedited",
            )
        if isinstance(value, (dict, list)):
            check_whole_numbers(value, path, at)
            continue
        if isinstance(value, float) and not math.isfinite(value):  # 1e999 parses as inf
            raise CapsimUserError(
                f"'{path}': {at} is {value!r}, not a finite number",
                hint="pass the config.json of the model as published, unedited",
            )
        if key not in WHOLE_NUMBER_KEYS or value is None:
            continue
        whole = isinstance(value, int) and not isinstance(value, bool)
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            whole = True
        if not whole:
            raise CapsimUserError(
                f"'{path}': {at} is {value!r}; it counts {key.replace('_', ' ')} and must be "
                "a whole number",
                hint="pass the config.json of the model as published, unedited",
            )
        if key in POSITIVE_KEYS and value <= 0:
            raise CapsimUserError(f"'{path}': {at} is {value!r}; it must be at least 1")


def _gemma_attention(cfg: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3n/4 keys: the full-attention layers' own head shape (global_head_dim, and
    num_global_key_value_heads where keys double as values: attention_k_eq_v, which only
    those layers use), KV-shared layers and per-layer embeddings."""
    out: dict[str, Any] = {}
    k_eq_v = bool(cfg.get("attention_k_eq_v"))
    head_dim = int(cfg.get("global_head_dim") or entry["head_dim"])
    kv_heads = entry["num_kv_heads"]
    if k_eq_v and cfg.get("num_global_key_value_heads"):
        kv_heads = int(cfg["num_global_key_value_heads"])
    if "full_attention" in entry["layer_pattern"] and (
        k_eq_v or (head_dim, kv_heads) != (entry["head_dim"], entry["num_kv_heads"])
    ):
        out["full_attention"] = {"head_dim": head_dim, "num_kv_heads": kv_heads, "k_eq_v": k_eq_v}
    if cfg.get("num_kv_shared_layers"):
        out["kv_shared_layers"] = int(cfg["num_kv_shared_layers"])
        out["double_wide_mlp"] = bool(cfg.get("use_double_wide_mlp"))
    if cfg.get("hidden_size_per_layer_input"):
        out["per_layer_input"] = {
            "size": int(cfg["hidden_size_per_layer_input"]),
            "vocab_size": int(cfg.get("vocab_size_per_layer_input") or entry["vocab_size"]),
        }
    return out


def compress_pattern(layer_types: list[str]) -> list[str]:
    """The shortest cycle that repeats to ``layer_types`` (the whole list if none does)."""
    n = len(layer_types)
    for size in range(1, n):
        if layer_types[size:] == layer_types[:-size]:  # periodic with period `size`
            return layer_types[:size]
    return layer_types


HYBRID_MIXERS = {"M": "mamba", "*": "full_attention", "-": "none", "E": "none"}
HYBRID_FFNS = {"M": "none", "*": "none", "-": "dense", "E": "moe"}
"""Nemotron-H's hybrid_override_pattern: one character per layer (Mamba-2, attention,
MLP, MoE), each layer a single block."""
HYBRID_BLOCK_NAMES = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
"""The same blocks by name, as newer Nemotron-H configs list them (layers_block_type)."""


def _hybrid_patterns(cfg: dict[str, Any]) -> tuple[list[str], list[str]] | None:
    pattern = cfg.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or not pattern:
        return None
    if len(pattern) > MAX_LAYERS:
        raise CapsimUserError(f"hybrid_override_pattern has more than {MAX_LAYERS:,} layers")
    unknown = set(pattern) - set(HYBRID_MIXERS)
    if unknown:
        raise CapsimUserError(
            f"hybrid_override_pattern has layer kinds capsim does not know: {sorted(unknown)}"
        )
    mixers = compress_pattern([HYBRID_MIXERS[c] for c in pattern])
    ffns = compress_pattern([HYBRID_FFNS[c] for c in pattern])
    return mixers, ffns


def _standard_keys(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """``cfg`` with the standard keys filled in from an older architecture's names
    (CONFIG_ALIASES), its MLP width where the config leaves it to a default (4 x hidden for
    GPT-2, GPT-J, GPT-Neo, BLOOM and Falcon when unset; MPT's expansion_ratio x d_model),
    and its KV heads where it says them another way (Falcon's num_kv_heads; multi_query:
    one KV head, as Falcon-7B and GPTBigCode; MPT's attn_config.kv_n_heads)."""
    out = dict(cfg)
    blocks = out.get("layers_block_type")
    if out.get("hybrid_override_pattern") is None and isinstance(blocks, list) and blocks:
        # newer Nemotron-H configs (Nemotron 3 Ultra) list each layer's block by name
        unknown = {str(b) for b in blocks} - set(HYBRID_BLOCK_NAMES)
        if unknown:
            raise CapsimUserError(
                f"layers_block_type has block kinds capsim does not know: {sorted(unknown)}"
            )
        out["hybrid_override_pattern"] = "".join(HYBRID_BLOCK_NAMES[str(b)] for b in blocks)
        if out.get("num_hidden_layers") is None:
            out["num_hidden_layers"] = len(blocks)
    for key, aliases in CONFIG_ALIASES.items():
        if out.get(key) is None:
            found = next((out[a] for a in aliases if out.get(a) is not None), None)
            if found is not None:
                out[key] = found
    hidden = out.get("hidden_size")
    if out.get("intermediate_size") is None and hidden is not None:
        if model_type == "mpt":
            out["intermediate_size"] = int(float(out.get("expansion_ratio", 4)) * int(hidden))
        elif model_type in UNGATED_FFN and model_type not in {"opt", "phi", "starcoder2"}:
            out["intermediate_size"] = 4 * int(hidden)
    if out.get("num_key_value_heads") is None:
        attn = out.get("attn_config") if isinstance(out.get("attn_config"), dict) else {}
        if out.get("num_kv_heads") is not None and out.get("new_decoder_architecture"):
            out["num_key_value_heads"] = out["num_kv_heads"]
        elif out.get("multi_query"):
            out["num_key_value_heads"] = 1
        elif attn.get("kv_n_heads") is not None:
            out["num_key_value_heads"] = attn["kv_n_heads"]
    return out


def _layer_pattern(cfg: dict[str, Any], model_type: str, num_layers: int) -> list[str]:
    if num_layers > MAX_LAYERS or len(cfg.get("layer_types") or ()) > MAX_LAYERS:
        raise CapsimUserError(f"config.json has more than {MAX_LAYERS:,} layers")
    if isinstance(cfg.get("layer_types"), list) and cfg["layer_types"]:
        if len(cfg["layer_types"]) != num_layers:
            raise ValueError(
                f"layer_types lists {len(cfg['layer_types'])} layers and num_hidden_layers "
                f"says {num_layers}"
            )
        return compress_pattern([str(t) for t in cfg["layer_types"]])
    if cfg.get("attention_chunk_size") and isinstance(cfg.get("no_rope_layers"), list):
        # Llama 4: RoPE layers attend within a chunk, NoPE layers globally; an empty list
        # is transformers' default, every no_rope_layer_interval-th layer (4) without RoPE
        flags = cfg["no_rope_layers"] or [
            int((i + 1) % int(cfg.get("no_rope_layer_interval") or 4) != 0)
            for i in range(num_layers)
        ]
        return compress_pattern(
            ["sliding_attention" if f else "full_attention" for f in flags[:num_layers]]
        )
    if model_type == "gemma2" and cfg.get("sliding_window"):
        return ["sliding_attention", "full_attention"]
    if model_type.startswith("gemma3") and cfg.get("sliding_window_pattern"):
        every = int(cfg["sliding_window_pattern"])
        return ["sliding_attention"] * (every - 1) + ["full_attention"]
    interval = cfg.get("full_attention_interval")
    if interval and cfg.get("linear_num_value_heads"):
        return ["linear_attention"] * (int(interval) - 1) + ["full_attention"]
    if model_type in ALWAYS_SLIDING and cfg.get("sliding_window"):
        return ["sliding_attention"]
    window, context = cfg.get("sliding_window"), cfg.get("max_position_embeddings")
    if model_type in SLIDING_BELOW_CONTEXT and window and context and int(window) < int(context):
        return ["sliding_attention"]
    return ["full_attention"]


ROUTED_ONLY = {
    "olmoe": "num_experts",
    "qwen2_moe": "num_experts",
    "qwen3_moe": "num_experts",
    "mixtral": "num_local_experts",
}
"""Architectures whose every checkpoint routes experts, with the key that counts them:
transformers fills a missing count with its default (OLMoE's 64, Mixtral's 8), never a
dense model (a DeepSeek-V2 config without n_routed_experts is one, so it is not here)."""

OWN_EXPERT_WIDTH = {"qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3"}
"""Architectures whose intermediate_size is the dense MLP's width, the experts' being
moe_intermediate_size (Qwen1.5-MoE: 5632 and 1408): without it, not the dense width."""

ROUTED_PER_TOKEN = ("num_experts_per_tok", "experts_per_token", "top_k_experts")


def _moe(cfg: dict[str, Any], model_type: str = "") -> dict[str, Any] | None:
    experts = cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts")
    if model_type in ROUTED_ONLY and cfg.get(ROUTED_ONLY[model_type]) is None and not experts:
        # an OLMoE config without num_experts became a dense model of 0.58 B parameters
        raise KeyError(ROUTED_ONLY[model_type])
    routed = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token")
    if (
        not experts
        and routed
        and any(cfg.get(k) == 0 for k in ("num_experts", "n_routed_experts", "num_local_experts"))
    ):  # a Mixtral of 0 experts that routes 2 a token became a dense model
        raise ValueError(f"0 experts, yet {routed} routed a token")
    if not experts or cfg.get("enable_moe_block") is False:
        return None
    # the first key a config sets: 0 was passed over for the next one, or for 1 routed a
    # token ('num_experts_per_tok: 0' and a config without it imported as top-1 routing)
    routed_key = next((k for k in ROUTED_PER_TOKEN if cfg.get(k) is not None), None)
    if routed_key is None:
        raise KeyError("num_experts_per_tok")
    if model_type in OWN_EXPERT_WIDTH and cfg.get("moe_intermediate_size") is None:
        raise KeyError("moe_intermediate_size")
    width_key = next(
        k
        for k in ("moe_intermediate_size", "expert_intermediate_size", "intermediate_size")
        if cfg.get(k) is not None or k == "intermediate_size"
    )
    for key in (routed_key, width_key):
        if cfg.get(key) is not None and not int(cfg[key]) >= 1:
            raise ValueError(f"{key} is {cfg[key]!r} with {experts} routed experts, not 1 or more")
    moe: dict[str, Any] = {
        "num_experts": int(experts),
        "experts_per_token": int(cfg[routed_key]),
        "moe_intermediate_size": int(cfg[width_key]),
    }
    shared = cfg.get("n_shared_experts")
    shared_width = (
        cfg.get("shared_expert_intermediate_size")
        or cfg.get("moe_shared_expert_intermediate_size")
        or (cfg.get("shared_intermediate_size") if shared else None)
    )
    if cfg.get("enable_moe_block") and cfg.get("intermediate_size"):
        # Gemma 4: every MoE layer runs its dense MLP beside the experts, on every token,
        # as a shared expert would
        shared, shared_width = 1, cfg["intermediate_size"]
    if shared:
        moe["num_shared_experts"] = int(shared)
    elif shared_width:
        moe["num_shared_experts"] = 1
    if shared_width:
        moe["shared_expert_intermediate_size"] = int(shared_width)
    if cfg.get("moe_latent_size"):
        moe["latent_size"] = int(cfg["moe_latent_size"])
    if cfg.get("first_k_dense_replace"):
        moe["first_dense_layers"] = int(cfg["first_k_dense_replace"])
    freq = cfg.get("moe_layer_freq")
    if isinstance(freq, list) and freq and 0 in freq:
        # MiniMax-M3: 0 marks a dense layer, 1 a MoE layer; the dense ones lead the stack
        leading = next((i for i, f in enumerate(freq) if f), len(freq))
        if all(freq[leading:]):
            moe["first_dense_layers"] = leading
    if cfg.get("model_type") == "gpt_oss":
        moe["expert_bias"] = True
    if str(cfg.get("model_type", "")).startswith("llama4"):
        moe["num_shared_experts"] = 1  # one shared expert as wide as a routed one
    return moe


def local_hub_config_path(repo: str) -> Path | None:
    """``repo``'s config.json in this machine's Hugging Face cache, where a server that
    loaded the model by id (vLLM, SGLang, transformers) keeps it: ``HF_HUB_CACHE``, else
    ``HF_HOME``/hub, else ~/.cache/huggingface/hub. The snapshot ``refs/main`` names,
    else the most recently written one; None when the repo is not cached."""
    import os

    if os.environ.get("HF_HUB_CACHE"):
        root = Path(os.environ["HF_HUB_CACHE"])
    elif os.environ.get("HF_HOME"):
        root = Path(os.environ["HF_HOME"]) / "hub"
    else:
        root = Path.home() / ".cache" / "huggingface" / "hub"
    folder = root.expanduser() / ("models--" + repo.replace("/", "--"))
    ref = folder / "refs" / "main"
    if ref.is_file():
        from capsim.files import read_input_text

        named = (
            folder / "snapshots" / read_input_text(ref, "Hugging Face ref").strip() / "config.json"
        )
        if named.is_file():
            return named
    snapshots = [p for p in folder.glob("snapshots/*/config.json") if p.is_file()]
    return max(snapshots, key=lambda p: p.stat().st_mtime) if snapshots else None


def fetch_hub_config(repo: str) -> dict[str, Any]:
    """A repo's config.json from the Hugging Face Hub (``HF_ENDPOINT``; ``HF_TOKEN`` for
    gated repos), cached under capsim's cache folder so it is fetched once."""
    config = fetch_hub_file(repo, "config.json")
    assert config is not None
    return config


def fetch_hub_quant_file(repo: str) -> dict[str, Any] | None:
    """A repo's hf_quant_config.json (ModelOpt checkpoints) from the Hub, or None when the
    repo has none."""
    return fetch_hub_file(repo, QUANT_FILE, optional=True)


def quant_file_beside(config_path: Path) -> dict[str, Any] | None:
    """The hf_quant_config.json kept beside a config.json, or None."""
    path = config_path.parent / QUANT_FILE
    return read_config(path) if path.is_file() else None


def fetch_hub_file(repo: str, filename: str, optional: bool = False) -> dict[str, Any] | None:
    """A JSON file of a Hub repo, cached under capsim's cache folder so it is fetched once;
    None when ``optional`` and the repo has no such file."""
    import os

    import httpx

    from capsim.catalog.resolve import (
        DEFAULT_HF_ENDPOINT,
        FETCH_TIMEOUT_S,
        HF_ENDPOINT_ENV,
        cache_dir,
    )

    cached = cache_dir() / "hf" / repo / filename
    if cached.is_file():
        return read_config(cached)
    endpoint = os.environ.get(HF_ENDPOINT_ENV, DEFAULT_HF_ENDPOINT).rstrip("/")
    url = f"{endpoint}/{repo}/resolve/main/{filename}"
    try:
        if httpx.URL(url).scheme not in ("http", "https") or not httpx.URL(url).host:
            raise httpx.InvalidURL("not an http(s) URL with a host")
    except httpx.InvalidURL as exc:
        raise CapsimUserError(
            f"{HF_ENDPOINT_ENV}={endpoint!r} is not a URL capsim can fetch from ({exc})",
            hint=f"unset {HF_ENDPOINT_ENV} for {DEFAULT_HF_ENDPOINT}, or set it to an "
            "http(s) URL such as https://hf-mirror.com",
        ) from None
    headers = {}
    token = os.environ.get("HF_TOKEN", "")
    if token:
        if not (token.isascii() and token.isprintable()):
            raise CapsimUserError(
                "HF_TOKEN holds a character an HTTP header cannot carry (only printable ASCII)",
                hint="check HF_TOKEN, or unset it for public repos",
            )
        headers["Authorization"] = f"Bearer {token}"
    offline_hint = (
        "this machine cannot reach the Hub: download the model's config.json and pass its "
        "path, e.g. --model ./config.json"
    )
    try:
        status, body = fetch_bounded(url, headers, FETCH_TIMEOUT_S, HUB_FILE_BYTES)
    except httpx.HTTPError as exc:
        raise CapsimUserError(
            f"model '{repo}' is not in the catalog and the Hugging Face Hub could not be "
            f"reached ({type(exc).__name__})",
            hint=offline_hint,
        ) from None
    except TimeoutError:
        raise CapsimUserError(
            f"the Hub did not send {filename} of '{repo}' whole within {FETCH_TIMEOUT_S:g} s",
            hint=offline_hint,
        ) from None
    except ValueError as exc:  # past HUB_FILE_BYTES
        raise CapsimUserError(f"{filename} of '{repo}' from the Hub {exc}") from None
    if status == 404 and optional:
        return None
    if status in (401, 403):
        raise CapsimUserError(
            f"the Hub refused {filename} of '{repo}' (HTTP {status}): a gated or private repo",
            hint="set HF_TOKEN to a token with access, or pass the config.json path",
        )
    if status == 404:
        raise CapsimUserError(
            f"no model '{repo}' on the Hugging Face Hub (or it has no {filename})",
            hint="check the id, or pass a catalog name (capsim models) or a config.json path",
        )
    if status != 200:
        raise CapsimUserError(
            f"the Hub answered HTTP {status} for {filename} of '{repo}'",
            hint=offline_hint,
        )
    from capsim.files import loads_json

    try:
        text = body.decode("utf-8")
        data = loads_json(text)
    except ValueError as exc:  # not UTF-8, not JSON, nested past the limits
        raise CapsimUserError(
            f"{filename} of '{repo}' from the Hub is not JSON capsim reads ({str(exc)[:120]})"
        ) from None
    if not isinstance(data, dict):
        raise CapsimUserError(f"{filename} of '{repo}' from the Hub is not a JSON object")
    write_text_atomic(cached, text)
    return data


HUB_FILE_BYTES = 4 * 2**20
"""The most of a Hub file capsim reads, decoded (a config.json is a few kB; a gzip bomb
or a server that never stops sending was read whole)."""


def fetch_bounded(url: str, headers: dict, seconds: float, max_bytes: int) -> tuple[int, bytes]:
    """(status, body) of a GET of ``url``, its body decoded and at most ``max_bytes`` (a
    ValueError beyond), the whole answer within ``seconds`` (a TimeoutError beyond: a
    server that drips a byte at a time never trips a read timeout)."""
    import threading

    outcome: list = []

    def fetch() -> None:
        try:
            outcome.append(_fetch_bounded(url, headers, seconds, max_bytes))
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)

    # a thread of its own, given up after ``seconds``: a server that sends its headers a
    # byte at a time holds httpx inside one read, where no deadline can be checked
    worker = threading.Thread(target=fetch, daemon=True)
    worker.start()
    worker.join(seconds)
    if not outcome:
        raise TimeoutError
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _fetch_bounded(url: str, headers: dict, seconds: float, max_bytes: int) -> tuple[int, bytes]:
    """fetch_bounded's work, in its thread."""
    import time

    import httpx

    deadline = time.monotonic() + seconds
    timeout = httpx.Timeout(seconds)
    with httpx.stream(
        "GET", url, headers=headers, timeout=timeout, follow_redirects=True
    ) as response:
        if response.status_code != 200:
            return response.status_code, b""
        chunks, size = [], 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > max_bytes:
                raise ValueError(f"is more than {max_bytes >> 20} MB")
            chunks.append(chunk)
            if time.monotonic() > deadline:
                raise TimeoutError
        return response.status_code, b"".join(chunks)


def _entry_of_config(
    config: dict[str, Any], name: str, hf_id: str | None, quant_file: dict[str, Any] | None
) -> dict[str, Any]:
    """The catalog entry (a mapping, not yet validated) a config.json describes; raises
    KeyError, TypeError or ValueError on a config whose values are missing or mistyped."""
    cfg = dict(config.get("text_config") or config)
    named = cfg.get("model_type") or config.get("model_type")
    if named is not None and not isinstance(named, str):
        raise ValueError(f"model_type is {named!r}, not a name such as 'llama'")
    model_type = str(named or "unknown")
    cfg = _standard_keys(cfg, model_type)
    num_layers = int(cfg["num_hidden_layers"])
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    vocab = int(cfg["vocab_size"])
    entry: dict[str, Any] = {
        "name": name,
        "display_name": name,
        "hf_id": hf_id or str(config.get("_name_or_path") or name),
        "architecture": model_type,
        "num_layers": num_layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": int(cfg.get("num_key_value_heads") or heads),
        "vocab_size": vocab,
        "tie_word_embeddings": bool(
            cfg.get("tie_word_embeddings", config.get("tie_word_embeddings", True))
        ),
        "attention_bias": bool(cfg.get("attention_bias", model_type in QWEN2_FAMILY)),
        "attn_output_gate": bool(cfg.get("attn_output_gate", model_type in GATED_ATTENTION)),
        "dtype": quant_of_config(cfg, config, quant_file),
    }
    if entry["dtype"] == "fp8" and (block := fp8_weight_block_of_config(cfg, config)):
        entry["fp8_weight_block"] = block
    hybrid = _hybrid_patterns(cfg)
    if cfg.get("intermediate_size_mlp"):  # Llama 4: dense layers' width
        entry["intermediate_size"] = int(cfg["intermediate_size_mlp"])
    elif cfg.get("intermediate_size") and model_type != "gpt_oss":
        entry["intermediate_size"] = int(cfg["intermediate_size"])
    if cfg.get("kv_lora_rank"):
        entry["mla"] = {
            "q_lora_rank": cfg.get("q_lora_rank"),
            "kv_lora_rank": int(cfg["kv_lora_rank"]),
            "qk_nope_head_dim": int(cfg["qk_nope_head_dim"]),
            "qk_rope_head_dim": int(cfg["qk_rope_head_dim"]),
            "v_head_dim": int(cfg["v_head_dim"]),
        }
        entry["head_dim"] = int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"])
    else:
        given = cfg.get("head_dim")
        if given is not None and not int(given) >= 1:  # 0 was read as hidden / heads
            raise ValueError(f"head_dim is {given!r}, not 1 or more")
        entry["head_dim"] = int(given or hidden // heads)
    if hybrid:
        entry["layer_pattern"], entry["ffn_pattern"] = hybrid
    else:
        entry["layer_pattern"] = _layer_pattern(cfg, model_type, num_layers)
    if "sliding_attention" in entry["layer_pattern"]:
        entry["sliding_window"] = int(cfg.get("sliding_window") or cfg["attention_chunk_size"])
    if "mamba" in entry["layer_pattern"]:
        entry["mamba"] = {
            "num_heads": int(cfg["mamba_num_heads"]),
            "head_dim": int(cfg["mamba_head_dim"]),
            "state_size": int(cfg["ssm_state_size"]),
            "n_groups": int(cfg.get("n_groups", 1)),
            "conv_kernel": int(cfg.get("conv_kernel", 4)),
        }
    if str(cfg.get("mlp_hidden_act", "")).lower() in {"relu2", "squared_relu"}:
        entry["mlp_gated"] = False
    if model_type in UNGATED_FFN:
        entry["mlp_gated"] = False
    step = cfg.get("interleave_moe_layer_step")
    if step and int(step) > 1 and (cfg.get("num_local_experts") or cfg.get("num_experts")):
        entry["ffn_pattern"] = ["dense"] * (int(step) - 1) + ["moe"]
    sparse = cfg.get("sparse_attention_config")
    if isinstance(sparse, dict) and sparse.get("use_sparse_attention"):
        # MiniMax-M3's block-sparse attention: an indexer of its own picks the top blocks
        entry["sparse_attention"] = {
            "index_n_heads": int(sparse["sparse_num_index_heads"]),
            "index_head_dim": int(sparse["sparse_index_dim"]),
            "index_topk": int(sparse["sparse_topk_blocks"]) * int(sparse["sparse_block_size"]),
        }
    if cfg.get("index_topk"):
        entry["sparse_attention"] = {
            "index_n_heads": int(cfg["index_n_heads"]),
            "index_head_dim": int(cfg["index_head_dim"]),
            "index_topk": int(cfg["index_topk"]),
        }
    if "linear_attention" in entry["layer_pattern"]:
        entry["linear_attention"] = {
            "num_key_heads": int(cfg["linear_num_key_heads"]),
            "num_value_heads": int(cfg["linear_num_value_heads"]),
            "key_head_dim": int(cfg["linear_key_head_dim"]),
            "value_head_dim": int(cfg["linear_value_head_dim"]),
            "conv_kernel_dim": int(cfg.get("linear_conv_kernel_dim", 4)),
            "state_dtype_bytes": STATE_DTYPE_BYTES.get(
                str(cfg.get("mamba_ssm_dtype", "float32")), 4
            ),
        }
    entry.update(_gemma_attention(cfg, entry))
    moe = _moe(cfg, model_type)
    if moe:
        entry["moe"] = moe
        if cfg.get("dense_intermediate_size") and moe.get("first_dense_layers"):
            entry["intermediate_size"] = int(cfg["dense_intermediate_size"])
    mtp = cfg.get("num_nextn_predict_layers") or cfg.get("mtp_num_hidden_layers")
    if mtp:
        entry["mtp_layers"] = int(mtp)
    if cfg.get("max_position_embeddings"):
        entry["max_position_embeddings"] = int(cfg["max_position_embeddings"])
    return entry


def model_from_hf_config(
    config: dict[str, Any],
    name: str,
    hf_id: str | None = None,
    source: str | None = None,
    quant_file: dict[str, Any] | None = None,
) -> Model:
    """Build a validated Model from a Hugging Face config.json mapping (and the
    checkpoint's hf_quant_config.json, ``quant_file``, where it has one)."""
    where = source or "config.json"
    if not isinstance(config, dict) or not isinstance(config.get("text_config") or {}, dict):
        raise CapsimUserError(
            f"{where}: not a model config (a JSON object with text_config an object where present)"
        )
    try:
        entry = _entry_of_config(config, name, hf_id, quant_file)
    except CapsimUserError:
        raise
    except KeyError as exc:
        raise CapsimUserError(
            f"{where}: lacks {exc.args[0]!r}, which this architecture needs",
            hint="pass the model's own config.json (for multimodal models, the file with "
            "text_config)",
        ) from None
    except (TypeError, ValueError, ArithmeticError, AttributeError, IndexError) as exc:
        raise CapsimUserError(
            f"{where}: a value is not of the type or range a model config holds ({exc})",
            hint="pass the model's own, unedited config.json",
        ) from None
    entry["sources"] = [
        {
            "title": f"{entry['hf_id']} config.json",
            "url": f"https://huggingface.co/{entry['hf_id']}/blob/main/config.json"
            if "/" in entry["hf_id"]
            else None,
            "note": f"imported by 'capsim models import-hf' from {source or 'a config.json'}",
        }
    ]
    try:
        return Model.model_validate(entry)
    except ValidationError as exc:
        raise CapsimUserError(
            format_validation_error(Path(source or "config.json"), exc),
            hint="nothing was written; the config may use keys capsim does not map yet: "
            "write the model's YAML by hand in a --db folder",
        ) from None


def write_model_yaml(model: Model, directory: Path) -> Path:
    """Write a model entry as ``DIRECTORY/models/NAME.yaml``; return the path. A file that
    already holds exactly this entry is left as it is: its modification time is part of the
    cached catalog's key (catalog/cache.py), and rewriting it on every resolution of the
    same config.json (each simulation of a stored run, each worker) made every one of them
    parse the whole catalog's YAML again, about 0.5 s each."""
    data = model.model_dump(mode="json", exclude_defaults=True)
    data = {"name": model.name, **data}
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    path = directory / "models" / f"{model.name}.yaml"
    if _holds_exactly(path, text.encode("utf-8")):
        return path
    return write_text_atomic(path, text)


def _holds_exactly(path: Path, data: bytes) -> bool:
    """Whether ``path`` is a regular file (not a link) whose bytes are ``data``; its size
    is compared first, so a large or foreign file is never read."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size != len(data):
            return False
        return path.read_bytes() == data
    except OSError:
        return False
