"""A hostile environment gets a clear error (exit 2) or is worked around, never a
traceback or a hang (issue 47, the second fuzzing round of 2026-12-02): catalog overlays
with NaN or infinity, paths that loop or name a user who does not exist, matplotlib's
environment variables, and a Hub mirror that drips, never stops or sends a gzip bomb."""

from __future__ import annotations

import gzip
import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from capsim.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def test_a_quant_overlay_with_infinite_bits_is_refused(tmp_path):
    text = (ROOT / "hardware_db" / "quant_formats" / "awq-int4.yaml").read_text()
    (tmp_path / "quant_formats").mkdir()
    (tmp_path / "quant_formats" / "awq-int4.yaml").write_text(
        text.replace("weight_bits: 4", "weight_bits: .inf", 1)
    )
    args = ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "--quant", "awq-int4"]
    r = runner.invoke(app, [*args, "-c", "1", "--db", str(tmp_path)])
    assert r.exit_code == 2 and "finite number" in r.output, r.output


def cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """capsim in a process of its own (environment variables read at start-up)."""
    return subprocess.run(
        [sys.executable, "-m", "capsim", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )


def test_a_path_of_a_user_who_does_not_exist_is_exit_2():
    r = cli("predict", "--gpu", "h100-sxm", "-c", "1", "--model", "~nosuchuser-capsim")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "cannot be followed" in r.stderr


def test_a_profile_folder_of_looping_links_is_exit_2(tmp_path):
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "datacenter-hopper-vllm.yaml").symlink_to(folder / "datacenter-hopper-vllm.yaml")
    dataset = (
        ROOT / "calibration/published/corpus-vllm-pr23151-h100-qwen3-30b-a3b-bf16-2k1k-c10.yaml"
    )
    r = cli("calibrate", str(dataset), "--force", env={"CAPSIM_PROFILE_DIR": str(folder)})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("env", [{"MPLBACKEND": "no-such-backend"}, {"MATPLOTLIBRC": "/dev/zero"}])
def test_plots_are_drawn_whatever_matplotlibs_environment_says(tmp_path, env):
    plot = tmp_path / "p.png"
    args = ("predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "-c", "1")
    r = cli(*args, "--requests", "4", "--plot", str(plot), env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert plot.stat().st_size > 0


class HubMirror(http.server.BaseHTTPRequestHandler):
    """A Hub mirror that misbehaves by repo name."""

    def do_GET(self):
        kind = self.path.strip("/").split("/")[0]
        if kind == "drip":
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            for _ in range(100):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.5)
            return
        body = b'{"x": "' + b"a" * (8 * 2**20) + b'"}'
        headers = {}
        if kind == "bomb":
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        self.send_response(200)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def mirror():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HubMirror)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize(
    ("repo", "words"),
    [("drip", "whole within"), ("huge", "more than 4 MB"), ("bomb", "more than 4 MB")],
)
def test_a_hub_file_is_read_whole_within_its_time_and_size(
    mirror, tmp_path, monkeypatch, repo, words
):
    from capsim.catalog import resolve

    monkeypatch.setattr(resolve, "FETCH_TIMEOUT_S", 2.0)
    monkeypatch.setenv("HF_ENDPOINT", mirror)
    monkeypatch.setenv("CAPSIM_CACHE_DIR", str(tmp_path))
    # the drip would take 50 s: its message says the deadline ended it
    r = runner.invoke(app, ["fit", "--gpu", "h100-sxm", "--model", f"{repo}/some-model"])
    assert r.exit_code == 2 and words in r.output, r.output


def test_a_relative_profile_folder_is_ignored_with_a_note(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "capsim", "predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CAPSIM_PROFILE_DIR": "rel/p"},
        cwd=tmp_path,
    )
    assert r.returncode == 0 and "is not an absolute path: ignored" in r.stderr, r.stderr
    assert not (tmp_path / "rel").exists()


def test_a_cache_folder_that_is_a_file_is_said(tmp_path):
    """CAPSIM_CACHE_DIR=/dev/null (or a file) ran without a word, the cache unused."""
    plain = tmp_path / "cache-file"
    plain.write_text("not a folder")
    for path in ("/dev/null", str(plain)):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "capsim",
                "predict",
                "--gpu",
                "h100-sxm",
                "--model",
                "llama-3.1-8b",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "CAPSIM_CACHE_DIR": path},
            cwd=tmp_path,
        )
        said = " ".join(r.stderr.split())
        assert r.returncode == 0 and f"CAPSIM_CACHE_DIR='{path}' is not a folder" in said, said
    assert plain.read_text() == "not a folder"


