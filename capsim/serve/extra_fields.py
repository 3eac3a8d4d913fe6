"""vLLM's extra request fields (its own, beside OpenAI's) as its OpenAI server types and
checks them, so that ``capsim serve`` answers a client's mistake there with the same 400
(issue 47's fourth audit: 'skip_special_tokens': 'x', a response_format without a schema and
'reasoning_effort': 'extreme' were served). capsim serve generates filler text, so the
values change nothing once they are well formed.

The fields and their types are those of vLLM's CompletionRequest, ChatCompletionRequest and
TokenizeRequest (vllm/entrypoints/openai/protocol.py): bools read in pydantic's lax mode,
ints and floats likewise, lists of token ids or strings, objects.
"""

from __future__ import annotations

import json
import re
from typing import Any

from capsim.serve.requests import bad, lax_bool, lax_float, lax_int, short

SHARED_BOOLS = (
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "add_special_tokens",
    "return_tokens_as_token_ids",
    "use_beam_search",
)
"""Bool fields both request kinds carry."""

CHAT_BOOLS = ("parallel_tool_calls",)
"""Bool fields of a chat request beside the chat-template ones (add_generation_prompt and
continue_final_message: check_chat_template_fields reads those)."""

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")
"""Values of OpenAI's reasoning_effort, which vLLM's chat request takes."""


def check_extra_fields(body: dict, chat: bool, vocab_size: int, max_model_len: int) -> None:
    """Raise the 400 vLLM answers for a malformed vLLM-specific field of a completion or
    chat request."""
    for key in SHARED_BOOLS + (CHAT_BOOLS if chat else ()):
        lax_bool(body, key)
    lax_float(body, "length_penalty")
    lax_int(body, "priority")
    truncate = lax_int(body, "truncate_prompt_tokens")
    if truncate is not None and not (truncate == -1 or 1 <= truncate <= max_model_len):
        raise bad(
            "truncate_prompt_tokens",
            f"truncate_prompt_tokens must be -1 or 1 to max_model_len ({max_model_len}), "
            f"got {short(truncate)}.",
        )
    if lax_int(body, "prompt_logprobs") is not None:
        raise bad("prompt_logprobs", "capsim serve returns no logprobs (its text is filler).")
    check_token_ids(body, "stop_token_ids", None)  # vLLM types them, checks no range
    check_token_ids(body, "allowed_token_ids", vocab_size)  # vLLM: out-of-vocab is a 400
    bad_words = body.get("bad_words")
    if bad_words is not None and not (
        isinstance(bad_words, list) and all(isinstance(w, str) for w in bad_words)
    ):
        raise bad("bad_words", "bad_words must be a list of strings.")
    _check_response_format(body.get("response_format"))
    _check_guided(body)
    _check_passthrough(body, chat)
    if chat:
        check_chat_template_fields(body)
        effort = body.get("reasoning_effort")
        if effort is not None and effort not in REASONING_EFFORTS:
            raise bad(
                "reasoning_effort",
                f"reasoning_effort must be one of {list(REASONING_EFFORTS)}, got {short(effort)}.",
            )
        for key in ("mm_processor_kwargs", "chat_template_kwargs"):
            value = body.get(key)
            if value is not None and not isinstance(value, dict):
                raise bad(key, f"{key} must be an object.")
        documents = body.get("documents")
        if documents is not None and not (
            isinstance(documents, list) and all(isinstance(d, dict) for d in documents)
        ):
            raise bad("documents", "documents must be a list of objects.")


