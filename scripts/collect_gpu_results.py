"""Collect one device session's synthetic Nano benchmark files into ``docs/bench_gpu_nano.json``.

    python3 scripts/collect_gpu_results.py docs/gpu_results/2026-11-30 docs/bench_gpu_nano.json

The results folder holds the raw outputs as they came back from the GPU machine, plus a
``session.json`` written by hand: ``{"date", "commit", "commands": {file name: command line}}``.
Every ``*.json`` in the folder with ``"preset": "nano"`` and ``rows`` is a
``cosmos3-gym bench --synthetic nano`` result (see ``bench/synthetic.py``); their rows, diffusers
reference steps and option flips are gathered into one file. Each row, reference and flip keeps
the name of the file it came from (``source``): two runs of the same (case, batch size, steps)
are both kept, told apart by that name. Nothing is averaged or rounded, and the output depends
only on the folder's contents (files are read in name order), so rerunning this reproduces the
committed file byte for byte (``tests/test_docs_gpu_results.py``). Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

CASES = ("libero_256x512", "droid_480x832")
# The keys every row of docs/bench_gpu_nano.json has, with their types; the rest are extras.
ROW_KEYS: dict[str, type] = {
    "case": str, "batch_size": int, "steps": int, "call_s": float, "denoise_tflops": float,
    "gpu_busy": float,
}
ROW_EXTRAS = ("denoise_step_s", "peak_memory_mb", "kernels")
MANIFEST = "session.json"


def bench_files(folder: Path, preset: str) -> dict[str, dict[str, Any]]:
    """The synthetic benchmark results of ``preset`` in ``folder``, by file name, in name
    order."""
    found = {}
    for path in sorted(folder.glob("*.json")):
        if path.name == MANIFEST:
            continue
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("preset") == preset and "rows" in data:
            found[path.name] = data
    if not found:
        raise ValueError(f"{folder}: no benchmark JSON with preset {preset!r} and rows")
    return found


def _row(raw: dict[str, Any], source: str) -> dict[str, Any]:
    row = {key: raw[key] for key in ROW_KEYS}
    if row["case"] not in CASES or row["gpu_busy"] is None:
        raise ValueError(f"{source}: expected a CUDA row of one of {CASES}, got {row}")
    row.update({key: raw[key] for key in ROW_EXTRAS if key in raw})
    row["source"] = source
    return row


def _common(values: list[Any], name: str) -> Any:
    """The one value every file agrees on; the files of one collection come from one machine
    and one configuration, so a disagreement is an error rather than something to pick from."""
    first = values[0]
    if any(v != first for v in values[1:]):
        raise ValueError(f"the benchmark files disagree on {name}: {values}")
    return first


def collect(folder: Path, preset: str = "nano") -> dict[str, Any]:
    """``docs/bench_gpu_nano.json``'s content, built from one results folder."""
    manifest = json.loads((folder / MANIFEST).read_text())
    files = bench_files(folder, preset)
    missing = [name for name in files if name not in manifest["commands"]]
    if missing:
        raise ValueError(f"{folder / MANIFEST}: no command recorded for {missing}")
    results = list(files.values())
    rows = [_row(raw, name) for name, data in files.items() for raw in data["rows"]]
    rows.sort(key=lambda r: (CASES.index(r["case"]), r["steps"], r["batch_size"], r["source"]))
    reference = [
        {"case": case, **entry, "source": name}
        for name, data in files.items()
        for case, entry in data["reference"].items() if entry is not None
    ]
    flips = [
        {"case": case, "batch_size": int(b), "option": option, **entry, "source": name}
        for name, data in files.items()
        for case, per_b in data["flips"].items()
        for b, per_option in per_b.items()
        for option, entry in per_option.items()
    ]
    return {
        "gpu": _common([d["gpu"] for d in results], "gpu"),
        "preset": preset,
        "dtype": _common([d["dtype"] for d in results], "dtype"),
        "torch": _common([d["torch"] for d in results], "torch"),
        "date": manifest["date"],
        "commit": manifest["commit"],
        "options": _common([d["options"] for d in results], "options"),
        "statistic": _common([d["statistic"] for d in results], "statistic"),
        "sources": {
            name: {
                "command": manifest["commands"][name],
                "warmup": data["warmup"],
                "repeats": data["repeats"],
                "complete": data["complete"],
                "self_check_disabled": data["self_check"]["disabled"],
                "max_abs_action_diff_vs_eager":
                    data["self_check"]["max_abs_action_diff_vs_eager"],
            }
            for name, data in files.items()
        },
        "rows": rows,
        "reference": reference,
        "flips": flips,
    }


def render(result: dict[str, Any]) -> str:
    return json.dumps(result, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="one device session's raw results")
    parser.add_argument("out", type=Path, help="the JSON to write (docs/bench_gpu_nano.json)")
    parser.add_argument("--preset", default="nano", help="which benchmark files (default: nano)")
    args = parser.parse_args(argv)
    args.out.write_text(render(collect(args.folder, args.preset)))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
