"""KV-cache and recurrent-state bytes per GPU, by layer type: what one token of context (or
one sequence, for state) costs in memory and in reads.

KV cache per layer type (per token of context, per GPU):

* full attention: 2 (K and V) x kv_heads_per_gpu x head_dim x kv_dtype_bytes, in the
  full layers' own head shape where the model gives them one (Gemma 4's global_head_dim)
* sliding-window attention: the same per token, but a sequence never holds more than
  ``sliding_window`` tokens of it
* MLA (DeepSeek): (kv_lora_rank + qk_rope_head_dim) x kv_dtype_bytes, one latent shared by
  all heads and replicated on every TP rank (vLLM does not shard the latent cache)
* linear attention (Gated DeltaNet): no per-token cache; a fixed state per sequence of
  value_heads_per_gpu x key_head_dim x value_head_dim x state_dtype_bytes plus the
  convolution window (conv_kernel - 1) x conv_channels_per_gpu x 2 bytes

Layers that share an earlier layer's KV (Gemma 3n/4 num_kv_shared_layers) add none.
All byte counts are per GPU of one tensor-parallel group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from capsim.arguments import require_entries
from capsim.catalog.model_schema import Model
from capsim.physics.dtypes import ACTIVATION_BYTES, kv_dtype_bytes

BLOCK_SIZE_TOKENS = 16
"""vLLM's default paged-KV block size, tokens per block."""


def kv_heads_per_gpu(model: Model, tp: int) -> float:
    """KV heads each GPU stores: heads are split over TP, and replicated when fewer than TP."""
    return max(1.0, model.num_kv_heads / tp)


@dataclass(frozen=True)
class KVLayout:
    """KV-cache and state cost per GPU, by layer type.

    Attributes:
        full_bytes_per_token: bytes per context token over full-attention and MLA layers.
        sliding_bytes_per_token: bytes per token over sliding-window layers (a sequence
            holds at most ``sliding_window`` tokens of these).
        sliding_window: tokens, or None.
        state_bytes_per_sequence: fixed linear-attention state per sequence.
        per_layer_type: bytes per token (or per sequence for state) of one layer of each type.
    """

    full_bytes_per_token: float
    sliding_bytes_per_token: float
    sliding_window: int | None
    state_bytes_per_sequence: float
    per_layer_type: dict[str, float] = field(default_factory=dict)

    @property
    def bytes_per_token(self) -> float:
        """Bytes per token of the paged pool (full + sliding layers), what vLLM's block holds."""
        return self.full_bytes_per_token + self.sliding_bytes_per_token

    def sequence_bytes(self, context_tokens: float) -> float:
        """Memory one sequence of ``context_tokens`` holds, in whole 16-token blocks."""
        blocks = math.ceil(context_tokens / BLOCK_SIZE_TOKENS)
        tokens = blocks * BLOCK_SIZE_TOKENS
        sliding_tokens = tokens
        if self.sliding_window is not None:
            sliding_tokens = min(tokens, window_held_tokens(self.sliding_window))
        return (
            tokens * self.full_bytes_per_token
            + sliding_tokens * self.sliding_bytes_per_token
            + self.state_bytes_per_sequence
        )


def per_rank_share(layout: KVLayout, ranks: int) -> KVLayout:
    """``layout`` as one GPU reads it for a whole step's sequences when ``ranks``
    data-parallel attention ranks split them evenly (SGLang's --enable-dp-attention): every
    byte per token or sequence over ``ranks``. 1: ``layout`` itself."""
    if ranks == 1:
        return layout
    return KVLayout(
        layout.full_bytes_per_token / ranks,
        layout.sliding_bytes_per_token / ranks,
        layout.sliding_window,
        layout.state_bytes_per_sequence / ranks,
        {kind: value / ranks for kind, value in layout.per_layer_type.items()},
    )


def window_held_tokens(window: int) -> int:
    """Tokens of a sliding-window layer a long sequence holds: its window in whole
    16-token blocks, plus the partial block being written."""
    return (math.ceil(window / BLOCK_SIZE_TOKENS) + 1) * BLOCK_SIZE_TOKENS


