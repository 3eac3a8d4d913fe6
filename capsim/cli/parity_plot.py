"""``capsim validate --plot``: the parity plot of predicted against measured figures."""

from __future__ import annotations

from pathlib import Path

from capsim.cli.common import save_figure

PARITY_BAND = 0.25
"""Half-width of the band drawn around the parity line (relative error)."""


def tick_label(value: float, _position=None) -> str:
    """A log-axis tick as a plain number (1,000 rather than 10^3)."""
    return f"{value:,.6g}"


def empty_label(_value: float, _position=None) -> str:
    return ""


def minor_tick_label(value: float, _position=None) -> str:
    """Label the 2 and 5 of each decade on a log axis, leave the other minor ticks bare."""
    import numpy as np

    if value <= 0:
        return ""
    leading = round(value / 10 ** np.floor(np.log10(value)))
    return tick_label(value) if leading in (2, 5) else ""


def plot_parity(panels: dict[str, list[tuple[str, float, float]]], path: Path) -> None:
    """Parity plot: predicted against measured on log axes, one panel per error kind
    (title -> (dataset, measured, predicted) points), one colour per dataset, with the
    line of perfect prediction and a band of +-PARITY_BAND around it. Points of different
    metrics share a panel: each is compared with its own measurement, and the axes are
    in the metric's own unit (tok/s or s)."""
    import matplotlib
    import numpy as np

    from capsim.calibration.compare import mape_of

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    shown = {title: pts for title, pts in panels.items() if pts}
    n = max(len(shown), 1)
    cols = 2 if n > 1 else 1
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 5.5 * rows), squeeze=False)
    datasets = list(dict.fromkeys(d for pts in shown.values() for d, _, _ in pts))
    colours = {d: f"C{i % 10}" for i, d in enumerate(datasets)}
    values = [v for pts in shown.values() for _, m, p in pts for v in (m, p) if v > 0]
    lo, hi = (min(values) / 2, max(values) * 2) if values else (0.1, 10)
    line = np.geomspace(lo, hi, 50)
    few = np.log10(hi / lo) <= 2.5
    for axis, (title, pts) in zip(axes.flat, shown.items(), strict=False):
        for d in datasets:
            mine = [(m, p) for name, m, p in pts if name == d and m > 0 and p > 0]
            if mine:
                axis.scatter(*zip(*mine, strict=True), s=18, c=colours[d], label=d)
        axis.plot(line, line, "k-", lw=1, label="predicted = measured")
        band = f"±{PARITY_BAND:.0%}"
        axis.plot(line, line * (1 + PARITY_BAND), "k--", lw=0.7, label=band)
        axis.plot(line, line * (1 - PARITY_BAND), "k--", lw=0.7)
        error = mape_of(p / m - 1 for _, m, p in pts if m > 0)
        axis.set_title(f"{title}: MAPE {error:.1f}% ({len(pts)} points)")
        axis.set_xscale("log")
        axis.set_yscale("log")
        for ax in (axis.xaxis, axis.yaxis):
            ax.set_major_formatter(FuncFormatter(tick_label))
            # 2s and 5s too where the axes span few decades; past that they collide
            ax.set_minor_formatter(FuncFormatter(minor_tick_label if few else empty_label))
        axis.set_xlim(lo, hi)
        axis.set_ylim(lo, hi)
        axis.set_xlabel("measured (the metric's unit)")
        axis.set_ylabel("predicted")
        axis.grid(alpha=0.3, which="both")
        axis.legend(fontsize=6)
    for axis in list(axes.flat)[len(shown) :]:
        axis.set_visible(False)
    fig.suptitle("capsim validate: predicted vs measured")
    fig.tight_layout()
    save_figure(fig, path)
