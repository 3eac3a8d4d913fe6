"""Paged KV cache with prefix caching, as vLLM's V1 KV-cache manager keeps it.

Memory is a pool of fixed-size blocks (16 tokens by default). A request holds the blocks
its tokens occupy. With prefix caching, a *full* block is identified by the content of
the token stream up to its end. capsim keys blocks by stream (an agent's growing
conversation, a trace session) and position, which is exact for append-only streams. A
new request reuses the longest run of cached leading blocks of its stream, and vLLM always
recomputes at least the last prompt token. Blocks whose last user finished stay cached but
evictable, and are evicted when free blocks run out.

Bookkeeping is per stream, not per block: every holder of a stream holds a prefix of it,
so the reference count falls with position and a stream's evictable blocks always form a
suffix. Eviction takes tail blocks first from the least recently released stream; vLLM
evicts the least recently freed block first and frees a request's blocks tail first, which
is the same order whenever a stream has one holder at a time (every capsim workload but
traces that share a session between concurrent requests). A prompt no later request can
share (``reusable`` false) is not published at all: an evictable block is exactly as
allocatable as a free one.
"""

from __future__ import annotations

from collections import OrderedDict

from capsim.engine.kv_offload import HostKVTier
from capsim.engine.request import SimRequest


class Stream:
    """Cached leading blocks of one token stream and the prefixes requests hold."""

    __slots__ = ("cached", "held", "holders")

    def __init__(self) -> None:
        self.cached = 0  # leading blocks of the stream present in the cache
        self.holders: dict[int, int] = {}  # held prefix length -> requests holding it
        self.held = 0  # blocks referenced by at least one request (a prefix of cached)

    @property
    def evictable(self) -> int:
        return self.cached - self.held

    def hold(self, length: int) -> None:
        """One more request holds the first ``length`` blocks."""
        self.holders[length] = self.holders.get(length, 0) + 1
        if length > self.held:
            self.held = length

    def drop(self, length: int) -> None:
        """A request holding the first ``length`` blocks lets go of them."""
        left = self.holders[length] - 1
        if left:
            self.holders[length] = left
        else:
            del self.holders[length]
            if length == self.held:
                self.held = max(self.holders) if self.holders else 0