def test_a_catalog_text_with_an_escape_sequence_is_refused(tmp_path):
    text = (ROOT / "hardware_db" / "gpus" / "h100-sxm.yaml").read_text()
    lines = [
        'display_name: "Evil \\e]0;PWNED\\a\\e[2J"' if line.startswith("display_name:") else line
        for line in text.replace("name: h100-sxm", "name: fz-gpu", 1).splitlines()
    ]
    lines = ["aliases: []" if line.startswith("aliases:") else line for line in lines]
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "fz-gpu.yaml").write_text("\n".join(lines) + "\n")
    r = runner.invoke(app, ["gpus", "show", "fz-gpu", "--db", str(tmp_path)])
    assert r.exit_code == 2 and "control character" in r.output, r.output
    assert "\x1b" not in r.output.replace("\\x1b", "")


def overlay_gpu(folder: Path, name: str, file: str) -> None:
    text = (ROOT / "hardware_db" / "gpus" / "h100-sxm.yaml").read_text()
    lines = [
        "aliases: []" if line.startswith("aliases:") else line
        for line in text.replace("name: h100-sxm", f"name: {name}", 1).splitlines()
    ]
    (folder / "gpus").mkdir(exist_ok=True)
    (folder / "gpus" / file).write_text("\n".join(lines) + "\n")


def test_two_files_of_one_entry_in_a_folder_are_refused(tmp_path):
    overlay_gpu(tmp_path, "fz-gpu", "fz-gpu.yaml")
    overlay_gpu(tmp_path, "fz-gpu", "fz-gpu.yml")
    r = runner.invoke(app, ["gpus", "show", "fz-gpu", "--db", str(tmp_path)])
    assert r.exit_code == 2 and "both define the gpus entry 'fz-gpu'" in r.output, r.output


def test_an_overlay_name_lookups_cannot_tell_from_a_built_in_one_is_refused(tmp_path):
    """'H100_SXM' was listed beside h100-sxm, and every lookup found the built-in one."""
    overlay_gpu(tmp_path, "H100_SXM", "x.yaml")
    r = runner.invoke(app, ["gpus", "--db", str(tmp_path)])
    assert r.exit_code == 2 and "but for case and separators" in r.output, r.output


def test_an_inverted_power_limit_range_is_refused(tmp_path):
    text = (ROOT / "hardware_db" / "gpus" / "h100-sxm.yaml").read_text()
    assert "  min_w: 200" in text and "  max_w: 700" in text
    text = text.replace("  min_w: 200", "  min_w: 700").replace("  max_w: 700", "  max_w: 200", 1)
    text = text.replace("name: h100-sxm", "name: fz-gpu", 1)
    lines = ["aliases: []" if line.startswith("aliases:") else line for line in text.splitlines()]
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "fz-gpu.yaml").write_text("\n".join(lines) + "\n")
    r = runner.invoke(app, ["gpus", "show", "fz-gpu", "--db", str(tmp_path)])
    assert r.exit_code == 2 and "min_w 700 W is above max_w 200 W" in r.output, r.output


def test_plan_says_which_power_limits_a_gpu_cannot_take():
    args = ["plan", "--model", "qwen3-0.6b", "--agents", "2", "--gpus", "h100-sxm"]
    r = runner.invoke(
        app, [*args, "--counts", "1", "--power-limits", "0.2", "--min-agent-tok-s", "5"]
    )
    assert r.exit_code == 0, r.output
    assert "140 W are below the 200 W it can be set to" in " ".join(r.output.split())


def test_an_overlay_folder_named_twice_is_read_once(tmp_path, monkeypatch):
    from capsim.catalog.loader import user_db_dirs

    first, other = tmp_path / "first", tmp_path / "other"
    first.mkdir()
    other.mkdir()
    monkeypatch.setenv("CAPSIM_DB", f"{first}{os.pathsep}{other}")
    # the later place keeps its precedence: first, named last, is laid over other
    assert user_db_dirs([first, first]) == [other, first]