def kv_layout(
    model: Model, kv_dtype: str = "auto", tp: int = 1, shared_layers_allocated: bool = False
) -> KVLayout:
    """KV-cache bytes per token and state bytes per sequence, per GPU, by layer type.
    ``shared_layers_allocated``: KV-shared layers (Gemma 3n/4) get cache buffers of their
    own although they read an earlier layer's (SGLang's pools count every layer)."""
    if not isinstance(model, Model):
        require_entries(model=model)  # the Python API's: a name where the Model is taken
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        from capsim.errors import CapsimUserError

        raise CapsimUserError(f"tp must be a whole number of 1 or more, got {tp!r}")
    elem = kv_dtype_bytes(kv_dtype, model)
    per_type: dict[str, float] = {}
    if model.mla is not None:
        full_layer = sliding_layer = (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) * elem
        per_type["mla"] = full_layer
    else:
        full_layer = _kv_entry_bytes(model, "full_attention", tp, elem)
        sliding_layer = _kv_entry_bytes(model, "sliding_attention", tp, elem)
    # KV-shared layers (Gemma 3n/4) read an earlier layer's cache and keep none of their own
    # (unless the engine allocates them anyway)
    count = model.count_layers if shared_layers_allocated else model.count_cache_layers
    n_full = count("full_attention")
    n_sliding = count("sliding_attention")
    n_linear = model.count_layers("linear_attention")
    if n_full and model.mla is None:
        per_type["full_attention"] = full_layer
    if n_sliding:
        per_type["sliding_attention"] = sliding_layer
    state = 0.0
    if n_linear:
        la = model.linear_attention
        assert la is not None
        v_heads = la.num_value_heads / tp
        k_heads = la.num_key_heads / tp
        recurrent = v_heads * la.key_head_dim * la.value_head_dim * la.state_dtype_bytes
        conv_channels = 2 * k_heads * la.key_head_dim + v_heads * la.value_head_dim
        conv = (la.conv_kernel_dim - 1) * conv_channels * ACTIVATION_BYTES
        per_type["linear_attention_state_per_sequence"] = recurrent + conv
        state = n_linear * (recurrent + conv)
    n_mamba = model.count_layers("mamba")
    if n_mamba:
        mb = model.mamba
        assert mb is not None
        ssm = mb.num_heads / tp * mb.head_dim * mb.state_size * mb.state_dtype_bytes
        conv_channels = (mb.inner_size + 2 * mb.n_groups * mb.state_size) / tp
        conv = (mb.conv_kernel - 1) * conv_channels * ACTIVATION_BYTES
        per_type["mamba_state_per_sequence"] = ssm + conv
        state += n_mamba * (ssm + conv)
    return KVLayout(
        full_bytes_per_token=n_full * full_layer,
        sliding_bytes_per_token=n_sliding * sliding_layer,
        sliding_window=model.sliding_window if n_sliding else None,
        state_bytes_per_sequence=state,
        per_layer_type=per_type,
    )


def _kv_entry_bytes(model: Model, kind: str, tp: int, elem: float) -> float:
    """Bytes per token of one attention layer's K and V on one GPU, in that layer kind's
    own head shape (Model.attention_shape). Keys that double as values (Gemma 4's
    attention_k_eq_v) are still counted as two entries: whether an engine stores the one
    tensor once is not sourced here."""
    head_dim, kv_heads = model.attention_shape(kind)  # type: ignore[arg-type]
    return 2 * max(1.0, kv_heads / tp) * head_dim * elem


def kv_bytes_per_token(model: Model, kv_dtype: str = "auto", tp: int = 1) -> float:
    """KV-cache bytes per token of context per GPU, over all attention layers (sliding
    layers counted per token, as long as the context is within the window)."""
    return kv_layout(model, kv_dtype, tp).bytes_per_token


def window_pool_layout(layout: KVLayout, full_tokens_ratio: float) -> KVLayout:
    """The layout of a full-attention pool whose sliding-window layers have a pool apart
    of ``full_tokens_ratio`` times its tokens (SGLang's hybrid SWA memory): one full-pool
    token costs the full layers' bytes plus that share of the sliding layers' (bytes per
    token), and a sequence holds its whole context in it, so no window limits what it
    takes."""
    return KVLayout(
        full_bytes_per_token=layout.full_bytes_per_token
        + full_tokens_ratio * layout.sliding_bytes_per_token,
        sliding_bytes_per_token=0.0,
        sliding_window=None,
        state_bytes_per_sequence=layout.state_bytes_per_sequence,
        per_layer_type=layout.per_layer_type,
    )


def window_pages_layout(layout: KVLayout) -> KVLayout:
    """The layout of a paged pool whose sliding-window layers keep only their window
    (vLLM's hybrid KV cache manager): a sequence holds every token of the full layers and
    about a window of the sliding ones, so the window's pages are counted as a fixed part
    of each running sequence (as a recurrent state is) and a pool token costs the full
    layers' bytes alone. A sequence shorter than its window is charged the whole window
    (more than it holds); a model without full layers keeps the layout as it is."""
    if not (
        layout.sliding_window and layout.sliding_bytes_per_token and layout.full_bytes_per_token
    ):
        return layout
    window_tokens = window_held_tokens(layout.sliding_window)
    return KVLayout(
        full_bytes_per_token=layout.full_bytes_per_token,
        sliding_bytes_per_token=0.0,
        sliding_window=None,
        state_bytes_per_sequence=layout.state_bytes_per_sequence
        + window_tokens * layout.sliding_bytes_per_token,
        per_layer_type=layout.per_layer_type,
    )
