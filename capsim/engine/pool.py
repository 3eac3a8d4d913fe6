"""Worker processes for simulations that run in parallel, and Ctrl-C.

Workers ignore SIGINT: a Ctrl-C in a terminal reaches every process of the foreground
group, and only the main process should answer it (one message, no traceback from each
worker). When the block is left by an exception (KeyboardInterrupt included), queued work
is cancelled and the workers are stopped at once rather than waited for, so an
interrupted command exits within a fraction of a second.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager

_IN_WORKER = False
"""True in a worker process of a ``worker_pool``."""


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this worker when the process that started it dies (Linux's
    PR_SET_PDEATHSIG): a command killed outright (SIGKILL, a caller's timeout) left its
    workers waiting forever on their queue, holding the command's stdout pipe open, so a
    pipeline reading it never ended. Elsewhere nothing is set up."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request was made
        os._exit(1)


def _worker_start(initializer: Callable | None, initargs: tuple, parent: int = 0) -> None:
    global _IN_WORKER
    _IN_WORKER = True
    if parent:
        _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer(*initargs)


def cores_for(jobs: int) -> int:
    """Processes to spread ``jobs`` independent jobs over: one a core, at most one a job;
    1 in a pool's worker, which never starts a pool of its own (its workers would outlive
    a Ctrl-C: the worker ignores SIGINT and is killed by its parent, theirs are not)."""
    if _IN_WORKER:
        return 1
    return max(1, min(os.cpu_count() or 1, jobs))


def quiet_cancelled_futures() -> None:
    """From now on, leave out of stderr the InvalidStateError that the pool's management
    thread raises when a stopped worker's result meets a future already cancelled (the
    command is being interrupted and exits at once; the race printed a thread traceback
    under SIGTERM on a busy host). Any other exception in any thread is reported as
    before."""
    import threading
    from concurrent.futures import InvalidStateError

    previous = threading.excepthook

    def hook(args):
        if not issubclass(args.exc_type, InvalidStateError):
            previous(args)

    threading.excepthook = hook


@contextmanager
def worker_pool(
    max_workers: int, initializer: Callable | None = None, initargs: tuple = ()
) -> Iterator[ProcessPoolExecutor]:
    """A ProcessPoolExecutor whose workers ignore Ctrl-C and are stopped, not awaited,
    when the block raises; on a normal exit, work still queued is cancelled (a sweep
    that derived the levels above a saturated one no longer needs them)."""
    pool = ProcessPoolExecutor(
        max_workers=max_workers,
        initializer=_worker_start,
        initargs=(initializer, initargs, os.getpid()),
    )
    try:
        yield pool
    except BaseException:
        quiet_cancelled_futures()
        # stop the workers first: the pool then marks what was queued as failed (cancelling
        # it first would make the pool's own thread trip over the cancelled futures)
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.kill()  # SIGKILL: a worker caught mid-fork may never run a handler
        # jobs still queued for the dead workers: the queue's feeder thread may be blocked
        # writing one into a full pipe that nobody reads any more, and the interpreter
        # joins that thread at exit (a user error in a worker printed its message, then the
        # process hung): it is not joined
        call_queue = getattr(pool, "_call_queue", None)
        if call_queue is not None:
            call_queue.cancel_join_thread()
        pool.shutdown(wait=False)
        raise
    pool.shutdown(wait=True, cancel_futures=True)  # what was not needed is not run
