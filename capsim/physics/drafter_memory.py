"""The speculative drafter's share of GPU memory: its weights and its KV cache.

vLLM V1 loads the drafter beside the target and registers the drafter's attention layers
in the same forward context, so the KV cache manager gives them pages of the one pool: a
token of context then costs the target's layers plus the drafter's (vllm/v1/spec_decode:
``draft_attn_layer_names = get_layers_from_vllm_config(...).keys() -
target_attn_layer_names`` for the EAGLE, MTP and draft-model proposers). The drafter's
weights come out of the same memory budget before the pool is sized.

- ``draft``: a separate model, all its weights (at the format the step model runs it in,
  ``draft_format``) over the target's TP group, and every attention layer's KV.
- ``eagle``: one decoder layer (attention, the dense FFN of the target's last layer) and
  the fc that fuses the target's hidden states (2 h^2), sharing the target's embedding
  and head: the layer the step model reads per draft pass (physics/draft_terms.py), and
  one attention layer's KV in the target's shape.
- ``mtp``: the model's MTP weights (memory.weight_bytes' ``include_mtp``, which
  memory_fit sets for an MTP drafter) and
  ``mtp_layers`` attention layers' KV in the target's shape.
- ``ngram``: nothing on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from capsim.catalog.loader import Catalog
from capsim.catalog.model_schema import Model, QuantFormat
from capsim.physics.kv_layout import kv_layout
from capsim.physics.parameters import attention_params, layer_ffn_params


@dataclass(frozen=True)
class Drafter:
    """What speculative decoding adds to the GPU's memory.

    Attributes:
        method: 'mtp', 'eagle' or 'draft' (speculative.SpecConfig.method).
        draft_model: the separate draft model (method 'draft').
        draft_fmt: its weight format.
    """

    method: str
    draft_model: Model | None = None
    draft_fmt: QuantFormat | None = None


def draft_format(catalog: Catalog, quant: str | None, draft_model: Model) -> QuantFormat:
    """The format a draft model runs in: the deployment's ``quant`` where it names one,
    else the draft model's release format (what build_step_model times it in)."""
    return catalog.quant(quant or draft_model.dtype)


VOCABULARY_PADDING = 0.01
"""How far a draft model's vocabulary size may differ from the target's and still be the
same tokenizer's: checkpoints of one family pad the embedding differently (Qwen2.5's 0.5B
has 151,936 rows, its 72B 152,064: 0.08%), a different tokenizer differs by far more
(Llama 3's 128,256 against Qwen3's 151,936: 16%)."""


def drafter_for(
    catalog: Catalog, spec, quant: str | None, target: Model | None = None
) -> Drafter | None:
    """The drafter ``spec`` (a SpecConfig, or None) loads on the GPU; None for none or
    n-gram lookup (which runs on the CPU). A draft model whose vocabulary is not the
    ``target``'s (where given) is refused: its tokens are not the target's, so vLLM and
    SGLang cannot verify them."""
    if spec is None or spec.method == "ngram":
        return None
    if spec.method == "draft":
        model = catalog.model(spec.draft_model)
        if target is not None:
            check_draft_vocabulary(model, target)
            if model.name == target.name:
                from capsim.errors import CapsimUserError

                # a drafter as slow as the target: every step runs the model k + 1 times
                raise CapsimUserError(
                    f"--spec draft:{spec.draft_model}: the draft model is the model served",
                    hint="draft with a smaller model of the same tokenizer (e.g. a 1B "
                    "sibling), or use mtp, eagle or ngram",
                )
        return Drafter("draft", model, draft_format(catalog, quant, model))
    return Drafter(spec.method)


def check_draft_vocabulary(draft: Model, target: Model) -> None:
    """A draft model must share the target's tokenizer; sizes further apart than
    VOCABULARY_PADDING are two tokenizers."""
    from capsim.errors import CapsimUserError

    if abs(draft.vocab_size - target.vocab_size) > VOCABULARY_PADDING * target.vocab_size:
        raise CapsimUserError(
            f"draft model {draft.name} has a vocabulary of {draft.vocab_size:,} tokens and "
            f"{target.name} one of {target.vocab_size:,}: a draft model must use the "
            "target's tokenizer, or its tokens cannot be verified",
            hint=f"draft with a smaller model of {target.name}'s family, or use "
            "--spec ngram:K, eagle:K or mtp:K",
        )


def eagle_layer_weight_count(model: Model) -> float:
    """Weights of an EAGLE head's decoder layer and fc for ``model`` (count): attention,
    the dense FFN of the last layer (shared experts included) and the 2 h^2 fc."""
    ffn = layer_ffn_params(model, model.num_layers - 1)
    dense_ffn = ffn.get("mlp", 0) + ffn.get("shared", 0)
    return attention_params(model) + dense_ffn + 2 * model.hidden_size**2


def drafter_weight_bytes(drafter: Drafter | None, model: Model, fmt: QuantFormat, tp: int) -> float:
    """Bytes per GPU of the drafter's own weights (MTP's come with the model's:
    memory.weight_bytes' include_mtp). ``model``/``fmt``: the target's; ``tp``: the
    group both are split over."""
    if drafter is None or drafter.method == "mtp":
        return 0.0
    if drafter.method == "eagle":
        return eagle_layer_weight_count(model) * fmt.bits_per_weight / 8 / tp
    from capsim.physics.memory import weight_bytes

    assert drafter.draft_model is not None and drafter.draft_fmt is not None
    return sum(weight_bytes(drafter.draft_model, drafter.draft_fmt, tp).values())


def drafter_kv_bytes_per_token(
    drafter: Drafter | None, model: Model, kv_dtype: str, attention_tp: int
) -> float:
    """Bytes per token of context per GPU that the drafter's attention layers add to the
    pool (every token a sequence holds has them, like the target's full-attention
    layers; a draft model's sliding-window layers are counted per token too, an upper
    bound)."""
    if drafter is None:
        return 0.0
    if drafter.method == "draft":
        assert drafter.draft_model is not None
        return kv_layout(drafter.draft_model, kv_dtype, attention_tp).bytes_per_token
    per_type = kv_layout(model, kv_dtype, attention_tp).per_layer_type
    one_layer = per_type.get("mla") or per_type.get("full_attention")
    if one_layer is None:  # a model of sliding and linear layers: a full layer's shape
        one_layer = per_type.get("sliding_attention", 0.0)
    layers = max(model.mtp_layers, 1) if drafter.method == "mtp" else 1
    return layers * one_layer