class KVCache:
    """Block accounting for one replica."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        prefix_caching: bool = True,
        state_blocks: int = 0,
        host_blocks: int = 0,
    ):
        """``host_blocks``: blocks of a second tier in system RAM (vLLM's
        --kv-offloading-size; engine/kv_offload.py), 0: none."""
        if num_blocks < 1:
            raise ValueError("a KV cache needs at least one block")
        self.num_blocks = num_blocks
        # blocks each running request's recurrent state holds (hybrid models whose engine
        # pages the state into this pool), taken at admission and freed with its KV
        self.state_blocks = state_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.free = num_blocks  # neither held nor cached
        self.streams: dict[object, Stream] = {}
        self.lru: OrderedDict[object, None] = OrderedDict()  # streams with evictable blocks
        self.evictable = 0
        self.peak_used = 0
        self.hit_tokens = 0
        self.query_tokens = 0
        self.host = HostKVTier(host_blocks) if host_blocks > 0 and prefix_caching else None

    @property
    def used(self) -> int:
        """Blocks held by requests (private or shared)."""
        return self.num_blocks - self.free - self.evictable

    @property
    def allocatable(self) -> int:
        return self.free + self.evictable

    def _note_peak(self) -> None:
        used = self.num_blocks - self.free - self.evictable
        if used > self.peak_used:
            self.peak_used = used

    def _set_evictable(self, content: object, stream: Stream, before: int) -> None:
        """Account for a change in a stream's evictable count (``before`` the change)."""
        after = stream.evictable
        self.evictable += after - before
        if after > 0 and before == 0:
            self.lru[content] = None
        elif after == 0 and before > 0:
            del self.lru[content]

    def _evict(self, n: int) -> None:
        while n > 0:
            content = next(iter(self.lru))
            stream = self.streams[content]
            take = min(n, stream.evictable)
            before = stream.evictable
            stream.cached -= take
            self.free += take
            n -= take
            self._set_evictable(content, stream, before)
            if stream.cached == 0 and not stream.holders:
                del self.streams[content]

    def reserve(self, n: int) -> None:
        """Take ``n`` blocks out of the pool, evicting cached ones if needed; the caller
        has checked that they are allocatable and credits them to requests."""
        if n > self.free:
            self._evict(n - self.free)
        self.free -= n
        used = self.num_blocks - self.free - self.evictable  # _note_peak, inline
        if used > self.peak_used:
            self.peak_used = used

    def allocate(self, req: SimRequest, n: int) -> bool:
        """Give ``req`` ``n`` more private blocks, evicting cached ones if needed."""
        if n <= 0:
            return True
        if n > self.free + self.evictable:
            return False
        self.reserve(n)
        req.blocks += n
        return True

    def admit_state(self) -> None:
        """A request joined the running set: its recurrent state takes its blocks (the
        caller has checked they are allocatable)."""
        if self.state_blocks:
            self.reserve(self.state_blocks)

    def cached_prefix(self, req: SimRequest) -> int:
        """Leading full blocks of ``req``'s prompt found in the cache (not yet taken)."""
        if not self.prefix_caching or not req.reusable:
            return 0
        stream = self.streams.get(req.content)
        if stream is None:
            return 0
        full = (req.prompt_len - 1) // self.block_size  # keep >= 1 token to compute
        return min(stream.cached, full)

    def host_prefix(self, req: SimRequest) -> int:
        """Leading full blocks of ``req``'s prompt in the tier in system RAM (0 without
        one), as ``cached_prefix`` counts the GPU's."""
        if self.host is None or not req.reusable:
            return 0
        full = (req.prompt_len - 1) // self.block_size  # keep >= 1 token to compute
        return min(self.host.prefix(req.content), full)

    def evictable_among(self, req: SimRequest, hits: int) -> int:
        """How many of the first ``hits`` blocks of ``req``'s stream are evictable now."""
        if hits == 0:
            return 0
        return max(0, hits - self.streams[req.content].held)

    def can_admit(self, req: SimRequest, need: int, hits: int) -> bool:
        """Whether a waiting ``req`` can join the running set: ``need`` more blocks for its
        tokens and its recurrent state's blocks, besides the ``hits`` cached leading blocks
        it will take (those that are evictable now stop being allocatable)."""
        taken = self.evictable_among(req, hits) if hits else 0
        return need + self.state_blocks <= self.free + self.evictable - taken

    def take_prefix(self, req: SimRequest, hits: int) -> None:
        """Reference ``hits`` cached leading blocks for ``req``."""
        if hits == 0:
            return
        stream = self.streams[req.content]
        before = stream.evictable
        stream.hold(hits)
        req.cached_len = hits
        self._set_evictable(req.content, stream, before)
        self._note_peak()

    def register(self, req: SimRequest, tokens: float) -> None:
        """Publish ``req``'s full blocks covering its first ``tokens`` tokens."""
        if not self.prefix_caching or not req.reusable:
            return
        full = int(tokens) // self.block_size
        if self.host is not None:  # written through to system RAM, whatever the GPU keeps
            self.host.store(req.content, full)
        stream = self.streams.get(req.content)
        if stream is None:
            stream = self.streams[req.content] = Stream()
        have = req.cached_len
        if stream.cached != have or full <= have:
            return  # another request extended this stream, or nothing new is full
        grow = min(full - have, req.blocks)
        if grow <= 0:
            return
        before = stream.evictable
        if have:
            stream.drop(have)
        stream.hold(have + grow)
        stream.cached += grow
        req.blocks -= grow
        req.cached_len = have + grow
        self._set_evictable(req.content, stream, before)

    def release(self, req: SimRequest) -> None:
        """Free a running ``req``'s private blocks and its recurrent state's; its cached
        blocks become evictable when no other request holds them. Only requests admitted
        (``admit_state``) and not yet released come here: a finish or a preemption."""
        self.free += req.blocks + self.state_blocks
        req.blocks = 0
        held = req.cached_len
        if held:
            stream = self.streams[req.content]
            before = stream.evictable
            stream.drop(held)
            req.cached_len = 0
            self._set_evictable(req.content, stream, before)
            if stream.evictable:
                self.lru.move_to_end(req.content)  # most recently released
