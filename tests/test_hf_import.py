"""import-hf: a Hugging Face config.json becomes a catalog entry equal to the hand-written one."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from capsim.catalog.hf_import import compress_pattern, model_from_hf_config
from capsim.catalog.loader import load_catalog
from capsim.cli.main import app
from capsim.physics.kv_layout import kv_layout
from capsim.physics.parameters import parameter_breakdown

# Key/value pairs as they appear in each model's config.json (see the catalog sources).
QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
}
QWEN35 = {
    "model_type": "qwen3_5",
    "text_config": {
        "model_type": "qwen3_5_text",
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": 64,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "attn_output_gate": True,
        "full_attention_interval": 4,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "mamba_ssm_dtype": "float32",
        "mtp_num_hidden_layers": 1,
        "vocab_size": 248320,
        "tie_word_embeddings": False,
        "max_position_embeddings": 262144,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    },
}
QWEN35["text_config"]["layer_types"] = (["linear_attention"] * 3 + ["full_attention"]) * 16
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "first_k_dense_replace": 3,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_nextn_predict_layers": 1,
    "vocab_size": 129280,
    "tie_word_embeddings": False,
    "max_position_embeddings": 163840,
    "quantization_config": {"quant_method": "fp8"},
}
GPT_OSS = {
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_hidden_layers": 24,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "vocab_size": 201088,
    "tie_word_embeddings": False,
    "attention_bias": True,
    "max_position_embeddings": 131072,
    "quantization_config": {"quant_method": "mxfp4"},
}


@pytest.mark.parametrize(
    ("config", "catalog_name"),
    [
        (QWEN3_MOE, "qwen3-coder-30b-a3b"),
        (QWEN35, "qwen3.5-27b"),
        (DEEPSEEK_V3, "deepseek-v3"),
        (GPT_OSS, "gpt-oss-20b"),
    ],
)
def test_import_matches_hand_written_entry(config, catalog_name):
    imported = model_from_hf_config(config, name="imported", hf_id="org/imported")
    reference = load_catalog().model(catalog_name)
    assert parameter_breakdown(imported) == parameter_breakdown(reference)
    assert kv_layout(imported) == kv_layout(reference)
    assert imported.dtype == reference.dtype


def test_compress_pattern():
    assert compress_pattern(["a", "b"] * 5) == ["a", "b"]
    assert compress_pattern(["x"] * 7) == ["x"]
    assert compress_pattern(["a", "b", "a"]) == ["a", "b"]  # expands cyclically to a, b, a
    assert compress_pattern(["a", "a", "b"]) == ["a", "a", "b"]


def test_cli_import_writes_loadable_yaml(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(QWEN3_MOE))
    runner = CliRunner()
    r = runner.invoke(
        app,
        [
            "models",
            "import-hf",
            str(cfg),
            "--name",
            "my-moe",
            "--hf-id",
            "me/my-moe",
            "--out",
            str(tmp_path / "db"),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    path = json.loads(r.stdout)["path"]
    assert path.endswith("models/my-moe.yaml")
    r = runner.invoke(
        app,
        [
            "--db",
            str(tmp_path / "db"),
            "fit",
            "--gpu",
            "rtx3090",
            "--model",
            "my-moe",
            "--quant",
            "awq-int4",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["kv_bytes_per_token"] == 98304


def test_cli_import_errors(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["models", "import-hf", str(tmp_path / "none.json"), "--name", "x"])
    assert r.exit_code == 2 and "does not exist" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = runner.invoke(app, ["models", "import-hf", str(bad), "--name", "x"])
    assert r.exit_code == 2 and "not valid JSON" in r.stderr
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"hidden_size": 10}))
    r = runner.invoke(app, ["models", "import-hf", str(partial), "--name", "x"])
    assert r.exit_code == 2 and "num_hidden_layers" in r.stderr


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"num_experts": 0}, "0 experts, yet 8 routed a token"),
        ({"head_dim": 0}, "head_dim is 0, not 1 or more"),
        ({"quantization_config": {"quant_method": "awq", "bits": "x"}}, "bits is 'x'"),
        ({"quantization_config": {"quant_method": "gptq", "bits": 0}}, "bits is 0"),
        ({"torch_dtype": "int3"}, "the checkpoint's weights are 'int3'"),
    ],
)
def test_a_config_of_nonsense_is_not_imported(tmp_path, change, words):
    """Issue 47's third audit: 0 experts became a dense model, head_dim 0 became
    hidden / heads, bits 'x' or 0 became 4, and torch_dtype int3 wrote 'dtype: int3' that
    the catalog then could not read."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_MOE | change))
    out = tmp_path / "db"
    r = CliRunner().invoke(
        app, ["models", "import-hf", str(path), "--name", "x", "--out", str(out)]
    )
    assert r.exit_code == 2 and words in r.stderr, r.stderr
    assert not out.exists()


