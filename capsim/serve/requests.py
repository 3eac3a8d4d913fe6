"""What ``capsim serve`` accepts in a request body, checked as vLLM's OpenAI server checks
it (pydantic models in lax mode, then vLLM's own validators): a client's mistake is a 400
with an OpenAI-style JSON error, never a 500 or a silent success.

Lax mode means what pydantic accepts for a typed field: a bool as true/false, 0/1 or the
strings "true"/"false"/"yes"/"no"/"on"/"off"/"t"/"f"/"y"/"n"/"1"/"0"; an int as an int,
an integral float (5.0) or a numeric string ("5"); a float as a number or numeric string.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, ClassVar

from starlette.responses import JSONResponse

WORD_OR_MARK = re.compile(r"\w+|[^\w\s]")

_ASCII_SPACE_OR_NOT = bytes(32 if chr(b).isspace() else 120 for b in range(128)) + bytes(
    120 for _ in range(128)
)
"""A byte table for ``words_at_least``: ASCII whitespace (what ``\\s`` matches there) to a
space, every other byte to 'x'."""

CHARS_PER_TOKEN = 4
"""Characters of English text per BPE token, OpenAI's rule of thumb ("What are tokens and
how to count them?", help.openai.com: "1 token ~= 4 chars in English"), for the part of a
word past WHOLE_WORD_CHARS: a 5 MB run of letters with no space (a base64 blob, minified
code) is about 1.25 million tokens, not one."""

WHOLE_WORD_CHARS = 8
"""A word up to this long is one token (an estimate: BPE vocabularies of 32K-256K entries
hold common English words whole); each CHARS_PER_TOKEN past it, or part of them, adds one."""

CHAT_TOKENS_PER_MESSAGE = 4
"""Estimated chat-template tokens around each message (role header and separators), as in
OpenAI's published token-counting recipe for chat models (3-4 per message)."""

CHAT_TOKENS_FOR_REPLY = 3
"""Estimated template tokens that open the assistant's reply."""

CHAT_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})
"""Message roles vLLM's chat template accepts (OpenAI's, with the legacy 'function')."""

TEXT_PART_TYPES = frozenset({"text", "input_text"})
MEDIA_PART_TYPES = frozenset(
    {
        "image_url",
        "input_image",
        "image_pil",
        "image_embeds",
        "audio_url",
        "input_audio",
        "video_url",
        "file",
    }
)
"""Content-part types vLLM parses; capsim serves a text model, as vLLM does for a model
without a vision or audio encoder, so media parts are refused (400) like there."""

TRUE_WORDS = frozenset({"true", "1", "yes", "on", "t", "y"})
FALSE_WORDS = frozenset({"false", "0", "no", "off", "f", "n"})


class ApiError(Exception):
    """An error answered as vLLM's OpenAI server does: status and a JSON error body."""

    TYPES: ClassVar[dict[int, str]] = {
        400: "BadRequestError",
        404: "NotFoundError",
        405: "MethodNotAllowedError",
        408: "RequestTimeoutError",
        413: "RequestTooLargeError",
        415: "UnsupportedMediaTypeError",
    }

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def response(self) -> JSONResponse:
        return AsciiJSONResponse(
            {
                "error": {
                    "message": self.message,
                    "type": self.TYPES.get(self.status, "InternalServerError"),
                    "param": self.param,
                    "code": self.status,
                }
            },
            status_code=self.status,
        )


class AsciiJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: a message that quotes the client's text stays valid
    UTF-8 even when that text held a lone surrogate (a 500 in Starlette's own renderer)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param)


def lax_bool(body: dict, key: str, default: bool = False) -> bool:
    """``body[key]`` as pydantic reads a bool field (null: ``default``)."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE_WORDS | FALSE_WORDS:
        return value.strip().lower() in TRUE_WORDS
    raise bad(key, f"{key} must be a boolean, got {short(value)}.")


def lax_int(body: dict, key: str) -> int | None:
    """``body[key]`` as pydantic reads an int field (None when absent or null)."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool):
        raise bad(key, f"{key} must be an integer, got {short(value)}.")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d{1,18}\s*", value):
        return int(value)
    raise bad(key, f"{key} must be an integer, got {short(value)}.")


def lax_float(body: dict, key: str) -> float | None:
    """``body[key]`` as pydantic reads a float field (None when absent or null)."""
    value = body.get(key)
    if value is None:
        return None
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None or not math.isfinite(number):
        raise bad(key, f"{key} must be a finite number, got {short(value)}.")
    return number


def short(value: Any) -> str:
    """A client's value in an error message: JSON, at most 60 characters."""
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 60 else text[:57] + "..."


def string_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def check_range(body: dict, key: str, low: float, high: float, open_low: bool = False) -> None:
    value = lax_float(body, key)
    if value is None:
        return
    if value < low or value > high or (open_low and value == low):
        side = "(" if open_low else "["
        raise bad(key, f"{key} must be in {side}{low:g}, {high:g}], got {value:g}.")


MAX_LOGPROBS = 20
"""vLLM's default ``--max-logprobs``: a request asking for more is refused ("Requested
sample logprobs of N, which is greater than max allowed: 20")."""


def check_max_logprobs(key: str, asked: int | None) -> None:
    if asked is not None and asked > MAX_LOGPROBS:
        raise bad(
            key,
            f"Requested sample logprobs of {asked}, which is greater than max allowed: "
            f"{MAX_LOGPROBS}",
        )


NO_LOGPROBS = (
    "capsim serve does not return logprobs: its text is filler, not a model's sampling "
    "(leave logprobs out; the timing is the same)."
)
"""Why a request for logprobs is refused: an answer without them (it was 200, the field
validated and dropped) would let a client believe it had them."""


def check_sampling(body: dict, chat: bool) -> None:
    """The sampling and output fields vLLM validates (SamplingParams._verify_args and the
    request models' types)."""
    temperature = lax_float(body, "temperature")
    if temperature is not None and temperature < 0:
        raise bad("temperature", f"temperature must be non-negative, got {temperature:g}.")
    check_range(body, "top_p", 0.0, 1.0, open_low=True)
    check_range(body, "min_p", 0.0, 1.0)
    check_range(body, "presence_penalty", -2.0, 2.0)
    check_range(body, "frequency_penalty", -2.0, 2.0)
    repetition = lax_float(body, "repetition_penalty")
    if repetition is not None and repetition <= 0:
        raise bad("repetition_penalty", f"repetition_penalty must be positive, got {repetition:g}.")
    top_k = lax_int(body, "top_k")
    if top_k is not None and top_k < -1:
        raise bad("top_k", f"top_k must be -1 (disable), 0 or at least 1, got {top_k}.")
    seed = lax_int(body, "seed")
    if seed is not None and not -(2**63) <= seed < 2**63:  # vLLM's seed is a 64-bit int
        raise bad("seed", f"seed must be a 64-bit integer, got {short(seed)}.")
    lax_bool(body, "ignore_eos")
    if lax_bool(body, "echo"):
        raise bad("echo", "capsim serve does not echo the prompt (its text is filler).")
    min_tokens = lax_int(body, "min_tokens")
    if min_tokens is not None:
        if min_tokens < 0:
            raise bad(
                "min_tokens", f"min_tokens must be greater than or equal to 0, got {min_tokens}."
            )
        most = lax_int(body, "max_completion_tokens" if chat else "max_tokens")
        if chat and most is None:
            most = lax_int(body, "max_tokens")
        if most is not None and min_tokens > most:
            raise bad(
                "min_tokens",
                f"min_tokens must be less than or equal to max_tokens={most}, got {min_tokens}.",
            )
    stop = body.get("stop")
    if not (stop is None or isinstance(stop, str) or string_list(stop)):
        raise bad("stop", "stop must be a string or a list of strings.")
    if chat:
        wanted = lax_bool(body, "logprobs")
        top = lax_int(body, "top_logprobs")
        if top is not None and top < 0:
            raise bad("top_logprobs", f"top_logprobs must be non-negative, got {top}.")
        if top and not wanted:
            raise bad("top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true.")
        check_max_logprobs("top_logprobs", top)
        if wanted:
            raise bad("logprobs", NO_LOGPROBS)
    else:
        logprobs = lax_int(body, "logprobs")
        if logprobs is not None and logprobs < 0:
            raise bad("logprobs", f"logprobs must be non-negative, got {logprobs}.")
        check_max_logprobs("logprobs", logprobs)
        if logprobs is not None:
            raise bad("logprobs", NO_LOGPROBS)
        best_of = lax_int(body, "best_of")
        if best_of is not None and best_of != 1:
            raise bad("best_of", "capsim serve supports best_of = 1 only.")
        suffix = body.get("suffix")
        if suffix is not None and not isinstance(suffix, str):
            raise bad("suffix", "suffix must be a string.")
        if suffix is not None:  # vLLM's completion server refuses it as well
            raise bad("suffix", "suffix is not currently supported")
        if body.get("prompt_embeds") is not None:
            raise bad("prompt_embeds", "capsim serve does not take prompt embeddings.")
    bias = body.get("logit_bias")
    if bias is not None and (
        not isinstance(bias, dict)
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bias.values())
        or not all(re.fullmatch(r"\s*[+-]?\d+\s*", k) for k in bias)
    ):
        raise bad("logit_bias", "logit_bias must be an object of token ids to numbers.")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad("user", f"user must be a string, got {short(user)}.")
    n = lax_int(body, "n")
    if n is not None and n != 1:
        raise bad("n", "capsim serve supports n = 1 only.")


