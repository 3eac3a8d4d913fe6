"""A second tier of the prefix cache in system RAM: vLLM's KV offloading
(``--kv-offloading-size`` GiB, its native OffloadingConnector).

vLLM stores the full blocks a request computes to a buffer in pinned CPU memory as well as
keeping them in the GPU's cache, and looks a new request's prompt up there too: the blocks
found in CPU memory beyond those the GPU still holds are loaded back over the host link
instead of being computed again (the request waits for the load, holding its blocks, and
the other requests' steps go on). capsim keeps, per replica, how many leading blocks of
each token stream the buffer holds (streams evicted whole, least recently used first), and
delays a request whose prompt the buffer holds further than the GPU's cache by the time
the extra blocks take over the link; it then enters the engine with those tokens computed.

Not modelled: the stores' own traffic to the CPU (they run asynchronously, device to host,
while the link's other direction carries the loads), and a load racing an eviction.
"""

from __future__ import annotations

from collections import OrderedDict


class HostKVTier:
    """Leading blocks of each token stream held in system RAM, least recently used first."""

    def __init__(self, capacity_blocks: int):
        self.capacity = capacity_blocks
        self.used = 0
        self.lengths: OrderedDict[object, int] = OrderedDict()
        self.loaded_tokens = 0  # prompt tokens served from here instead of computed

    def store(self, content: object, blocks: int) -> None:
        """The stream's first ``blocks`` blocks are computed: keep them (as many as fit)."""
        blocks = min(blocks, self.capacity)
        have = self.lengths.get(content, 0)
        if blocks <= have:
            if have:
                self.lengths.move_to_end(content)
            return
        grow = blocks - have
        while self.used + grow > self.capacity:
            victim = next(iter(self.lengths))
            if victim == content:  # only this stream is left to make room from
                break
            self.used -= self.lengths.pop(victim)
        grow = min(grow, self.capacity - self.used)
        self.lengths[content] = have + grow
        self.lengths.move_to_end(content)
        self.used += grow

    def prefix(self, content: object) -> int:
        """Leading blocks of the stream held here (a use: it becomes the most recent)."""
        n = self.lengths.get(content, 0)
        if n:
            self.lengths.move_to_end(content)
        return n