def _check_passthrough(body: dict, chat: bool) -> None:
    """The fields vLLM passes on rather than reads, typed as its request models type them
    (vLLM 0.24.0's completion/protocol.py and chat_completion/protocol.py): request_id a
    string, cache_salt a string that is not empty (its check_cache_salt_support),
    kv_transfer_params an object, vllm_xargs an object of strings and numbers (a chat
    request's values may also be lists of them). Any value was served (issue 47, round 6:
    'cache_salt': [], 'vllm_xargs': true)."""
    request_id = body.get("request_id")
    if request_id is not None and not isinstance(request_id, str):
        raise bad("request_id", f"request_id must be a string, got {short(request_id)}.")
    salt = body.get("cache_salt")
    if salt is not None and not (isinstance(salt, str) and salt):
        raise bad("cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided.")
    params = body.get("kv_transfer_params")
    if params is not None and not isinstance(params, dict):
        raise bad("kv_transfer_params", "kv_transfer_params must be an object.")
    xargs = body.get("vllm_xargs")

    def scalar(v) -> bool:
        return isinstance(v, str | int | float) and not isinstance(v, bool)

    def value(v) -> bool:
        return scalar(v) or (chat and isinstance(v, list) and all(scalar(x) for x in v))

    if xargs is not None and not (isinstance(xargs, dict) and all(map(value, xargs.values()))):
        kinds = "strings, numbers or lists of them" if chat else "strings and numbers"
        raise bad("vllm_xargs", f"vllm_xargs must be an object of {kinds}.")


def check_chat_template_fields(body: dict) -> None:
    """The chat-template fields of a chat request or a chat-form /tokenize: chat_template a
    string, and continue_final_message not beside add_generation_prompt (which is true
    unless sent false: vLLM's check_generation_prompt)."""
    template = body.get("chat_template")
    if template is not None and not isinstance(template, str):
        raise bad("chat_template", "chat_template must be a string.")
    generation = lax_bool(body, "add_generation_prompt", default=True)
    if lax_bool(body, "continue_final_message") and generation:
        raise bad(
            "continue_final_message",
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        )


def check_tokenize_fields(body: dict, chat: bool) -> None:
    """The fields vLLM's TokenizeRequest types: add_special_tokens and return_token_strs
    (bools) and, for messages, the chat-template fields."""
    lax_bool(body, "add_special_tokens")
    lax_bool(body, "return_token_strs")
    if chat:
        check_chat_template_fields(body)


def check_token_ids(body: dict, key: str, vocab_size: int | None) -> None:
    """``body[key]``, if given, as a list of token ids (integers), each in the vocabulary
    when ``vocab_size`` is given; else the 400 vLLM answers."""
    ids = body.get(key)
    if ids is None:
        return
    if not isinstance(ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in ids
    ):
        raise bad(key, f"{key} must be a list of token ids (integers).")
    for t in ids if vocab_size is not None else ():
        if not 0 <= t < vocab_size:
            raise bad(
                key, f"Token id {short(t)} in {key} is out of vocabulary (0-{vocab_size - 1})."
            )


def _check_response_format(fmt: Any) -> None:
    if fmt is None:
        return
    kinds = ("text", "json_object", "json_schema", "structural_tag")
    if not isinstance(fmt, dict) or fmt.get("type") not in kinds:
        raise bad(
            "response_format", f"response_format must be an object with a type of {list(kinds)}."
        )
    if fmt["type"] == "json_schema":
        schema = fmt.get("json_schema")
        if not isinstance(schema, dict):
            raise bad(
                "response_format",
                "response_format of type json_schema needs a json_schema object.",
            )
        inner = schema.get("schema")
        if inner is not None and not isinstance(inner, dict | bool):
            raise bad("response_format", "json_schema.schema must be a JSON Schema object.")


def _check_guided(body: dict) -> None:
    """guided_json (a schema, or its text), guided_regex (a pattern), guided_choice (a list
    of strings) and guided_grammar (text), as vLLM's structured outputs read them."""
    spec = body.get("guided_json")
    if isinstance(spec, str):
        try:
            json.loads(spec)
        except ValueError:
            raise bad("guided_json", "guided_json is not valid JSON.") from None
    elif spec is not None and not isinstance(spec, dict | bool):
        raise bad("guided_json", "guided_json must be a JSON Schema object or its text.")
    pattern = body.get("guided_regex")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise bad("guided_regex", "guided_regex must be a string.")
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError):
            raise bad("guided_regex", "guided_regex is not a valid regular expression.") from None
    choice = body.get("guided_choice")
    if choice is not None and not (
        isinstance(choice, list) and choice and all(isinstance(c, str) for c in choice)
    ):
        raise bad("guided_choice", "guided_choice must be a non-empty list of strings.")
    grammar = body.get("guided_grammar")
    if grammar is not None and not isinstance(grammar, str):
        raise bad("guided_grammar", "guided_grammar must be a string.")
