"""Issue 48: the outputs README.md and docs/ show are what the commands print today, and
the figures they show exist. ``docs/dev/regenerate_examples.py`` rewrites both; this test
runs its check."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "docs" / "dev" / "regenerate_examples.py"


def regenerate():
    spec = importlib.util.spec_from_file_location("regenerate_examples", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_shown_output_is_what_its_command_prints_today():
    module = regenerate()
    marked = [(page, m.group(1)) for page in module.PAGES for m in module.blocks(page)]
    assert len(marked) >= 3, marked  # the README's predict and capacity's two answers
    assert module.stale_outputs() == [], (
        "run .venv/bin/python docs/dev/regenerate_examples.py and commit what it rewrites"
    )


def test_a_shown_output_that_differs_is_reported_stale(tmp_path):
    module = regenerate()
    command = "capsim gpus show rtx3090"
    current = module.run(command)
    assert "936 GB/s" in current  # what the command prints, from the 80-column subprocess
    module.run = {command: current}.__getitem__  # the same answer again, without a process
    page = tmp_path / "page.md"
    shown = module.block_text(command, current)
    page.write_text(f"<!-- output: {command} -->\n```\n{shown}```\n")
    assert module.stale_outputs([page]) == []
    page.write_text(f"<!-- output: {command} -->\n```\n{shown.replace('936', '935')}```\n")
    assert module.stale_outputs([page]) == [f"{page}: {command}"]
    assert module.rewrite_outputs([page]) == [str(page)]
    assert module.stale_outputs([page]) == []


def test_every_figure_the_docs_show_exists_and_is_drawn_by_the_script():
    module = regenerate()
    shown = set()
    for page in module.PAGES:
        for name in re.findall(r"\]\((images/[^)]+\.png)\)", page.read_text()):
            shown.add(f"docs/{name}")
            assert (page.parent / name).is_file(), (page, name)
    assert shown == set(module.FIGURES), shown ^ set(module.FIGURES)
