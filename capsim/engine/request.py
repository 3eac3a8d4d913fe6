"""A request inside the simulated server."""

from __future__ import annotations

import math

import simpy

WAITING, PREFILL, DECODE, DONE = "waiting", "prefill", "decode", "done"


class SimRequest:
    """One request's state as the scheduler sees it.

    Token bookkeeping: ``prefill_target`` tokens must have KV computed before the request
    decodes (its prompt, or prompt plus already generated tokens after a preemption);
    ``computed`` counts those done. In decode, ``kv_tokens`` is the tokens in the KV cache
    (the last generated token enters it in the next step) and ``generated`` the output
    tokens produced so far (fractional under speculative decoding, where a step gains the
    expected accepted tokens).
    """

    __slots__ = (
        "blocks",
        "cached_len",
        "cached_tokens",
        "computed",
        "content",
        "done",
        "finish",
        "first_scheduled",
        "first_token",
        "generated",
        "kv_tokens",
        "output_len",
        "phase",
        "preemptions",
        "prefill_target",
        "prompt_len",
        "replica",
        "reusable",
        "rid",
        "send",
        "session",
    )

    def __init__(
        self,
        env: simpy.Environment,
        rid: int,
        send: float,
        prompt_len: int,
        output_len: int,
        content: object,
        session: str | None = None,
        awaited: bool = True,
    ):
        self.rid = rid
        self.send = send
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.content = content  # identity of the token stream, for prefix-cache keys
        self.session = session
        # whether a later request can share this stream's prefix (agent sessions, traces
        # with a session id); unique prompts are never looked up again
        self.reusable = session is not None
        self.prefill_target = prompt_len
        self.computed = 0
        self.generated = 0.0
        self.kv_tokens = 0.0
        self.blocks = 0  # blocks held privately (not shared through the prefix cache)
        self.cached_len = 0  # leading blocks of its stream held through the prefix cache
        self.cached_tokens = 0
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.finish: float | None = None
        self.phase = WAITING
        self.preemptions = 0
        self.replica = -1
        # the event a client process waits on; None where no process waits (a closed
        # loop's clients are callbacks): an event per request is a fifth of a request's
        # simulation cost
        self.done = env.event() if awaited else None

    @property
    def total_blocks(self) -> int:
        return self.blocks + self.cached_len

    def blocks_for(self, tokens: float, block_size: int) -> int:
        """Blocks needed to hold ``tokens`` tokens of KV."""
        return math.ceil(tokens / block_size)
