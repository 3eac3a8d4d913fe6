"""Regenerate the example outputs and figures that README.md and docs/ show, so they cannot
go stale: ``.venv/bin/python docs/dev/regenerate_examples.py`` rewrites them,
``--check`` only lists the stale ones (exit 1; ``tests/test_docs_examples.py`` runs it).

An example output is a fenced block right after a line ``<!-- output: capsim ARGS -->``:
the block holds ``$ capsim ARGS`` and what the command prints (stdout, then stderr) at 80
columns, trailing spaces dropped. The figures are the PNGs in ``FIGURES``, each made by the
command beside it.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKED = re.compile(r"^<!-- output: (capsim [^\n]*?) -->\n```([a-z]*)\n(.*?)^```", re.S | re.M)
FIGURES = {
    "docs/images/predict-sweep.png": (
        "capsim predict --gpu rtx3090 --model qwen3-coder-30b-a3b,qwen3-8b --concurrency 1..8 "
        "--max-ttft-p90-s 1 --min-agent-tok-s 40"
    ),
    "docs/images/plan-frontier.png": (
        "capsim plan --model qwen3-coder-30b-a3b --agents 16 --min-agent-tok-s 20 "
        "--max-ttft-p90-s 1 --gpus rtx3090,rtx4090,rtx5090,h100-sxm --counts 1,2,4"
    ),
    "docs/images/validation-parity.png": "capsim validate",
}
"""Each figure the docs show, and the command that draws it (``--plot PATH --force`` is
added)."""


def run(command: str) -> str:
    """What ``command`` (``capsim ...``) prints at 80 columns without colour, stdout then
    stderr, each line's trailing spaces dropped."""
    args = shlex.split(command)
    env = {**os.environ, "COLUMNS": "80", "LINES": "50", "NO_COLOR": "1", "TERM": "dumb"}
    done = subprocess.run(
        [sys.executable, "-m", "capsim", *args[1:]],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{command}: exit {done.returncode}\n{done.stderr}")
    text = done.stdout + done.stderr
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def shown_name(page: Path) -> str:
    """A page's path from the checkout's root where it lies inside it."""
    return str(page.relative_to(ROOT) if page.is_relative_to(ROOT) else page)


def blocks(page: Path) -> list[re.Match]:
    """The marked example blocks of one page."""
    return list(MARKED.finditer(page.read_text()))


def block_text(command: str, output: str) -> str:
    """A marked block's content: the command as typed, then its output."""
    return f"$ {command}\n{output}"


def stale_outputs(pages: list[Path] = PAGES) -> list[str]:
    """Where a shown output differs from what its command prints today: 'page: command'."""
    stale = []
    for page in pages:
        for match in blocks(page):
            command, _, shown = match.groups()
            if shown != block_text(command, run(command)):
                stale.append(f"{shown_name(page)}: {command}")
    return stale


def rewrite_outputs(pages: list[Path] = PAGES) -> list[str]:
    """Rewrite every marked block with its command's output today; the pages changed."""
    changed = []
    for page in pages:
        text = page.read_text()

        def fresh(match: re.Match) -> str:
            command, lang = match.group(1), match.group(2)
            body = block_text(command, run(command))
            return f"<!-- output: {command} -->\n```{lang}\n{body}```"

        new = MARKED.sub(fresh, text)
        if new != text:
            page.write_text(new)
            changed.append(shown_name(page))
    return changed


def draw_figures() -> list[str]:
    """Draw every figure in ``FIGURES`` again."""
    for path, command in FIGURES.items():
        run(f"{command} --plot {path} --force")
    return list(FIGURES)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="list stale outputs, change none")
    parser.add_argument("--no-figures", action="store_true", help="leave the PNGs as they are")
    args = parser.parse_args()
    if args.check:
        stale = stale_outputs()
        for where in stale:
            print(f"stale: {where}")
        return 1 if stale else 0
    for page in rewrite_outputs():
        print(f"rewrote {page}")
    if not args.no_figures:
        for path in draw_figures():
            print(f"drew {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
