"""A second tier of the prefix cache in system RAM: vLLM's KV offloading
(``--kv-offloading-size`` GiB, its native OffloadingConnector) and SGLang's hierarchical
cache (``--enable-hierarchical-cache``, a host pool ``--hicache-ratio`` times the GPU's).

Both write the full blocks a request computes through to pinned CPU memory as well as
keeping them in the GPU's cache, and look a new request's prompt up there too when they
schedule it: the blocks found in CPU memory beyond those the GPU still holds are loaded
back over the host link instead of being computed again. capsim keeps, per replica, how
many leading blocks of each token stream the tier holds (streams evicted whole, least
recently used first; ``KVCache.register`` stores, ``Scheduler._head_admission`` looks up),
and the step that admits such a request waits for the load (``Scheduler.take_load_seconds``;
vLLM loads asynchronously and SGLang overlaps the load with the layers, so this is an
upper bound on its cost).

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
