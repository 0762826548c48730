"""The tables of docs/evaluation.md's "Latency" section, from the runs that measured them.

    python3 scripts/latency_table.py arms RUN [RUN ...]      # latency sweeps (eval --latency a,b)
    python3 scripts/latency_table.py switches ROLLOUT [...]  # the jump where a new chunk takes over

``arms``: one row per arm of each sweep folder: its success rate and Wilson interval, its
paired difference to the control with Newcombe's interval, the mean delay, the actions dropped
and the stalls per episode. ``switches``: in a rollout folder, the mean distance between an
env's consecutive actions where the second comes from a newer chunk (the switch, where RTC is
meant to help) and where both come from the same chunk.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def arms_rows(folder: Path) -> list[str]:
    results = json.loads((folder / "results.json").read_text())
    control = results["control"]
    rtc = json.loads((folder / "config.json").read_text())["identity"].get("rtc")
    rows = []
    for name, arm in results["arms"].items():
        lo, hi = arm["interval"]
        latency = arm.get("latency") or {}
        delay = (latency.get("delay_steps") or {}).get("mean")
        episodes = arm["episodes"] or 1
        paired = results["paired"].get(name)
        diff = "control" if paired is None else (
            f"{100 * paired['difference']:+.1f} [{100 * paired['interval'][0]:+.1f}, "
            f"{100 * paired['interval'][1]:+.1f}]")
        rows.append(f"| {name} | {'on' if rtc and name != control else 'off'} | "
                    f"{100 * arm['success_rate']:.1f}% ({arm['successes']}/{arm['episodes']}) "
                    f"[{100 * lo:.1f}, {100 * hi:.1f}] | {diff} | "
                    f"{'-' if delay is None else f'{delay:.0f}'} | "
                    f"{(latency.get('dropped_actions') or 0) / episodes:.1f} | "
                    f"{(latency.get('stalls') or 0) / episodes:.1f} |")
    return rows


def switch_jumps(folder: Path) -> dict[str, float]:
    from cosmos3_gym.runner import load_rollouts

    data = load_rollouts(folder)
    actions, ids, episodes = data["actions"], data["chunk_ids"], data["episode_ids"]
    same = (episodes[1:] == episodes[:-1]) & (ids[1:] >= 0) & (ids[:-1] >= 0)
    jump = np.linalg.norm(actions[1:] - actions[:-1], axis=-1)
    switch = same & (ids[1:] != ids[:-1])
    within = same & (ids[1:] == ids[:-1])
    return {"switch_mean": float(jump[switch].mean()), "switches": int(switch.sum()),
            "within_mean": float(jump[within].mean()), "within": int(within.sum())}


def main(argv: list[str]) -> None:
    kind, folders = argv[0], [Path(a) for a in argv[1:]]
    if kind == "arms":
        print("| latency | RTC | success [95% interval] | vs 0, points [paired 95%] | d | "
              "dropped / episode | stalls / episode |")
        print("|---|---|---|---|---|---|---|")
        for folder in folders:
            print("\n".join(arms_rows(folder)))
    elif kind == "switches":
        for folder in folders:
            print(folder, json.dumps(switch_jumps(folder)))
    else:
        raise SystemExit(f"expected arms or switches; found {kind!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
