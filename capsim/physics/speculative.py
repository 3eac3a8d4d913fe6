"""Speculative decoding: expected tokens per step from the acceptance rate.

A drafter proposes k tokens; the target model verifies k + 1 positions in one step and
keeps the accepted prefix plus one token of its own. With ``acceptance`` given per position
as the probability that drafted position i is accepted (unconditional, as vLLM's
``spec_decode_num_accepted_tokens_per_pos / num_drafts`` reports it), the expected tokens
per step per sequence are

    E = 1 + sum_i p_i

and for a constant conditional acceptance a (p_i = a ** i) this is the geometric sum
(1 - a ** (k + 1)) / (1 - a) (Leviathan et al., "Fast Inference from Transformers via
Speculative Decoding", ICML 2023).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from capsim.errors import CapsimUserError, plain_int

SpecMethod = Literal["mtp", "eagle", "draft", "ngram"]


class SpecConfig(BaseModel):
    """A speculative-decoding configuration.

    Attributes:
        method: mtp (the model's own MTP layers), eagle (an EAGLE head, one layer),
            draft (a separate draft model), ngram (prompt lookup on the CPU).
        num_tokens: k, tokens drafted per step.
        acceptance: a constant conditional acceptance rate, or one unconditional rate per
            drafted position (non-increasing).
        draft_model: catalog name of the draft model (method 'draft').
        topk: branches the drafter keeps per step (1 = a chain; above 1, an EAGLE-style
            tree, SGLang's --speculative-eagle-topk).
        verify_tokens: positions the target verifies per sequence per step (SGLang's
            --speculative-num-draft-tokens); default k + 1 for a chain, 1 + k x topk for
            a tree.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: SpecMethod
    num_tokens: int = Field(ge=1, le=16)
    acceptance: float | tuple[float, ...] = 0.7
    draft_model: str | None = None
    topk: int = Field(1, ge=1, le=16)
    verify_tokens: int | None = Field(None, ge=2, le=256)

    @model_validator(mode="after")
    def _check(self) -> SpecConfig:
        if self.verify_tokens is not None and self.verify_tokens < self.num_tokens + 1:
            raise ValueError("verify_tokens must be at least num_tokens + 1")
        rates = position_acceptance(self.num_tokens, self.acceptance)
        if not np.all(np.isfinite(rates)) or np.any(rates < 0) or np.any(rates > 1):
            raise ValueError("acceptance rates must be within [0, 1]")
        if np.any(np.diff(rates) > 1e-12):
            raise ValueError("per-position acceptance must not increase with position")
        if self.method == "draft" and not self.draft_model:
            raise ValueError("method 'draft' needs draft_model")
        return self

    @property
    def expected_tokens_per_step(self) -> float:
        return expected_tokens_per_step(self.num_tokens, self.acceptance)

    @property
    def verify_width(self) -> int:
        """Positions the target model verifies per sequence per step."""
        if self.verify_tokens is not None:
            return self.verify_tokens
        return 1 + self.num_tokens * self.topk

    def draft_pass_tokens(self, sequences: int) -> list[int]:
        """Tokens of each drafter forward pass for ``sequences`` sequences (MTP/EAGLE):
        first a draft-extend pass over every verified position (the drafter consumes the
        tokens the target just checked), then k - 1 passes over topk tokens per sequence
        (vLLM's EAGLE proposer with a padded drafter batch; SGLang's EAGLE worker)."""
        return [sequences * self.verify_width] + [sequences * self.topk] * (self.num_tokens - 1)


def position_acceptance(k: int, acceptance: float | tuple[float, ...] | list[float]) -> np.ndarray:
    """Unconditional acceptance probability of each drafted position 1..k."""
    if isinstance(acceptance, int | float):
        return float(acceptance) ** np.arange(1, k + 1)
    rates = np.asarray(acceptance, dtype=float)
    if rates.shape != (k,):
        raise CapsimUserError(
            f"got {rates.size} per-position acceptance rates for {k} speculative tokens",
            hint="give one rate, or exactly one per drafted position",
        )
    return rates


def expected_tokens_per_step(k: int, acceptance: float | tuple[float, ...] | list[float]) -> float:
    """Expected tokens a sequence gains per verification step (1 to k + 1)."""
    return 1.0 + float(position_acceptance(k, acceptance).sum())


SPEC_OPTIONS = {"topk": "topk", "verify": "verify_tokens"}
"""``--spec`` options after K: topk=N (tree branches), verify=N (positions verified)."""


VLLM_SPEC_METHODS = {
    "mtp": "mtp",
    "deepseek_mtp": "mtp",
    "qwen3_next_mtp": "mtp",
    "eagle": "eagle",
    "eagle3": "eagle",
    "ngram": "ngram",
    "draft_model": "draft",
}
"""vLLM's --speculative-config methods, as capsim's: its per-model MTP names are MTP, EAGLE
and EAGLE-3 heads one EAGLE layer, 'draft_model' a separate draft."""


VLLM_SPEC_CONFIG_KEYS = frozenset(
    {
        "attention_backend", "code_revision", "disable_by_batch_size", "disable_eagle_block_drop",
        "disable_logprobs", "disable_padded_drafter_batch", "draft_load_config",
        "draft_sample_method", "draft_tensor_parallel_size", "dspark_draft_topk",
        "enable_adaptive_verification", "enforce_eager", "index_share_for_mtp_iteration",
        "kv_cache_dtype", "max_model_len", "method", "model", "moe_backend",
        "num_speculative_tokens", "num_speculative_tokens_per_batch_size", "parallel_drafting",
        "prompt_lookup_max", "prompt_lookup_min", "quantization", "rejection_sample_method",
        "revision", "speculative_token_tree", "suffix_decoding_max_cached_requests",
        "suffix_decoding_max_spec_factor", "suffix_decoding_max_tree_depth",
        "suffix_decoding_min_token_prob", "synthetic_acceptance_length",
        "synthetic_acceptance_rates", "tensor_parallel_size", "use_heterogeneous_vocab",
        "use_local_argmax_reduction",
    }
)  # fmt: skip
"""The keys vLLM's ``--speculative-config`` takes: the fields of its SpeculativeConfig
(vllm/config/speculative.py, read 2026-11-30) and a few of earlier releases
(disable_by_batch_size, speculative_token_tree, disable_logprobs). vLLM refuses any other
key, and so does capsim rather than drop it without a word."""

SPEC_WINDOW_KEYS = ("prompt_lookup_max", "prompt_lookup_min", "draft_tensor_parallel_size")
"""Keys vLLM bounds as whole numbers of at least 1 (Field(ge=1))."""


def spec_text_of_vllm_config(text: str) -> str:
    """vLLM's ``--speculative-config`` JSON ('{"method": "mtp", "num_speculative_tokens":
    2}') as capsim's ``--spec`` text ('mtp:2'; a draft model names the catalog model its
    "model" names)."""
    from capsim.files import loads_json

    try:
        config = loads_json(text)
    except ValueError as exc:
        raise CapsimUserError(f"--speculative-config is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise CapsimUserError("--speculative-config must be a JSON object")
    from capsim.errors import close_matches

    for key in config:
        if key not in VLLM_SPEC_CONFIG_KEYS:
            raise CapsimUserError(
                f"--speculative-config has a key vLLM does not take: {key!r}",
                hint="vLLM's SpeculativeConfig fields, e.g. method, num_speculative_tokens, "
                "model, prompt_lookup_max",
                suggestions=close_matches(str(key), sorted(VLLM_SPEC_CONFIG_KEYS)),
            )
    for key in SPEC_WINDOW_KEYS:
        value = config.get(key)
        whole = isinstance(value, int) and not isinstance(value, bool)
        if value is not None and not (whole and value >= 1):
            raise CapsimUserError(
                f"--speculative-config {key} must be a whole number of at least 1, got {value!r}"
            )
    low, high = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
    if low is not None and high is not None and low > high:
        # vLLM's SpeculativeConfig refuses it ("prompt_lookup_min ... must be <= ...")
        raise CapsimUserError(
            f"--speculative-config prompt_lookup_min {low} is above prompt_lookup_max {high}",
            hint="the n-gram window runs from prompt_lookup_min up to prompt_lookup_max",
        )
    method = config.get("method")
    k = config.get("num_speculative_tokens")
    if not isinstance(method, str) or method not in VLLM_SPEC_METHODS:
        raise CapsimUserError(
            f"--speculative-config method {method!r} is not one capsim models",
            hint="one of " + ", ".join(VLLM_SPEC_METHODS),
        )
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise CapsimUserError(
            f"--speculative-config num_speculative_tokens must be a positive integer, got {k!r}"
        )
    ours = VLLM_SPEC_METHODS[method]
    if ours == "draft":
        model = config.get("model")
        if not isinstance(model, str) or not model:
            raise CapsimUserError('--speculative-config draft_model needs a "model"')
        return f"draft:{model}:{k}"
    if config.get("model") is not None:
        from capsim.notices import notice

        notice(
            f"--speculative-config model {str(config['model'])[:80]!r} is not looked up: capsim "
            f"costs an {ours.upper()} drafter from the target model's own layer shapes"
        )
    return f"{ours}:{k}"


def parse_spec(
    text: str, acceptance: float | list[float] | None = None, what: str = "--spec"
) -> SpecConfig:
    """Parse ``--spec`` values like 'mtp:2', 'eagle:3', 'ngram:4', 'draft:qwen3-8b:4', and
    EAGLE trees as 'eagle:3:topk=4:verify=8' (SGLang's num-steps, eagle-topk and
    num-draft-tokens), or vLLM's ``--speculative-config`` JSON. ``what`` names the value
    in errors (a dataset's field rather than the flag)."""
    if text.lstrip()[:1] in ("{", "["):  # JSON: vLLM's --speculative-config
        text = spec_text_of_vllm_config(text)
    parts = text.split(":")
    try:
        if parts[0] == "draft":
            if len(parts) < 3:
                raise ValueError
            method, draft, k, extra = "draft", parts[1], plain_int(parts[2]), parts[3:]
        else:
            if len(parts) < 2:
                raise ValueError
            method, draft, k, extra = parts[0], None, plain_int(parts[1]), parts[2:]
        values: dict = {"method": method, "num_tokens": k, "draft_model": draft}
        for option in extra:
            key, sep, value = option.partition("=")
            if not sep or key not in SPEC_OPTIONS:
                raise ValueError(f"unknown option '{option}' (topk=N or verify=N)")
            if SPEC_OPTIONS[key] in values:  # the last one took over without a word
                raise ValueError(f"option '{key}' given twice")
            values[SPEC_OPTIONS[key]] = plain_int(value)  # int() read '1_0' as 10
        if acceptance is not None:
            values["acceptance"] = tuple(acceptance) if isinstance(acceptance, list) else acceptance
        return SpecConfig(**values)
    except (ValueError, TypeError) as exc:
        errors = getattr(exc, "errors", None)
        if errors is not None:  # pydantic: name the field and what it must be
            first = errors()[0]
            field = str(first["loc"][0]) if first["loc"] else ""
            if field == "acceptance" or "acceptance" in first["msg"]:
                given = acceptance if field != "acceptance" else first.get("input")
                raise CapsimUserError(
                    f"--spec-acceptance {given!r}: "
                    + first["msg"].lower().removeprefix("value error, "),
                    hint="the share of draft tokens accepted, in [0, 1]: one value, or one "
                    "per draft position (comma-separated)",
                ) from None
            message = first["msg"].lower().removeprefix("value error, ")
            detail = f"{field}: {message}" if field else message
        else:
            detail = str(exc).splitlines()[-1] if str(exc) else "malformed"
        raise CapsimUserError(
            f"cannot read {what} '{text}' ({detail})",
            hint="use METHOD:K such as mtp:2, eagle:3, ngram:4, or draft:MODEL:K; an EAGLE "
            "tree as eagle:3:topk=4:verify=8",
        ) from None
