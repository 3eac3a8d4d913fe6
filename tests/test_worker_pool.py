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


HANGING_POOL = """
import sys
from capsim.engine.pool import worker_pool

def job(x):
    if x[0] == 0:
        raise ValueError("first job fails")
    import time
    time.sleep(0.2)
    return len(x[1])

if __name__ == "__main__":
    big = "x" * 2_000_000  # ~2 MB a job: the queue's pipe to the workers fills up
    try:
        with worker_pool(2) as pool:
            list(pool.map(job, [(i, big) for i in range(40)]))
    except ValueError as e:
        print("raised:", e)
    sys.exit(2)
"""


def test_an_error_in_a_worker_with_large_jobs_queued_exits_instead_of_hanging(tmp_path):
    """A worker's exception (a user error in one scenario of validate) with large jobs still
    queued left the call queue's feeder thread blocked on a full pipe, and the interpreter
    joined it at exit: the message was printed, then the process hung for good. The
    timeout only catches a hang; the run takes well under a second."""
    import subprocess
    import sys

    script = tmp_path / "hang.py"
    script.write_text(HANGING_POOL)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert "raised: first job fails" in done.stdout
