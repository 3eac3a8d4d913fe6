"""CUDA-graph capture sizes and the padding they impose on a step's token count.

Each serving engine captures its own sizes (``graph_sizes`` picks by the engine's
``graph_capture``): vLLM's below, SGLang's batch sizes (``sglang_capture_sizes``), a graph
for single-token steps only (llama.cpp) or none.

vLLM (V1) captures one CUDA graph per token count in ``cudagraph_capture_sizes`` and pads a
step's tokens up to the smallest captured size that holds them; a step with more tokens
than the largest size runs without a graph and without padding. The default sizes
(``vllm/config/vllm.py``, ``_set_cudagraph_sizes``) are

    [1, 2, 4] + range(8, 256, 8) + range(256, max_size + 1, 16)
    max_size = min(max_num_seqs x decode_query_len x 2, 512), then min(.., max_num_batched_tokens)

(the largest size is the last of that list, not ``max_size`` itself), with
``max_num_batched_tokens`` added when it falls below ``max_size``, and, with
speculative decoding, every size rounded up to a multiple of ``decode_query_len``
(1 + speculative tokens; ``adjust_cudagraph_sizes_for_spec_decode``), sizes above
``max_size`` dropped.

Padding costs little where a step reads weights once whatever its width (dense layers in
decode), but padded rows run through the MoE router like real tokens (vLLM PR #46428:
"these padding tokens are handled the same way as real tokens"; opting out with
VLLM_MOE_SKIP_PADDING=1 came in mid-2026), so they touch extra experts: three decoding
sequences on a server whose graphs are [1, 2, 4, 8] read the experts of four tokens.
"""

from __future__ import annotations

from bisect import bisect_left

#: vLLM's default ceiling on the largest captured size (tokens)
DEFAULT_MAX_CAPTURE_TOKENS = 512


def capture_sizes(
    max_num_seqs: int,
    max_num_batched_tokens: int | None = None,
    decode_query_len: int = 1,
    ceiling: int = DEFAULT_MAX_CAPTURE_TOKENS,
) -> tuple[int, ...]:
    """Token counts vLLM captures CUDA graphs for, ascending.

    Args:
        max_num_seqs: the scheduler's sequence limit.
        max_num_batched_tokens: the scheduler's token budget (None = no cap from it).
        decode_query_len: tokens per decoding sequence per step (1 + speculative tokens).
        ceiling: the largest size vLLM will capture by default (512, 1,024 on datacenter
            Blackwell; 0 where the platform has no CUDA graphs).
    """
    if ceiling <= 0 or max_num_seqs <= 0:
        return ()
    largest = min(max_num_seqs * decode_query_len * 2, ceiling)
    if max_num_batched_tokens is not None:
        largest = min(largest, max_num_batched_tokens)
    if largest < 1:
        return ()
    sizes = {1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)}
    sizes = {s for s in sizes if s <= largest}
    if max_num_batched_tokens is not None and max_num_batched_tokens <= largest:
        sizes.add(max_num_batched_tokens)
    if decode_query_len > 1:
        q = decode_query_len
        sizes = {-(-s // q) * q for s in sizes}
        sizes = {s for s in sizes if s <= largest} or ({q} if q <= largest else set())
    return tuple(sorted(sizes))


def padded_tokens(tokens: float, sizes: tuple[int, ...]) -> float:
    """Tokens a step's graphed kernels process: the smallest captured size holding
    ``tokens``, or ``tokens`` itself when it exceeds every size (the step runs eager)."""
    if not sizes or tokens > sizes[-1] or tokens <= 0:
        return tokens
    return float(sizes[bisect_left(sizes, tokens)])


def sglang_capture_sizes(max_batch: int, decode_query_len: int = 1) -> tuple[int, ...]:
    """Token counts SGLang's decode CUDA graphs hold, ascending: one graph per batch size
    (sequences) in its default list up to ``max_batch`` (cuda_graph_max_bs), each holding
    ``decode_query_len`` tokens a sequence (SGLang server_args
    ``_generate_cuda_graph_batch_sizes``: [1, 2, 4, 8, 12] + 16..256 step 8 + 272..<512
    step 16 + 512.. step 32; with speculation 1..8, 10..32 step 2, 40..64 step 4, 72..256
    step 8, 272.. step 16)."""
    if max_batch <= 0:
        return ()
    if decode_query_len > 1:
        batches = [
            *range(1, 9),
            *range(10, 33, 2),
            *range(40, 65, 4),
            *range(72, 257, 8),
            *range(272, max_batch + 1, 16),
        ]
    else:
        batches = [
            1,
            2,
            4,
            8,
            12,
            *range(16, 257, 8),
            *range(272, 512, 16),
            *range(512, max_batch + 1, 32),
        ]
    return tuple(sorted({b * decode_query_len for b in batches if b <= max_batch}))


def graph_sizes(
    scheme: str,
    max_num_seqs: int,
    max_num_batched_tokens: int | None = None,
    decode_query_len: int = 1,
    ceiling: int = DEFAULT_MAX_CAPTURE_TOKENS,
    max_batch: int | None = None,
) -> tuple[int, ...]:
    """Token counts an engine runs in CUDA graphs, ascending, by its ``graph_capture``
    scheme: 'vllm' (``capture_sizes``), 'vllm-v0' (decode batches 1, 2, 4, 8, 16, ... up to
    ``max_batch``, 256 by default, and max_num_seqs), 'sglang' (``sglang_capture_sizes`` up to
    ``max_batch`` sequences, at most max_num_seqs), 'single-token' (one decoding sequence
    a step: llama.cpp captures graphs for batch-1 decode only) or 'none'. ``ceiling`` 0
    (a platform without CUDA graphs) gives none under every scheme."""
    if ceiling <= 0 or scheme == "none":
        return ()
    if scheme == "vllm":
        return capture_sizes(max_num_seqs, max_num_batched_tokens, decode_query_len, ceiling)
    if scheme == "sglang":
        batch = min(max_batch if max_batch is not None else 160, max_num_seqs)
        return sglang_capture_sizes(batch, decode_query_len)
    if scheme == "vllm-v0":
        # V0's _BATCH_SIZES_TO_CAPTURE: 1, 2, 4, 8, 16, ..., 256, capped by max_num_seqs
        batch = min(max_batch if max_batch is not None else 256, max_num_seqs)
        sizes = [b for b in (1, 2, 4, *range(8, batch + 1, 8)) if b <= batch]
        return tuple(b * decode_query_len for b in sizes)
    if scheme == "single-token":
        return (decode_query_len,)
    raise ValueError(f"unknown CUDA-graph scheme '{scheme}'")