def check_tools(body: dict) -> None:
    """Chat fields vLLM types strictly: tools and tool_choice (response_format, which
    completions take too, is extra_fields')."""
    tools = body.get("tools")
    if tools is not None and not (
        isinstance(tools, list)
        and all(
            isinstance(t, dict)
            and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str)
            for t in tools
        )
    ):
        raise bad("tools", "tools must be a list of {type: function, function: {name}}.")
    if tools == []:
        raise bad(
            "tools",
            "`tools` must not be an empty array. Either provide at least one tool or omit "
            "the field entirely.",
        )
    for tool in tools or ():  # as vLLM's ChatCompletionToolsParam types each
        if tool.get("type", "function") != "function":
            raise bad("tools", f"a tool's type must be 'function', got {short(tool.get('type'))}.")
        parameters = tool["function"].get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise bad("tools", "a tool function's parameters must be a JSON Schema object.")
    choice = body.get("tool_choice")
    if choice is not None and not (
        choice in ("none", "auto", "required") or isinstance(choice, dict)
    ):
        raise bad("tool_choice", "tool_choice must be none, auto, required or an object.")
    if choice is not None and choice != "none" and tools is None:
        raise bad("tool_choice", "When using `tool_choice`, `tools` must be set.")
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or name not in {t["function"]["name"] for t in tools}:
            raise bad(
                "tool_choice",
                f"Tool {short(name)} has not been passed in `tools` (tool_choice names a "
                "function: {type: function, function: {name}}).",
            )


