"""How far a prediction has got, in simulated requests, for a progress display."""

from __future__ import annotations

from collections.abc import Callable

REPORT_EVERY = 2_048
"""Finished requests between two reports (a report costs a callback, a request far less)."""


class Progress:
    """Counts the requests a prediction has simulated out of ``total`` and reports
    ``callback(done, total)`` every REPORT_EVERY of them and when a level is over."""

    def __init__(self, callback: Callable[[int, int], None], total: int):
        self.callback = callback
        self.total = total
        self.done = 0
        self._next = REPORT_EVERY

    def advance(self, requests: int = 1) -> None:
        """``requests`` more are done."""
        self.done += requests
        if self.done >= self._next:
            self._next = self.done + REPORT_EVERY
            self.callback(min(self.done, self.total), self.total)

    def settle(self, done: int) -> None:
        """Set the count to ``done`` (a level is over: the requests it was planned to
        send, whatever a driver counted) and report it."""
        self.done = done
        self._next = done + REPORT_EVERY
        self.callback(min(done, self.total), self.total)
