"""An asyncio event loop on a virtual clock: time stands still while callbacks run and
jumps to the next timer when none is ready, so code that paces itself on ``loop.time()``
(capsim serve's driving loop) runs as fast as the host allows and gives the same answer
on any host, however busy. Real I/O is not waited for (the selector is polled), so it
suits code that talks through asyncio queues and timers, not sockets."""

from __future__ import annotations

import asyncio
import selectors

ZERO_WAIT_S = 1e-9
"""A poll with nothing to wait for moves the clock this far, so a loop that yields until
``loop.time()`` reaches a deadline (``await asyncio.sleep(0)`` in a while loop) ends."""


class _PollingSelector(selectors.SelectSelector):
    def __init__(self, loop: VirtualClockLoop):
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None):
        if timeout is None:
            raise RuntimeError("virtual clock: nothing is scheduled and nothing can arrive")
        self._loop.now += max(timeout, ZERO_WAIT_S)
        return super().select(0)


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` is virtual seconds from 0."""

    def __init__(self):
        self.now = 0.0
        super().__init__(_PollingSelector(self))

    def time(self) -> float:
        return self.now


def run_on_virtual_clock(coroutine):
    """Run ``coroutine`` to its end on a fresh VirtualClockLoop and return its result."""
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()
