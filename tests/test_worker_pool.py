"""Worker pools: a pool's worker never starts a pool of its own.

Its workers would outlive a Ctrl-C: a pool's worker ignores SIGINT and is killed by the
process that started it, which would leave the worker's own workers running, orphaned
(validate --calibrated, which fits dataset parts in a pool, once did)."""

from __future__ import annotations

import os

from capsim.engine.pool import cores_for, worker_pool
from capsim.engine.simulate import resolve_workers


def cores_seen_in_a_worker(jobs: int) -> tuple[int, int]:
    return cores_for(jobs), resolve_workers(None, jobs, 10**9)


def test_a_pools_worker_runs_its_jobs_in_series(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert cores_for(8) == 4 and cores_for(3) == 3 and cores_for(0) == 1
    with worker_pool(2) as pool:
        assert pool.submit(cores_seen_in_a_worker, 8).result() == (1, 1)
    assert cores_for(8) == 4  # the parent's own count is untouched
