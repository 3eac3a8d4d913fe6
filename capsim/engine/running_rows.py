"""The running requests' decode state as numpy rows (one column per running request, in
``running`` order): loading a request into its row, storing the row back into the request
object, and keeping the rows in step as requests join, are preempted or leave.

``RunningRows`` is mixed into ``Scheduler`` (engine/scheduler.py), which owns the arrays:
``_state`` (six float rows: tokens in KV, tokens generated, output length, blocks held,
prompt tokens computed, prefill target), ``_dec`` (whether each row decodes), the count of
rows still in prefill and the lower bound on the output tokens left.
"""

from __future__ import annotations

import numpy as np

from capsim.engine.request import DECODE, SimRequest


class RunningRows:
    """Row bookkeeping of the scheduler's running requests (a mixin of Scheduler)."""

    def _load_row(self, i: int, req: SimRequest) -> None:
        self._kv[i] = req.kv_tokens
        self._gen[i] = req.generated
        self._out[i] = req.output_len + self._extra_steps
        self._blocks[i] = req.blocks + req.cached_len  # req.total_blocks
        self._dec[i] = req.phase == DECODE
        self._computed[i] = req.computed
        self._target[i] = req.prefill_target

    def _store_row(self, i: int, req: SimRequest) -> None:
        """Copy row ``i``'s blocks and decode progress back into its request object."""
        req.blocks = int(self._blocks[i]) - req.cached_len
        if self._dec[i]:
            req.kv_tokens = float(self._kv[i])
            req.generated = float(self._gen[i])

    def sync_requests(self) -> None:
        """Bring the running request objects' blocks and decode progress up to date (for
        reading them when a simulation ends with requests still running)."""
        for i, req in enumerate(self.running):
            self._store_row(i, req)

    def _append(self, req: SimRequest) -> int:
        row = len(self.running)
        self.running.append(req)
        self._load_row(row, req)
        if not self._dec[row]:
            self._prefilling += 1
        return row

    def _pop_last(self) -> SimRequest:
        """Take the newest running request out (a preemption victim), its row synced."""
        victim = self.running.pop()
        row = len(self.running)
        self._store_row(row, victim)
        if not self._dec[row]:
            self._prefilling -= 1
        else:
            self._least_left_exact = False
        return victim

    def _remove(self, row: int) -> None:
        if not self._dec[row]:
            self._prefilling -= 1
        self.running.pop(row)
        end = len(self.running)
        self._state[:, row:end] = self._state[:, row + 1 : end + 1]
        self._dec[row:end] = self._dec[row + 1 : end + 1]

    def period_key(self) -> tuple:
        """What decides the next steps besides the requests' own fields (engine/periodic.py
        compares it exactly): the rows' state, which decode, the prefill count, the bound
        on tokens left, and the KV cache's free and evictable blocks."""
        n = len(self.running)
        return (
            self._state[:, :n].tobytes(),
            self._dec[:n].tobytes(),
            self._prefilling,
            self._least_left,
            self._least_left_exact,
            self.kv.free,
            self.kv.evictable,
        )

    def decode_contexts(self) -> np.ndarray:
        """Tokens in KV of each running request (all decoding), in running order."""
        return self._kv[: len(self.running)].copy()