def check_stream(body: dict) -> tuple[bool, bool, bool]:
    """(stream, include_usage, continuous_usage_stats), as vLLM reads them; stream_options
    without stream is refused there too."""
    stream = lax_bool(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False, False
    if not isinstance(options, dict):
        raise bad("stream_options", "stream_options must be a JSON object.")
    if options and not stream:  # vLLM's check_stream_options: an empty object passes
        raise bad("stream_options", "Stream options can only be defined when `stream=True`.")
    include = lax_bool(options, "include_usage")
    continuous = lax_bool(options, "continuous_usage_stats")
    return stream, include, include and continuous


def words_at_least(text: str) -> int:
    """A lower bound on ``count_tokens(text)``, from C-level string methods: the runs of
    characters between whitespace. ``\\w+`` and ``[^\\w\\s]`` never take a whitespace
    character, so each run holds at least one of their matches and no match spans two
    runs. For ASCII text the runs are counted in one pass over a translated copy (about a
    millisecond for a 700 KB prompt, where the exact count takes 20), else by split()."""
    if text.isascii():
        marked = text.encode("ascii").translate(_ASCII_SPACE_OR_NOT)
        return marked.count(b" x") + (marked[:1] == b"x")
    return len(text.split())


def count_tokens(text: str, limit: int | None = None) -> int:
    """Estimated tokens of ``text``: one per punctuation mark and per word, and one more
    per CHARS_PER_TOKEN characters, or part of them, of a word past WHOLE_WORD_CHARS (a
    whitespace-and-punctuation split; real BPE tokenizers give about 1.0-1.5 tokens per
    English word, and split a long word into pieces). At least 1. With ``limit``,
    counting stops once past it (a prompt that long is refused whatever its exact count,
    and a 30 MB one would take seconds); a text of more words than ``limit`` is known to
    be past it without counting (``words_at_least``: a flood of over-long prompts kept
    the one API-server process from the requests it serves)."""
    if limit is not None and len(text) > limit and words_at_least(text) > limit:
        return limit + 1
    tokens = 0
    for match in WORD_OR_MARK.finditer(text):
        past = match.end() - match.start() - WHOLE_WORD_CHARS
        tokens += 1 if past <= 0 else 1 + -(-past // CHARS_PER_TOKEN)
        if limit is not None and tokens > limit:
            break
    return max(1, tokens)


def message_tokens(message: Any, limit: int | None) -> int:
    """Estimated tokens of one chat message, checked as vLLM's chat parser checks it."""
    if not isinstance(message, dict):
        raise bad("messages", "each message must be a JSON object.")
    role = message.get("role")
    if not isinstance(role, str) or role not in CHAT_ROLES:
        raise bad(
            "messages", f"each message needs a role of {sorted(CHAT_ROLES)}, got {short(role)}."
        )
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise bad("messages", "each content part must be an object with a type.")
            kind = part["type"]
            if kind in TEXT_PART_TYPES:
                if not isinstance(part.get("text"), str):
                    raise bad("messages", "a text part's text must be a string.")
                texts.append(part["text"])
            elif kind in MEDIA_PART_TYPES:
                raise bad("messages", f"capsim serve's model takes text only, not {kind} parts.")
            else:
                raise bad("messages", f"Unknown part type: {short(kind)}.")
        content = " ".join(texts)
    if content is not None and not isinstance(content, str):
        raise bad("messages", "a message's content must be a string or a list of content parts.")
    name = message.get("name")
    if name is not None and not isinstance(name, str):
        raise bad("messages", f"a message's name must be a string, got {short(name)}.")
    calls = message.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise bad("messages", "a message's tool_calls must be a list.")
    for call in calls or []:  # vLLM types each call: {id, type, function: {name, arguments}}
        function = call.get("function") if isinstance(call, dict) else None
        if not (
            isinstance(function, dict)
            and isinstance(function.get("name"), str)
            and isinstance(function.get("arguments"), str)
            and isinstance(call.get("id", ""), str)
            and call.get("type", "function") == "function"
        ):
            raise bad(
                "messages",
                "a tool call must be an object with a string id, type 'function' and a "
                f"function of a string name and arguments, got {short(call)}.",
            )
    return CHAT_TOKENS_PER_MESSAGE + (count_tokens(content, limit) if content else 0)


def prompt_tokens_of(body: dict, chat: bool, vocab_size: int, limit: int | None = None) -> int:
    """Prompt tokens of a completions or chat request (token ids are counted exactly and
    must be in the vocabulary, as logit_bias's must). With ``limit``, counting may stop
    once past it."""
    bias = body.get("logit_bias")
    if isinstance(bias, dict):
        ids = [k.strip() for k in bias if isinstance(k, str) and re.fullmatch(r"\s*[+-]?\d+\s*", k)]
        # a 5,000-digit id is outside too (without int()'s digit limit raising)
        outside = [k for k in ids if len(k) > 18 or not 0 <= int(k) < vocab_size]
        if outside:
            raise bad(
                "logit_bias",
                f"token_id(s) {short(outside[:5])} in logit_bias contain out-of-vocab token "
                f"ids. Vocabulary size: {vocab_size}",
            )
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad("messages", "messages must be a non-empty list.")
        total = CHAT_TOKENS_FOR_REPLY
        for message in messages:
            total += message_tokens(message, limit)
            if limit is not None and total > limit:
                return total
        return total
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        for t in prompt:
            if not 0 <= t < vocab_size:
                raise bad(
                    "prompt", f"Token id {short(t)} is out of vocabulary (0-{vocab_size - 1})."
                )
        return len(prompt)
    if not isinstance(prompt, str):
        raise bad("prompt", "prompt must be a string or a list of token ids (one prompt).")
    return count_tokens(prompt, limit)


def model_name(body: dict, served: list[str]) -> str:
    """The model a request names (the first served one when it names none)."""
    name = body.get("model")
    if name is None:
        return served[0]
    if not isinstance(name, str):
        raise bad("model", f"model must be a string, got {short(name)}.")
    if name not in served:
        raise ApiError(404, f"The model `{name}` does not exist.", param="model")
    return name


COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""max_tokens of a /v1/completions request that does not send the field: vLLM's
CompletionRequest declares ``max_tokens: int | None = 16`` (OpenAI's legacy default); an
explicit null, and a chat request without it, may generate up to max_model_len."""


def max_tokens_of(body: dict, chat: bool) -> int | None:
    """The completion budget a request asks for: chat reads max_completion_tokens or
    max_tokens (vLLM: ``max_completion_tokens or max_tokens``), completions max_tokens
    alone (its request has no max_completion_tokens; 16 where it is not sent)."""
    if not chat and "max_tokens" not in body:
        return COMPLETIONS_DEFAULT_MAX_TOKENS
    value = lax_int(body, "max_tokens")
    if chat:
        newer = lax_int(body, "max_completion_tokens")
        value = newer or value
    if value is not None and value < 1:
        raise bad("max_tokens", f"max_tokens must be at least 1, got {value}.")
    return value
