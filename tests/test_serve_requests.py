"""capsim serve's request checks (capsim/serve/requests.py), without a server."""

from __future__ import annotations

import pytest

from capsim.serve.requests import (
    ApiError,
    check_stream,
    count_tokens,
    lax_bool,
    lax_int,
    max_tokens_of,
    prompt_tokens_of,
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
