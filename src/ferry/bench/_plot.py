"""``ferry bench --plot``: the latency distribution of every configuration, as a PNG.

One panel per batch size, one horizontal box per configuration, drawn from the percentiles the
results keep (box: p25-p75, line: p50, whiskers: p1-p99, triangle: mean), so a remote run's results
plot as well as a local one's. The fastest configuration within the accuracy budget is starred and
coloured, as in the table; one outside the budget is marked ``(out of budget)``. matplotlib (the ``plot`` extra) is imported only here, and draws
with its Agg canvas without touching pyplot's global backend.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ferry.errors import BackendUnavailableError, FerryError

__all__ = ["plot_latency"]


def plot_latency(results: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Draw the latency distributions of ``results`` into the PNG file ``path`` (atomically).

    Raises:
        BackendUnavailableError: matplotlib is not installed.
        FerryError: no configuration has latency figures to draw.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise BackendUnavailableError("--plot needs matplotlib; pip install 'ferry[plot]'") from e
    from ferry.graph import atomic_path

    rows = [r for r in results["configurations"] if r.get("latency_percentiles_ms")]
    if not rows:
        raise FerryError("no configuration was timed, so there is no latency to plot")
    batches = sorted({r["batch"] for r in rows})
    per_batch = {b: [r for r in rows if r["batch"] == b] for b in batches}
    height = sum(0.45 * len(v) + 1.0 for v in per_batch.values()) + 0.6
    fig = Figure(figsize=(8.0, max(2.5, height)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(
        len(batches), 1, squeeze=False, height_ratios=[len(v) + 1 for v in per_batch.values()]
    )[:, 0]
    for ax, batch in zip(axes, batches):
        group = per_batch[batch]
        stats = []
        for r in group:
            q = r["latency_percentiles_ms"]
            stats.append(
                {
                    "label": ("* " if _best(r) else "")
                    + r["label"]
                    + (" (out of budget)" if _outside(r) else ""),
                    "med": q[50],
                    "q1": q[25],
                    "q3": q[75],
                    "whislo": q[1],
                    "whishi": q[99],
                    "mean": r["latency_ms"]["mean"],
                    "fliers": [],
                }
            )
        boxes = ax.bxp(
            stats,
            orientation="horizontal",
            showmeans=True,
            patch_artist=True,
            widths=0.6,
            medianprops={"color": "black"},
        )
        for patch, r in zip(boxes["boxes"], group):
            patch.set_facecolor("#f4a261" if _best(r) else "#a8c5e6")
        ax.invert_yaxis()  # first configuration (the baseline) on top
        ax.set_title(f"batch {batch}", fontsize=10, loc="left")
        ax.set_xlabel(
            "latency per call (ms): box p25-p75, line p50, whiskers p1-p99, triangle mean"
        )
        ax.grid(axis="x", alpha=0.3)
        lo = min(s["whislo"] for s in stats)
        hi = max(s["whishi"] for s in stats)
        if lo > 0 and hi / lo > 20:  # engines an order of magnitude apart: keep both readable
            ax.set_xscale("log")
    device = results.get("device", {})
    fig.suptitle(
        f"{results['model']['name']} on {device.get('cpu', '?')}"
        f" ({device.get('usable_cores') or device.get('cores')} cores)",
        fontsize=11,
    )
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    return Path(path)


def _best(row: dict[str, Any]) -> bool:
    """The configuration to star: the fastest within the budget (the fastest, in results that
    were not judged)."""
    if "fastest_within_budget" in row:
        return bool(row["fastest_within_budget"])
    return bool(row["fastest"])


def _outside(row: dict[str, Any]) -> bool:
    accuracy = row.get("accuracy")
    return accuracy is not None and not accuracy["passed"]
