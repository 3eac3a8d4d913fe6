"""Build tiny models that vLLM's CPU build can serve: Qwen3 (dense), Qwen3-MoE and Llama for
the live tests; a wider Llama and ten other architectures for probing the CPU host's priors.

No weights can be downloaded here, so the models are made locally: a byte-level BPE
tokenizer trained on local text (Python's own source and docs), configs with a few small
layers, random weights, ``save_pretrained``. Runs in the vLLM virtual environment:

    VENV/bin/python tests/live/build_tiny_models.py OUT_DIR          # the live tests' three
    VENV/bin/python tests/live/build_tiny_models.py OUT_DIR wide     # wide-llama
    VENV/bin/python tests/live/build_tiny_models.py OUT_DIR archs    # arch-* (ARCHITECTURES)
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path


def corpus() -> list[str]:
    """Local text to train the tokenizer on: the standard library's source files."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in sorted(lib.glob("*.py"))[:200]:
        try:
            texts.append(path.read_text(encoding="utf-8", errors="ignore"))
        except OSError:
            continue
    return texts


def build_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4096,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}<|im_start|>assistant\n"
    )
    fast.save_pretrained(out)
    return fast


def build(out_dir: Path) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    common = dict(
        vocab_size=4096,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        eos_token_id=0,
        bos_token_id=0,
    )
    dense_dir = out_dir / "tiny-qwen3"
    moe_dir = out_dir / "tiny-qwen3-moe"
    for path in (dense_dir, moe_dir):
        path.mkdir(parents=True, exist_ok=True)
        build_tokenizer(path)
    dense = Qwen3ForCausalLM(Qwen3Config(intermediate_size=768, **common)).to(torch.bfloat16)
    dense.save_pretrained(dense_dir)
    moe_config = Qwen3MoeConfig(
        intermediate_size=768,
        moe_intermediate_size=128,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        **common,
    )
    Qwen3MoeForCausalLM(moe_config).to(torch.bfloat16).save_pretrained(moe_dir)
    build_llama(out_dir)
    print(f"built {dense_dir}, {moe_dir} and {out_dir / 'tiny-llama'}")


def build_llama(out_dir: Path) -> None:
    """The third shape: a Llama-family model three times as deep and twice as wide as the
    Qwen3 pair (12 layers, hidden 512, 8 query and 4 KV heads, tied embeddings; 36M
    parameters), so the calibration loop is tried on a shape no class default was set on."""
    _save_llama(out_dir / "tiny-llama", 1, hidden=512, intermediate=1376, layers=12, heads=8)


def build_wide_llama(out_dir: Path) -> None:
    """Not used by the live tests: a wider, shallower Llama (6 layers, hidden 1536, 12 query
    and 4 KV heads, tied embeddings; 157M parameters, 315 MB in bf16, ten times this host's
    L3) whose decode step is dominated by reading its weights from DRAM, probed once to tell
    the CPU's weight-read rate from its per-layer cost (hardware_db/efficiency/cpu-host.yaml;
    calibration/runs/wide-llama-2026-11-27)."""
    _save_llama(out_dir / "wide-llama", 2, hidden=1536, intermediate=4096, layers=6, heads=12)


def _save_llama(
    path: Path, seed: int, hidden: int, intermediate: int, layers: int, heads: int
) -> None:
    """A random bf16 Llama with 4 KV heads, a 4,096-token vocabulary and tied embeddings,
    with the shared tokenizer, saved in ``path``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    path.mkdir(parents=True, exist_ok=True)
    build_tokenizer(path)
    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
        eos_token_id=0,
        bos_token_id=0,
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)


ARCHITECTURES = {
    # name: (transformers config class, model class, shape); every one a 4,096-token
    # vocabulary, random bf16 weights and the shared tokenizer. Most are 4 layers of hidden
    # 256 like tiny-qwen3, so what differs is the architecture's own kernels; granite and
    # midqwen2 add depth and width (midqwen2: 189 MB, six times this host's L3).
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            hidden_size=256,
            intermediate_size=768,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            max_position_embeddings=4096,
            sliding_window=512,
        ),
    ),
    "opt": (
        "OPTConfig",
        "OPTForCausalLM",
        dict(
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            ffn_dim=1024,
            max_position_embeddings=2048,
            word_embed_proj_dim=256,
        ),
    ),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(hidden_size=256, intermediate_size=768)),
    "gpt2": (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(n_embd=256, n_layer=4, n_head=4, n_positions=2048),
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(hidden_size=256, intermediate_size=512, num_local_experts=4, num_experts_per_tok=2),
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(hidden_size=256, intermediate_size=768)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(hidden_size=256, intermediate_size=768)),
    "stablelm": (
        "StableLmConfig",
        "StableLmForCausalLM",
        dict(hidden_size=256, intermediate_size=768),
    ),
    "midqwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=4,
        ),
    ),
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        dict(
            hidden_size=384,
            intermediate_size=1024,
            num_hidden_layers=8,
            num_attention_heads=6,
            num_key_value_heads=2,
        ),
    ),
}
"""Shapes not given take the Llama-style defaults of ``build_architectures``."""


def build_architectures(out_dir: Path) -> None:
    """Not used by the live tests: ten small random models of other architectures
    (``ARCHITECTURES``, saved as ``arch-NAME``), probed once to set the CPU host's per-step
    and per-layer priors on more than the live tests' three shapes
    (calibration/runs/archs-2026-11-27)."""
    import torch
    import transformers

    defaults = dict(
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    for name, (config_cls, model_cls, shape) in ARCHITECTURES.items():
        torch.manual_seed(3)
        path = out_dir / f"arch-{name}"
        path.mkdir(parents=True, exist_ok=True)
        build_tokenizer(path)
        config_type = getattr(transformers, config_cls)
        known = config_type().to_dict()
        kwargs = {k: v for k, v in defaults.items() if k in known}
        kwargs.update(shape)
        config = config_type(
            vocab_size=4096, eos_token_id=0, bos_token_id=0, pad_token_id=0, **kwargs
        )
        config.torch_dtype = "bfloat16"
        if name not in ("gpt2", "opt"):
            config.tie_word_embeddings = False
        getattr(transformers, model_cls)(config).to(torch.bfloat16).save_pretrained(path)
        print(f"built {path}")


BUILDERS = {"llama": build_llama, "wide": build_wide_llama, "archs": build_architectures}
"""What the second argument builds; without one, the live tests' three models (``build``)."""

if __name__ == "__main__":
    which = sys.argv[2] if len(sys.argv) > 2 else None
    BUILDERS.get(which, build)(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-models"))
