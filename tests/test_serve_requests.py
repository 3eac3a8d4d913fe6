"""capsim serve's request checks (capsim/serve/requests.py), without a server."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capsim.serve.requests import (
    ApiError,
    check_stream,
    count_tokens,
    lax_bool,
    lax_int,
    max_tokens_of,
    prompt_tokens_of,
    words_at_least,
)


@pytest.mark.parametrize(
    ("value", "read"),
    [(True, True), (0, False), ("false", False), (" Yes ", True), ("off", False), (None, False)],
)
def test_booleans_read_as_pydantic_lax_mode_reads_them(value, read):
    assert lax_bool({"stream": value}, "stream") is read


@pytest.mark.parametrize("value", ["banana", [1], 2, 1.5, {}])
def test_other_booleans_are_400s(value):
    with pytest.raises(ApiError) as e:
        lax_bool({"stream": value}, "stream")
    assert e.value.status == 400 and e.value.param == "stream"


def test_integers_as_pydantic_reads_them():
    assert lax_int({"k": 5.0}, "k") == 5 and lax_int({"k": " 7 "}, "k") == 7
    for value in (5.5, "5x", True, float("inf"), "9" * 40):
        with pytest.raises(ApiError):
            lax_int({"k": value}, "k")


def test_counting_stops_just_past_the_limit():
    """A 30 MB prompt is refused for its length; counting all of it took 18 s on the
    event loop (issue 47's fuzz battery), counting to just past max_model_len does not."""
    text = ". " * 2_000_000
    assert count_tokens(text) == 2_000_000
    assert count_tokens(text, limit=100) == 101
    assert prompt_tokens_of({"prompt": text}, False, 1000, limit=50) == 51


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(
        alphabet=st.sampled_from(["a", "é", "9", " ", "\t", "\u3000", "\x1c", ",", "-", "\n", "_"]),
        max_size=60,
    ),
    limit=st.integers(0, 30),
)
def test_the_word_count_bounds_the_tokens_and_the_limit_answers_the_same(text, limit):
    """words_at_least never exceeds the exact count (ASCII or not), and a limited count is
    past the limit exactly when the full count is."""
    assert words_at_least(text) <= count_tokens(text)
    assert (count_tokens(text, limit) > limit) == (count_tokens(text) > limit)


def test_a_prompt_of_more_words_than_the_limit_is_refused_without_counting_them():
    """140,000 words against a 131,072-token context: the words alone decide it, in about a
    millisecond (a flood of these held up serve's valid requests 5x, issue 47's audit)."""
    text = "word " * 140_000
    assert words_at_least(text) == 140_000
    assert count_tokens(text, limit=131_072) == 131_073
    assert count_tokens("né " * 40, limit=10) == 11  # not ASCII: split() counts the words


def test_a_long_word_is_many_tokens():
    """A 5 MB prompt without a space was one 'word', one token, and was served (issue 47's
    battery): a word of up to eight characters is one token, each four past them one more."""
    assert count_tokens("the cat sat on lanterns") == 5
    assert count_tokens("meadowlarks") == 2
    assert count_tokens("hello, internationalization!") == 1 + 1 + (1 + 3) + 1
    assert count_tokens("x" * 5_000_000) == 1 + 1_249_998  # 4,999,992 past the whole word
    assert count_tokens("x" * 5_000_000, limit=1000) == 1_249_999  # one word past the limit
    assert prompt_tokens_of({"prompt": "x" * 1008}, False, 1000, limit=100) == 251


def test_budgets_and_stream_options_as_vllm_reads_them():
    assert max_tokens_of({"max_tokens": 5, "max_completion_tokens": None}, chat=True) == 5
    assert max_tokens_of({"max_tokens": 5, "max_completion_tokens": 3}, chat=True) == 3
    assert max_tokens_of({"max_tokens": 5, "max_completion_tokens": 3}, chat=False) == 5
    assert check_stream({"stream": True, "stream_options": {"include_usage": "true"}}) == (
        True,
        True,
        False,
    )
    assert check_stream({"stream_options": {}}) == (False, False, False)  # empty passes
    with pytest.raises(ApiError, match="stream=True"):
        check_stream({"stream_options": {"include_usage": True}})


