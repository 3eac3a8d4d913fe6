"""Ctrl-C: a long command stops within a second, with exit 130 and no traceback, its
worker processes included (they ignore SIGINT; the main process stops them)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.wall_clock import Check, judge_on_the_wall_clock


@pytest.mark.parametrize(
    ("args", "sent", "status", "sigint"),
    [
        (["validate", "--calibrated"], signal.SIGINT, 130, signal.SIG_DFL),
        (
            [
                "calibrate",
                "calibration/published/seed002-rtx3090-moe-vs-dense.yaml",
                "--out",
                "{tmp}",
            ],
            signal.SIGINT,
            130,
            signal.SIG_DFL,
        ),
        # SIGTERM (kill, a service manager) stops it the same way, with 128 + 15
        (["validate", "--calibrated"], signal.SIGTERM, 143, signal.SIG_DFL),
        # also where SIGINT is ignored, as a non-interactive shell leaves it for a command
        # started with & (the handler used to resend SIGTERM as SIGINT: it ran to the end)
        (["validate", "--calibrated"], signal.SIGTERM, 143, signal.SIG_IGN),
    ],
)
def test_ctrl_c_stops_a_long_command_within_a_second(args, sent, status, sigint, tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = [a.replace("{tmp}", str(tmp_path / "p.yaml")) for a in args]
    proc = subprocess.Popen(
        [sys.executable, "-m", "capsim", *argv],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own group, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
    )
    time.sleep(4)  # its workers are busy by now
    assert proc.poll() is None, "finished before it could be interrupted"
    started = time.monotonic()
    os.killpg(proc.pid, sent)  # SIGINT: what Ctrl-C in a terminal does
    try:
        _, err = proc.communicate(timeout=45)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stop = Check("seconds to stop", time.monotonic() - started, 0.0, 1.5, False, slow="high")
    # nothing of it is left running: its worker processes ended with it (a worker forked
    # mid-signal once slept on in the command's process group after it exited)
    leftover = True
    for _ in range(50):
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            leftover = False
            break
        time.sleep(0.1)
    if leftover:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not leftover, "a process of the command outlived it by 5 s"
    assert proc.returncode == status, err.decode()[-2000:]
    assert b"Traceback" not in err
    # within 1.5 s on a quiet host; up to 30 s is the host's (a busy two-core VM under the
    # suite's other workers), and the bug this guards against (issue 47: calibrate took
    # 60 s to stop on SIGTERM) is beyond
    judge_on_the_wall_clock(lambda i: [stop], noise_band=5.0, attempts=1, slow_band=20.0)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # on purpose
def test_ctrl_c_swallowed_where_it_lands_still_stops_the_work():
    """CI, 2026-11-27: Ctrl-C landed in logging's fork hook, which ignores exceptions; the
    KeyboardInterrupt was lost, the ended workers broke the pool, and validate exited 1 with
    a traceback. The block's ``stopped`` still says Ctrl-C ended the work."""
    import weakref

    from capsim.cli.common import stop_on_ctrl_c

    class Holder:
        pass

    def swallowing_callback():  # a finalizer: CPython prints and ignores what it raises
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # bytecodes for the handler to run between
            pass

    with stop_on_ctrl_c() as ctrl_c:
        assert not ctrl_c.stopped(RuntimeError("a worker failed on its own"))
        holder = Holder()
        weakref.finalize(holder, swallowing_callback)
        del holder  # the finalizer runs here; its KeyboardInterrupt is swallowed
        assert ctrl_c.pressed
        assert ctrl_c.stopped(RuntimeError("process pool broken by the ended workers"))
        assert ctrl_c.stopped(KeyboardInterrupt())


@pytest.mark.parametrize(
    ("body", "lines"),
    [
        # Ctrl-C before any command caught it (while starting up): typer makes it exit 130
        ("raise KeyboardInterrupt", ["interrupted"]),
        # a command that kept its work says so itself, and no bare line follows
        (
            "common.interrupted('2 of 3 kept'); raise typer.Exit(130)",
            ["interrupted: 2 of 3 kept"],
        ),
    ],
)
def test_ctrl_c_always_ends_in_one_line_saying_so(body, lines):
    """Ctrl-C during start-up printed nothing and exited 130: typer turns an uncaught
    KeyboardInterrupt into exit 130, which the entry point took for a command that had
    already said what it kept."""
    script = (
        "import sys, typer\n"
        "from capsim.cli import common, main\n"
        "app = typer.Typer()\n"
        "@app.command()\n"
        f"def work():\n    {body}\n"
        "main.app_for = lambda args: app\n"
        "sys.argv = ['capsim']\n"
        "main.run()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 130, done.stderr
    assert [line for line in done.stderr.splitlines() if line.strip()] == lines


def test_serve_stops_on_sigterm_with_a_stream_in_flight():
    """`capsim serve` told to stop while a client streams a long answer cuts the stream
    off after a short grace (it waited for the last token: 8 s at --speedup 100, forever
    at 1), and says nothing alarming: no traceback for the request it cancelled."""
    import socket
    import threading

    import httpx

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["serve", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "capsim", *argv],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    streamed = threading.Event()

    def client() -> None:
        body = {"model": "llama-3.1-8b", "prompt": "hi", "max_tokens": 100_000, "stream": True}
        try:
            url = f"http://127.0.0.1:{port}/v1/completions"
            with httpx.stream("POST", url, json=body, timeout=60) as r:
                for _ in r.iter_lines():
                    streamed.set()
        except httpx.HTTPError:
            pass

    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        assert streamed.wait(30), "the stream never started"
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=45)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stop = Check("seconds to stop", time.monotonic() - started, 0.0, 2.0, False, slow="high")
    text = err.decode()
    assert proc.returncode == 143, text[-2000:]  # stopped by a signal, as every command
    assert "Traceback" not in text and "ERROR" not in text, text[-2000:]
    judge_on_the_wall_clock(lambda i: [stop], noise_band=5.0, attempts=1, slow_band=20.0)


@pytest.mark.parametrize("delay", [0.0, 0.03, 0.06, 0.1, 0.2])
def test_ctrl_c_while_the_command_is_still_starting_is_quiet(delay):
    """Ctrl-C in the first tenth of a second (Python importing typer and rich) printed a
    KeyboardInterrupt traceback from inside an import; capsim.entry takes the signal from
    the first line of capsim's own code. Where it lands depends on the host's speed, so
    every delay must end the same way: exit 130 (or death by SIGINT, before Python runs
    any code at all), or the command's own output where it had already finished."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "capsim", "gpus"],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    before_capsim = b"init_import_site" in err or (
        b"site-packages" not in err and b"capsim/cli" not in err
    )
    if b"Traceback" in err and before_capsim:
        # the signal came while Python started (its site module, runpy finding the
        # package), before capsim's first line could take it: a window of a few
        # milliseconds that is the interpreter's; the one this test is about (typer,
        # rich and pydantic importing, 0.1 s) shows their files in the traceback
        return
    assert b"Traceback" not in err, err.decode()[-2000:]
    assert proc.returncode in (0, 130, -signal.SIGINT), err.decode()[-2000:]
