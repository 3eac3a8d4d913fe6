#!/usr/bin/env python3
"""Turn the JSONL output of the GPU benchmarks into a kernel dataset (calibration/kernels).

Reads any mix of ``decode_layers.py``, ``prefill_layers.py`` and ``profile_layers.py``
outputs: each ``meta`` line starts a run (the rows after it point at it), layer rows become
the dataset's rows, ``gemm`` and ``attention`` rows and profiles are kept beside them as the
evidence for priors. Every layer row must have been measured with the same elementwise
kernels (eager or fused), which the dataset records. Runs on any machine (no GPU).

    python benchmarks/gpu/make_kernel_dataset.py --name h100-sxm-fused-layers --gpu h100-sxm \\
        --title "..." --note "..." --command "..." --out calibration/kernels/X.json A.jsonl B.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

LAYER_KINDS = ("decode_layers", "prefill_layers")
KERNEL_NAME_CHARS = 160


def build(files: list[Path], commands: list[str]) -> dict:
    """Runs, rows, GEMMs, attention and profiles of the JSONL files, in order."""
    runs: list[dict] = []
    rows: list[dict] = []
    gemms: list[dict] = []
    attention: list[dict] = []
    profiles: list[dict] = []
    modes: set[str] = set()
    for path in files:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            kind = rec.pop("kind")
            if kind == "meta":
                runs.append(rec | {"command": commands[len(runs)] if commands else ""})
            elif kind in LAYER_KINDS:
                modes.add(rec.pop("elementwise", "eager"))
                rows.append(rec | {"run": len(runs) - 1})
            elif kind == "gemm":
                gemms.append(rec | {"run": len(runs) - 1})
            elif kind == "attention":
                attention.append(rec | {"run": len(runs) - 1})
            elif kind.endswith("_profile"):
                kernels = {
                    name[:KERNEL_NAME_CHARS]: k for name, k in rec.pop("kernels", {}).items()
                }
                profiles.append(rec | {"step": kind.removesuffix("_profile"), "kernels": kernels})
    if len(modes) > 1:
        raise SystemExit(f"rows mix elementwise kernels {sorted(modes)}: one dataset each")
    return {
        "runs": runs,
        "elementwise": modes.pop() if modes else "eager",
        "rows": rows,
        "gemms": gemms,
        "attention": attention,
        "profiles": profiles,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--name", required=True)
    ap.add_argument("--gpu", required=True, help="catalog GPU name")
    ap.add_argument("--title", required=True)
    ap.add_argument("--note", required=True)
    ap.add_argument("--script", default="benchmarks/gpu/decode_layers.py")
    ap.add_argument("--command", action="append", default=[], help="one per run, in order")
    ap.add_argument("--caveat", action="append", default=[])
    ap.add_argument("--shares", help="eager elementwise shares as JSON (op: share of peak)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    body = build(args.files, args.command)
    dataset = {
        "name": args.name,
        "gpu": args.gpu,
        "source": {"title": args.title, "script": args.script, "note": args.note},
        "caveats": args.caveat,
        "runs": body["runs"],
        "elementwise": body["elementwise"],
        "eager_elementwise_shares": json.loads(args.shares) if args.shares else None,
        "rows": body["rows"],
        "gemms": body["gemms"],
        "attention": body["attention"],
        "profiles": body["profiles"],
    }
    args.out.write_text(json.dumps(dataset, indent=1) + "\n")
    print(f"{args.out}: {len(body['rows'])} rows, {len(body['runs'])} runs")


if __name__ == "__main__":
    main()
