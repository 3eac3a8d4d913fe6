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


PLOT_PANELS = {
    "output_tok_s": "throughput (tok/s)",
    "total_tok_s": "throughput (tok/s)",
    "per_request_output_tok_s": "throughput (tok/s)",
    "request_throughput_rps": "requests per second",
    "tpot_s": "TPOT and ITL (s)",
    "itl_s": "TPOT and ITL (s)",
    "decode_tok_s": "decode rate (tok/s)",
    "ttft_s": "TTFT (s)",
    "prompt_tok_s": "prompt rate (tok/s)",
    "e2e_s": "end-to-end latency (s)",
}
"""The panel (and its unit) of each published metric in the uncalibrated parity plot: one
quantity and one unit a panel."""


def metric_panels(points) -> dict[str, list[tuple[str, float, float, bool]]]:
    """validate's compared points as parity panels: a panel per quantity (PLOT_PANELS),
    each point as (accelerator, measured, predicted, counted in the summaries)."""
    panels: dict[str, list[tuple[str, float, float, bool]]] = {}
    for title in dict.fromkeys(PLOT_PANELS.values()):
        panels[title] = []
    for p in points:
        title = PLOT_PANELS.get(p.metric, p.metric)
        panels.setdefault(title, []).append((p.gpu, p.measured, p.predicted, p.scored))
    return {title: pts for title, pts in panels.items() if pts}


def plot_parity(panels: dict[str, list[tuple]], path: Path, heading: str = "") -> None:
    """Parity plot: predicted against measured on log axes, one panel per quantity
    (title -> (label, measured, predicted[, counted]) points), one colour per label, the
    points left out of the summaries hollow, with the line of perfect prediction and a band
    of +-PARITY_BAND around it. Each panel's title gives its median absolute and signed
    errors; one legend, outside the panels, names the labels."""
    import numpy as np

    from capsim.cli.common import file_matplotlib

    file_matplotlib()
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    shown = {title: [(*pt, True)[:4] for pt in pts] for title, pts in panels.items() if pts}
    n = max(len(shown), 1)
    cols = min(n, 3)
    rows = -(-n // cols)
    # the legend takes an empty panel's place, or a margin on the right when none is empty
    margin = 0.0 if n < rows * cols else 2.6
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols + margin, 4.4 * rows), squeeze=False)
    labels = sorted(dict.fromkeys(label for pts in shown.values() for label, *_ in pts))
    colours = {label: plt.get_cmap("tab20")(i % 20) for i, label in enumerate(labels)}
    for axis, (title, pts) in zip(axes.flat, shown.items(), strict=False):
        values = [v for _, m, p, _ in pts for v in (m, p) if v > 0]
        lo, hi = (min(values) / 1.5, max(values) * 1.5) if values else (0.1, 10)
        line = np.geomspace(lo, hi, 50)
        for label in labels:
            for counted in (True, False):
                mine = [
                    (m, p) for name, m, p, c in pts if name == label and c is counted and m > 0 < p
                ]
                if mine:
                    face = colours[label] if counted else "none"
                    axis.scatter(
                        *zip(*mine, strict=True), s=16, facecolors=face, edgecolors=colours[label]
                    )
        axis.plot(line, line, "k-", lw=1)
        axis.plot(line, line * (1 + PARITY_BAND), "k--", lw=0.7)
        axis.plot(line, line * (1 - PARITY_BAND), "k--", lw=0.7)
        errors = np.array([p / m - 1 for _, m, p, _ in pts if m > 0 and np.isfinite(p / m)])
        if errors.size:
            axis.set_title(
                f"{title}\n{len(pts)} points: median |error| "
                f"{100 * np.median(np.abs(errors)):.0f}%, signed {100 * np.median(errors):+.0f}%",
                fontsize=9,
            )
        axis.set_xscale("log")
        axis.set_yscale("log")
        few = np.log10(hi / lo) <= 2.5
        for ax in (axis.xaxis, axis.yaxis):
            ax.set_major_formatter(FuncFormatter(tick_label))
            # 2s and 5s too where the axes span few decades; past that they collide
            ax.set_minor_formatter(FuncFormatter(minor_tick_label if few else empty_label))
            ax.set_tick_params(labelsize=7, which="both")
        axis.set_xlim(lo, hi)
        axis.set_ylim(lo, hi)
        axis.set_xlabel("measured", fontsize=8)
        axis.set_ylabel("predicted", fontsize=8)
        axis.grid(alpha=0.3, which="both")
    for axis in list(axes.flat)[len(shown) :]:
        axis.set_visible(False)
    handles = [
        Line2D([], [], ls="", marker="o", color=colours[label], label=label) for label in labels
    ]
    handles += [
        Line2D([], [], ls="", marker="o", mfc="none", color="grey", label="reference only"),
        Line2D([], [], color="k", lw=1, label="predicted = measured"),
        Line2D([], [], color="k", lw=0.7, ls="--", label=f"±{PARITY_BAND:.0%}"),
    ]
    fig.suptitle(f"capsim validate: predicted vs measured{heading}")
    fig.tight_layout(rect=(0, 0, 1 - margin / (4.6 * cols + margin), 1))
    where = "lower right" if margin == 0.0 else "center right"
    fig.legend(handles=handles, loc=where, fontsize=8, frameon=False, ncols=2 if not margin else 1)
    save_figure(fig, path)
