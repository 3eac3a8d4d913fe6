"""Issue 47: a valid run that will take long says so early, once, on stderr (a pipe or a
log too, where no bar shows): how long is left, how to stop it and how to shorten it."""

from __future__ import annotations

import io
import time

from rich.console import Console

from capsim.cli.common import LongRunNote, duration_words


def note_for(monkeypatch, reports: list[tuple[float, int, int]]) -> str:
    """What a LongRunNote prints for (seconds since start, done, total) reports."""
    clock = {"now": 100.0}
    monkeypatch.setattr(time, "perf_counter", lambda: clock["now"])
    out = io.StringIO()
    seen = []
    note = LongRunNote(
        "requests simulated",
        "fewer --requests give an answer sooner",
        callback=lambda d, t: seen.append((d, t)),
        console=Console(file=out, width=200),
    )
    for at, done, total in reports:
        clock["now"] = 100.0 + at
        note(done, total)
    assert seen == [(d, t) for _, d, t in reports]  # the wrapped callback sees every report
    return out.getvalue()


def test_a_long_run_says_once_how_long_is_left(monkeypatch):
    # 1,000 of 100,000 in 4 s: 396 s left
    text = note_for(
        monkeypatch, [(1.0, 100, 100_000), (4.0, 1_000, 100_000), (8.0, 2_000, 100_000)]
    )
    assert text.count("note:") == 1
    assert "at the pace so far, about 7 min left" in text
    assert "(1,000 of 100,000 requests simulated in 4 s)" in text
    assert "Ctrl-C stops it" in text and "fewer --requests" in text


def test_a_short_run_says_nothing(monkeypatch):
    # half done after 3.5 s: 7 s in all, under 30
    assert note_for(monkeypatch, [(3.5, 500, 1_000), (6.0, 900, 1_000)]) == ""
    # finished before the first look
    assert note_for(monkeypatch, [(5.0, 1_000, 1_000)]) == ""


def test_durations_in_words():
    assert duration_words(42) == "42 s"
    assert duration_words(396) == "7 min"
    assert duration_words(3 * 3600 + 1800) == "3.5 h"
