"""``capsim import FORMAT FILE``: other tools' results as capsim run files.

(No ``from __future__ import annotations`` here: the commands are built in a loop and
typer must see their annotations evaluated.)
"""

from pathlib import Path
from typing import Annotated

import typer

from capsim.cli.common import PLAIN_HELP, ForceOption, JsonOption, print_json, user_errors
from capsim.cli.probe import print_run

import_app = typer.Typer(
    help="Import benchmark results from vLLM bench, GuideLLM or AIPerf.", **PLAIN_HELP
)


def _command(kind: str, tool: str):
    @user_errors
    def command(
        result: Annotated[Path, typer.Argument(help=f"The {tool} result JSON")],
        out: Annotated[
            Path | None,
            typer.Option(
                "--out",
                help="Run file to write: NAME.json (the summary) and NAME.jsonl (the "
                "requests), whatever suffix NAME has (default: "
                f"calibration/runs/RESULT-{kind}.json under the current folder)",
            ),
        ] = None,
        json_out: JsonOption = False,
        force: ForceOption = False,
    ) -> None:
        from capsim.files import refuse_missing_folder, refuse_overwrite, refuse_writing_over_inputs
        from capsim.probe.importers import import_results
        from capsim.probe.runfile import run_file_paths

        target = out or Path("calibration/runs") / f"{result.stem}-{kind}.json"
        # a folder, a device, no name: never ('--out .' and '--out /' have no name to add
        # .json to, and were a ValueError traceback from pathlib)
        refuse_overwrite([target], "--out", True)
        written = list(run_file_paths(target))
        # with --force the result file was replaced by the run it was read into
        refuse_writing_over_inputs(written, [result], "--out")
        refuse_overwrite(written, "--out", force)
        if out is not None:  # calibration/runs under the current folder is created
            refuse_missing_folder(target.parent, "--out", target)
        summary = import_results(kind, result, target)
        if json_out:
            print_json(summary.model_dump(mode="json"))
        else:
            print_run(summary, target)

    command.__doc__ = f"Import a {tool} result as a capsim run file."
    return command


import_app.command("vllm-bench")(_command("vllm-bench", "vllm bench serve --save-result"))
import_app.command("guidellm")(_command("guidellm", "guidellm benchmarks.json"))
import_app.command("aiperf")(_command("aiperf", "AIPerf profile_export_aiperf.json"))