def test_fields_vllm_refuses_are_refused():
    """vLLM's request models refuse these (pydantic types, check_logprobs,
    check_tool_usage, the engine's max_logprobs); capsim serve answered 200."""
    from capsim.serve.requests import check_sampling, check_tools, message_tokens

    with pytest.raises(ApiError, match="greater than max allowed: 20"):
        check_sampling({"logprobs": True, "top_logprobs": 1000}, chat=True)
    with pytest.raises(ApiError, match="`logprobs` must be set to true"):
        check_sampling({"top_logprobs": 3}, chat=True)
    with pytest.raises(ApiError, match="does not return logprobs"):  # valid, not served
        check_sampling({"logprobs": True, "top_logprobs": 20}, chat=True)
    with pytest.raises(ApiError, match="greater than max allowed"):
        check_sampling({"logprobs": 21}, chat=False)
    with pytest.raises(ApiError, match="token ids to numbers"):
        check_sampling({"logit_bias": {"x": 1}}, chat=True)
    check_sampling({"logit_bias": {"50256": -100}}, chat=True)
    with pytest.raises(ApiError, match="user must be a string"):
        check_sampling({"user": 5}, chat=True)
    with pytest.raises(ApiError, match="`tools` must be set"):
        check_tools({"tool_choice": "required"})
    check_tools({"tool_choice": "none"})
    with pytest.raises(ApiError, match="must not be an empty array"):
        check_tools({"tools": []})
    tools = [{"type": "function", "function": {"name": "f"}}]
    check_tools({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "f"}}})
    with pytest.raises(ApiError, match="has not been passed"):
        check_tools(
            {"tools": tools, "tool_choice": {"type": "function", "function": {"name": "g"}}}
        )
    with pytest.raises(ApiError, match="name must be a string"):
        message_tokens({"role": "user", "content": "hi", "name": {}}, None)
    with pytest.raises(ApiError, match="seed must be a 64-bit integer"):
        check_sampling({"seed": 2**70}, chat=False)
    check_sampling({"seed": 2**63 - 1}, chat=False)


def test_fields_capsim_cannot_honour_and_vllm_limits_are_400():
    """Issue 47's battery: min_tokens below 0 or above max_tokens (vLLM's
    SamplingParams._verify_args refuses both), a completion's suffix (vLLM: not currently
    supported), and what filler text cannot give (logprobs, echo) were answered 200."""
    from capsim.serve.requests import check_sampling

    cases = [
        ({"min_tokens": -1}, False, "greater than or equal to 0, got -1"),
        ({"min_tokens": 9, "max_tokens": 4}, False, "less than or equal to max_tokens=4, got 9"),
        ({"min_tokens": 9, "max_completion_tokens": 4}, True, "max_tokens=4, got 9"),
        ({"suffix": "x"}, False, "suffix is not currently supported"),
        ({"logprobs": 0}, False, "does not return logprobs"),
        ({"logprobs": True}, True, "does not return logprobs"),
        ({"echo": True}, False, "does not echo the prompt"),
    ]
    for body, chat, words in cases:
        with pytest.raises(ApiError, match=words):
            check_sampling(body, chat=chat)
    check_sampling({"min_tokens": 4, "max_tokens": 4, "logprobs": None, "echo": False}, False)
    check_sampling({"logprobs": False}, chat=True)


def test_logit_bias_ids_outside_the_vocabulary_are_a_400():
    """vLLM answers 400 ('contain out-of-vocab token ids'); capsim served them (200)."""
    from capsim.serve.requests import prompt_tokens_of

    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert prompt_tokens_of({**body, "logit_bias": {"5": 1}}, True, 1000) > 0
    for ids in ({"299999": 1}, {"-1": 1}, {"9" * 5000: 1}):
        with pytest.raises(ApiError, match="out-of-vocab"):
            prompt_tokens_of({**body, "logit_bias": ids}, True, 1000)


def test_a_malformed_tool_call_in_the_history_is_a_400():
    from capsim.serve.requests import message_tokens

    good = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    assert message_tokens(good, None) > 0
    for call in ({"id": 1}, {"id": "c", "function": {"name": "f"}}, "call", {"function": []}):
        with pytest.raises(ApiError, match="tool call"):
            message_tokens({**good, "tool_calls": [call]}, None)