# Older architectures' config.json, key for key as transformers writes them
PYTHIA_160M = {  # EleutherAI/pythia-160m
    "architectures": ["GPTNeoXForCausalLM"],
    "model_type": "gpt_neox",
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "rotary_pct": 0.25,
    "tie_word_embeddings": False,
    "vocab_size": 50304,
    "torch_dtype": "float16",
}
GPT2 = {  # openai-community/gpt2
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "activation_function": "gelu_new",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_inner": None,
    "n_layer": 12,
    "n_positions": 1024,
    "vocab_size": 50257,
}
FALCON_7B = {  # tiiuae/falcon-7b
    "architectures": ["FalconForCausalLM"],
    "model_type": "falcon",
    "hidden_size": 4544,
    "multi_query": True,
    "new_decoder_architecture": False,
    "num_attention_heads": 71,
    "num_hidden_layers": 32,
    "parallel_attn": True,
    "bias": False,
    "vocab_size": 65024,
    "torch_dtype": "bfloat16",
}


def test_older_architectures_import_with_their_own_key_names_and_ungated_mlps():
    # Pythia paper (Biderman et al. 2023, arXiv 2304.01373, Table 1): pythia-160m has
    # 85,056,000 non-embedding and 162,322,944 total parameters; capsim counts weight
    # matrices and norms, not biases (12 x 6,912 + 768 more), so 0.1% fewer
    pythia = model_from_hf_config(PYTHIA_160M, "pythia-160m")
    assert not pythia.mlp_gated and pythia.num_kv_heads == 12
    b = parameter_breakdown(pythia)
    assert b.attention + b.mlp + b.norms == pytest.approx(85_056_000, rel=0.002)
    assert b.total == pytest.approx(162_322_944, rel=0.002)
    # GPT-2's n_layer / n_embd / n_head, its MLP 4 x n_embd (n_inner null), tied
    # embeddings: the model card's 124M, less the 0.8M learned positions capsim leaves out
    gpt2 = model_from_hf_config(GPT2, "gpt2")
    assert (gpt2.num_layers, gpt2.hidden_size, gpt2.num_attention_heads) == (12, 768, 12)
    assert gpt2.intermediate_size == 3072 and not gpt2.mlp_gated
    assert parameter_breakdown(gpt2).total == pytest.approx(124e6, rel=0.01)
    # Falcon-7B's multi-query attention: one KV head of 64 (4,544 / 71), so its KV cache
    # holds 2 x 32 layers x 64 values a token; MLP 4 x 4,544 without a gate
    falcon = model_from_hf_config(FALCON_7B, "falcon-7b")
    assert falcon.num_kv_heads == 1 and falcon.head_dim == 64
    assert falcon.intermediate_size == 4 * 4544 and not falcon.mlp_gated
    # 4,544^2 x 2 + 2 x 64 x 4,544 a layer for attention, 2 x 4,544 x 18,176 for the MLP
    attention = 32 * (2 * 4544**2 + 2 * 64 * 4544)
    assert parameter_breakdown(falcon).attention == attention
    assert parameter_breakdown(falcon).mlp == 32 * 2 * 4544 * 18176
