"""Paged KV cache with prefix caching, as vLLM's V1 KV-cache manager keeps it.

Memory is a pool of fixed-size blocks (16 tokens by default). A request holds the blocks
its tokens occupy. With prefix caching, a *full* block is identified by the content of
the token stream up to its end; capsim keys it by (stream identity, block index), which is
exact for append-only streams such as an agent's growing conversation. A new request
reuses the longest run of cached leading blocks of its stream, and vLLM always recomputes
at least the last prompt token. Blocks whose last user finished stay cached but
evictable, and are evicted least recently used first when free blocks run out.
"""

from __future__ import annotations

from collections import OrderedDict

from capsim.engine.request import SimRequest


class KVCache:
    """Block accounting for one replica."""

    def __init__(self, num_blocks: int, block_size: int = 16, prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError("a KV cache needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.free = num_blocks  # neither held nor cached
        self.refs: dict[tuple, int] = {}  # cached block key -> requests holding it
        self.evictable: OrderedDict[tuple, None] = OrderedDict()  # cached, refcount 0
        self.peak_used = 0
        self.hit_tokens = 0
        self.query_tokens = 0

    @property
    def used(self) -> int:
        """Blocks held by requests (private or shared)."""
        return self.num_blocks - self.free - len(self.evictable)

    @property
    def allocatable(self) -> int:
        return self.free + len(self.evictable)

    def usage(self) -> float:
        return self.used / self.num_blocks

    def _note_peak(self) -> None:
        used = self.used
        if used > self.peak_used:
            self.peak_used = used

    def allocate(self, req: SimRequest, n: int) -> bool:
        """Give ``req`` ``n`` more private blocks, evicting cached ones if needed."""
        if n <= 0:
            return True
        if n > self.allocatable:
            return False
        short = n - self.free
        for _ in range(max(short, 0)):
            key, _ = self.evictable.popitem(last=False)
            del self.refs[key]
            self.free += 1
        self.free -= n
        req.blocks += n
        self._note_peak()
        return True

    def cached_prefix(self, req: SimRequest) -> int:
        """Leading full blocks of ``req``'s prompt found in the cache (not yet taken)."""
        if not self.prefix_caching or not req.reusable:
            return 0
        full = (req.prompt_len - 1) // self.block_size  # keep >= 1 token to compute
        hits = 0
        while hits < full and (req.content, hits) in self.refs:
            hits += 1
        return hits

    def take_prefix(self, req: SimRequest, hits: int) -> None:
        """Reference ``hits`` cached leading blocks for ``req``."""
        for i in range(hits):
            key = (req.content, i)
            if self.refs[key] == 0:
                del self.evictable[key]
            self.refs[key] += 1
            req.cached_keys.append(key)
        self._note_peak()

    def register(self, req: SimRequest, tokens: int) -> None:
        """Publish ``req``'s full blocks covering its first ``tokens`` tokens to the cache."""
        if not self.prefix_caching or not req.reusable:
            # A stream no later request shares is never looked up again; its blocks would
            # sit in the cache as evictable, which for allocation is the same as free.
            return
        full = tokens // self.block_size
        for i in range(len(req.cached_keys), full):
            key = (req.content, i)
            if key in self.refs or req.blocks == 0:
                break  # another request already published it, or nothing private left
            self.refs[key] = 1
            req.blocks -= 1
            req.cached_keys.append(key)

    def release(self, req: SimRequest) -> None:
        """Free ``req``'s private blocks; its cached blocks become evictable at refcount 0."""
        self.free += req.blocks
        req.blocks = 0
        for key in reversed(req.cached_keys):
            self.refs[key] -= 1
            if self.refs[key] == 0:
                self.evictable[key] = None
        req.cached_keys = []
