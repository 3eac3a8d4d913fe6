"""What one scheduler step runs (``ScheduledStep``): the tokens and contexts of its
sequences, running ones first, then the admitted; what the step-time model reads."""

from __future__ import annotations

import numpy as np

from capsim.engine.request import SimRequest


def token_moments(tokens: list, contexts: list) -> tuple[float, int, float, float, float]:
    """ScheduledStep.moments of sequences given as lists: (tokens, sequences, summed
    context, sum of tokens x context, sum of tokens squared)."""
    return (
        float(sum(tokens)),
        len(tokens),
        float(sum(contexts)),
        float(sum(n * c for n, c in zip(tokens, contexts, strict=True))),
        float(sum(n * n for n in tokens)),
    )


class ScheduledStep:
    """What one step runs: token counts and contexts in running order, then admissions.

    ``decode_rows`` are the running rows that decode this step; ``prefills`` the
    (request, tokens, row) of every prefill chunk, running ones first; the argument
    ``decoding`` marks which of the leading (running) entries of ``new_tokens`` decode
    (None: all of them). Attributes ``count``: the sequences the step runs, and
    ``decoding``: how many of them decode.
    """

    __slots__ = (
        "_admitted",
        "_context",
        "_decoding",
        "_new_tokens",
        "count",
        "decode_rows",
        "decoding",
        "moments",
        "prefills",
    )

    def __init__(
        self,
        new_tokens: np.ndarray,
        context: np.ndarray,
        decode_rows: np.ndarray,
        prefills: list[tuple[SimRequest, int, int]],
        decoding: np.ndarray | None,
        admitted: tuple[list[float], list[float]] | None = None,
        moments: tuple[float, int, float, float, float] | None = None,
    ):
        self._new_tokens = new_tokens
        self._context = context
        self._admitted = admitted  # (tokens, contexts) appended to the arrays on first use
        self.decode_rows = decode_rows
        self.prefills = prefills
        self._decoding = decoding
        # where the scheduler summed them as it went: (tokens, sequences, summed context,
        # sum of tokens x context, sum of tokens squared), every count a whole number
        self.moments = moments
        self.decoding = int(decode_rows.size)
        if moments is not None:
            self.count = moments[1]
        else:  # the arrays' entries and the admitted ones not yet joined to them
            self.count = int(new_tokens.size) + (0 if admitted is None else len(admitted[0]))

    def _join_admitted(self) -> None:
        if self._admitted is not None:
            tokens, contexts = self._admitted
            self._new_tokens = np.concatenate((self._new_tokens, tokens))
            self._context = np.concatenate((self._context, contexts))
            self._admitted = None

    @property
    def new_tokens(self) -> np.ndarray:
        """Tokens each scheduled sequence processes, running ones first."""
        self._join_admitted()
        return self._new_tokens

    @property
    def context(self) -> np.ndarray:
        """Tokens in KV of each scheduled sequence before the step, in the same order."""
        self._join_admitted()
        return self._context

    def decode_context(self) -> np.ndarray:
        """Tokens in KV of each decoding sequence before the step (what a drafter reads)."""
        if self._decoding is None:  # the running rows all decode
            return self.context[: self.decode_rows.size]
        return self.context[: self._decoding.size][self._decoding]

    @property
    def empty(self) -> bool:
        return self.count == 0
