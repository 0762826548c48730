"""The one way the commands draw plots: matplotlib, an optional extra (``cosmos3-gym[plot]``).

Figures are built with ``matplotlib.figure.Figure`` directly (no pyplot, so no GUI backend and
no global figure state), and each is saved as a PNG and an SVG side by side, each replaced
atomically so that a viewer open on a running evaluation's plot never reads half a file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from cosmos3_gym.jsonio import atomic_write

if TYPE_CHECKING:
    from matplotlib.figure import Figure

INSTALL_HINT = "matplotlib is not installed; pip install 'cosmos3-gym[plot]' to get the plots"


class PlottingUnavailable(ImportError):
    """matplotlib cannot be imported; the message says how to install it."""


def new_figure(width: float, height: float) -> Figure:
    """An empty figure of ``width`` x ``height`` inches with constrained layout."""
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise PlottingUnavailable(INSTALL_HINT) from err
    return Figure(figsize=(width, height), layout="constrained", dpi=100)


def save_figure(fig: Figure, stem: Path) -> list[Path]:
    """Write ``stem.png`` and ``stem.svg``; returns both paths."""
    import matplotlib

    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    # Text stays text in the SVG (searchable, small); a fixed hash salt and no date keep the
    # same figure byte-identical from one draw to the next.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "cosmos3-gym"}):
        for suffix, metadata in ((".png", {"Software": None}), (".svg", {"Date": None})):
            path = stem.with_name(stem.name + suffix)
            atomic_write(path, lambda f, suffix=suffix, metadata=metadata: fig.savefig(
                f, format=suffix[1:], metadata=metadata, facecolor="white"))
            paths.append(path)
    return paths
