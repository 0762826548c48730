"""The picture of a ``cosmos3-gym bench`` result, written beside its JSON (``bench.png/.svg``).

Three panels over the batch sizes measured: the latency of one call of B items against B serial
calls of one item; the actions per second both ways, with the batched speedup written at each
point; and the share of each pipeline stage in a batched call's time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosmos3_gym.plotting import new_figure, save_figure

BATCHED, SERIAL = "#1f77b4", "#7f7f7f"
# Stage colours in pipeline order; the small host-side stages share greys, the model's stages
# stand out.
STAGE_COLOURS = {
    "admission": "#d9d9d9", "preprocess": "#bdbdbd", "prompt": "#9ecae1", "encode": "#6baed6",
    "noise": "#969696", "denoise": "#08519c", "decode": "#fd8d3c",
}


def plot_bench(result: dict[str, Any], stem: Path) -> list[Path]:
    """Draw ``stem.png`` and ``stem.svg`` from a :func:`~cosmos3_gym.bench.latency.run_benchmark`
    result. Lines and bars carry SVG ids (``latency-batched``, ``stage-denoise-B8``, ...)."""
    rows = result["batched"]
    sizes = [int(b) for b in rows]
    fig = new_figure(13.0, 4.2)
    latency_ax, rate_ax, stage_ax = fig.subplots(1, 3, width_ratios=(1, 1, 1.2))

    for ax, key, title, unit in (
        (latency_ax, "latency_s", "Latency of B items", "seconds (lower is better)"),
        (rate_ax, "actions_per_s", "Throughput (labels: batched / serial)",
         "actions per second (higher is better)"),
    ):
        serial_key = f"serial_{key}"
        batched = ax.plot(sizes, [r[key] for r in rows.values()], "o-", color=BATCHED,
                          label="batched: one call of B items")[0]
        serial = ax.plot(sizes, [r[serial_key] for r in rows.values()], "s--", color=SERIAL,
                         label="serial: B calls of 1 item")[0]
        name = key.split("_")[0]
        batched.set_gid(f"{name}-batched")
        serial.set_gid(f"{name}-serial")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.minorticks_off()
        ax.set_xlabel("batch size B")
        ax.set_ylabel(unit)
        ax.set_title(title, fontsize=10, loc="left")
        ax.grid(color="#e5e5e5", linewidth=0.6)
        ax.set_ylim(bottom=0)
        ax.legend(frameon=False, fontsize=8, loc="upper left")
    for b, row in zip(sizes, rows.values(), strict=True):
        # A ratio the run flagged as unstable (a busy machine made it up) is not drawn.
        label = f"{row['speedup_vs_serial']:.1f}x" if row.get("stable", True) else "unstable"
        rate_ax.annotate(label, (b, row["actions_per_s"]),
                         textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8,
                         color=BATCHED)

    stages = list(next(iter(rows.values()))["stages_s"])
    totals = [sum(r["stages_s"].values()) for r in rows.values()]
    left = [0.0] * len(sizes)
    positions = range(len(sizes))
    for stage in stages:
        shares = [r["stages_s"][stage] / t for r, t in zip(rows.values(), totals, strict=True)]
        bars = stage_ax.barh(positions, shares, left=left, height=0.7,
                             color=STAGE_COLOURS.get(stage, "#cccccc"), label=stage)
        for b, patch in zip(sizes, bars, strict=True):
            patch.set_gid(f"stage-{stage}-B{b}")
        for y, (start, share) in enumerate(zip(left, shares, strict=True)):
            if share >= 0.08:  # label the segments wide enough to hold their number
                dark = stage in ("denoise", "encode")
                stage_ax.text(start + share / 2, y, f"{share:.0%}", ha="center", va="center",
                              fontsize=8, color="white" if dark else "black")
        left = [a + s for a, s in zip(left, shares, strict=True)]
    stage_ax.set_yticks(list(positions), [f"B={b}" for b in sizes])
    stage_ax.set_ylim(len(sizes) - 0.5, -0.5)
    stage_ax.set_xlim(0, 1)
    stage_ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0], ["0%", "25%", "50%", "75%", "100%"])
    stage_ax.set_xlabel("share of a batched call's time")
    stage_ax.set_title("Where the time goes", fontsize=10, loc="left")
    stage_ax.legend(ncols=4, fontsize=8, frameon=False, loc="upper center",
                    bbox_to_anchor=(0.5, -0.18))
    for ax in (latency_ax, rate_ax, stage_ax):
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    checkpoint = Path(str(result["checkpoint"])).name or result["checkpoint"]
    fig.suptitle(
        f"cosmos3-gym bench: {checkpoint} on {result['device']}, {result['image_size'][0]}x"
        f"{result['image_size'][1]} images, H={result['action_horizon']}, "
        f"{result['num_inference_steps']} denoising steps, medians of {result['repeats']} runs",
        fontsize=11, x=0.01, ha="left",
    )
    return save_figure(fig, stem)
