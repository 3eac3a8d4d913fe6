"""Ctrl-C: a long command stops within a second, with exit 130 and no traceback, its
worker processes included (they ignore SIGINT; the main process stops them)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest


@pytest.mark.parametrize(
    "args",
    [
        ["validate", "--calibrated"],
        ["calibrate", "calibration/published/seed002-rtx3090-moe-vs-dense.yaml", "--out", "{tmp}"],
    ],
)
def test_ctrl_c_stops_a_long_command_within_a_second(args, tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = [a.replace("{tmp}", str(tmp_path / "p.yaml")) for a in args]
    proc = subprocess.Popen(
        [sys.executable, "-m", "capsim", *argv],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own group, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(4)  # its workers are busy by now
    assert proc.poll() is None, "finished before it could be interrupted"
    started = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    try:
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert time.monotonic() - started < 1.5
    assert proc.returncode == 130
    assert b"Traceback" not in err
