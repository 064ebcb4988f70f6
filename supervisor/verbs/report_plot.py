"""The night's pictures for ``yolo-train report``: the timeline (speed and progress over wall time, rung bands,
incidents, lost time, checkpoints, ETA against the deadline) and Ultralytics' per-epoch metrics. matplotlib (Ultralytics
depends on it) with the Agg backend: no display, SVG with its text kept as text, PNG of a stated size.
"""

from __future__ import annotations

import io
import json
import math
import warnings
from datetime import datetime
from typing import Any

PNG_SIZE = (1400, 600)  # pixels of `report --png`
LABELLED = 40  # incidents up to this many are labelled on the timeline; more are drawn as thin lines alone
DPI = 100
RUNG_COLOURS = ("#f1f5fb", "#edf7ed", "#fbf5e6", "#f5eef9", "#ebf7f7", "#f7f7f7", "#fafae4", "#f9eef2")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False,
                         "axes.spines.right": False})
    return plt


def _when(t: float) -> datetime:
    return datetime.fromtimestamp(t)


def timeline(night: Any, fmt: str = "svg") -> bytes:
    """The timeline of ``night`` (report.Night) as SVG text or PNG bytes of PNG_SIZE."""
    plt = _pyplot()
    import matplotlib.dates as mdates

    samples = night.samples
    gpus = [(s["t"], json.loads(s["gpus"])) for s in samples if s.get("gpus")]
    fig, axes = plt.subplots(3 if gpus else 2, 1, sharex=True, figsize=(PNG_SIZE[0] / DPI, PNG_SIZE[1] / DPI),
                             dpi=DPI)
    speed, progress = axes[0], axes[-1]
    t0, t1 = night.span
    pixel = max(1e-3, (t1 - t0) / PNG_SIZE[0])  # seconds a pixel of the plot spans, about
    times = [(n, i["time"]) for n, i in enumerate(night.incidents, 1) if isinstance(i.get("time"), (int, float))]
    many = len(times) > LABELLED
    if gpus:
        _gpu_panel(axes[1], gpus)
    for ax in axes:
        for start, end, rung in night.rung_bands:
            ax.axvspan(_when(start), _when(end), color=RUNG_COLOURS[rung % len(RUNG_COLOURS)], zorder=0, lw=0)
        # Spans closer than a pixel are one: a month of incidents is then a few hundred shapes, not thousands.
        down = _bars(merged([(a, b) for a, b, kind in night.lost_spans if kind == "down"], pixel))
        lost = _bars(merged([(a, b) for a, b, kind in night.lost_spans if kind != "down"], pixel))
        if down:
            ax.broken_barh(down, (0, 1), transform=ax.get_xaxis_transform(), color="#d62728", alpha=0.13, zorder=1,
                           lw=0, rasterized=many)
        if lost:
            ax.broken_barh(lost, (0, 1), transform=ax.get_xaxis_transform(), facecolor="none", edgecolor="#ff7f0e",
                           hatch="///", zorder=1, lw=0, rasterized=many)
    for start, end, rung in night.rung_bands:
        speed.text(_when((start + end) / 2), 1.02, f"rung {rung}", transform=speed.get_xaxis_transform(),
                   ha="center", va="bottom", fontsize=8, color="#444")
    if samples:
        xs = [_when(s["t"]) for s in samples]
        speed.plot(xs, [s["it_s"] if s["it_s"] is not None else math.nan for s in samples], color="#1f77b4", lw=1.2)
        progress.plot(xs, [100 * s["progress"] if s["progress"] is not None else math.nan for s in samples],
                      color="#2ca02c", lw=1.4, label="progress")
    if night.eta_end is not None and samples:
        last = next((s for s in reversed(samples) if s["progress"] is not None), None)
        if last is not None:
            progress.plot([_when(last["t"]), _when(night.eta_end)], [100 * last["progress"], 100], color="#2ca02c",
                          ls="--", lw=1, label="ETA")
    if night.deadline is not None and t0 - 86400 < night.deadline < t1 + 7 * 86400:
        for ax in axes:
            ax.axvline(_when(night.deadline), color="#9467bd", ls=":", lw=1.5)
        progress.text(_when(night.deadline), 102, "deadline", color="#9467bd", ha="center", fontsize=8)
    if night.checkpoints:
        progress.plot([_when(t) for t, _ in night.checkpoints], [100 * p if p is not None else 0
                                                                for _, p in night.checkpoints],
                      "v", color="#555", ms=4, ls="none", label="checkpoint")
    for ax in axes:  # one collection an axis, drawn as a picture when there are many
        if times:
            ax.vlines([_when(t) for t in sorted({round(t / pixel) * pixel for _, t in times})], 0, 1,
                      transform=ax.get_xaxis_transform(), color="#d62728", lw=0.5 if many else 1.2, rasterized=many)
    if len(times) <= LABELLED:
        for n, when in times:
            incident = night.incidents[n - 1]
            speed.annotate(f"#{n} {incident.get('reason', '?')} in {incident.get('phase', '?')}", (_when(when), 1.0),
                           xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right", fontsize=8,
                           color="#d62728")
    speed.set_ylabel("it/s")
    progress.set_ylabel("progress %")
    progress.set_ylim(0, 105)
    speed.set_ylim(bottom=0)
    end = max(t1, night.eta_end or t1) if night.eta_end and night.eta_end - t1 < 2 * max(t1 - t0, 60) else t1
    pad = max(1.0, (end - t0) * 0.02)
    progress.set_xlim(_when(t0 - pad), _when(end + pad))
    progress.xaxis.set_major_formatter(mdates.DateFormatter(tick_format(end - t0)))
    if progress.get_legend_handles_labels()[0]:
        progress.legend(loc="upper left", fontsize=8, frameon=False)
    with warnings.catch_warnings():  # an incident's label at the very edge may not fit: drawn clipped, no matter
        warnings.simplefilter("ignore")
        fig.tight_layout()
    return _save(plt, fig, fmt)


def merged(spans: list[tuple[float, float]], gap: float) -> list[tuple[float, float]]:
    """The spans, those apart by less than ``gap`` joined into one."""
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a - out[-1][1] < gap:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _bars(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    import matplotlib.dates as mdates

    return [(mdates.date2num(_when(a)), mdates.date2num(_when(b)) - mdates.date2num(_when(a))) for a, b in spans]


def tick_format(seconds: float) -> str:
    """The time axis's labels for a span: dates once it is longer than a day (its ticks fall on midnights)."""
    if seconds > 3 * 86400:
        return "%b %d"
    if seconds > 20 * 3600:
        return "%b %d %H:%M"
    return "%H:%M" if seconds > 600 else "%H:%M:%S"


def _gpu_panel(ax, gpus: list[tuple[float, list]]) -> None:
    """Each GPU's utilisation (%) and temperature (degrees C) on one axis: both read 0 to 100 or so."""
    count = max(len(g) for _, g in gpus)
    for k in range(count):
        xs = [_when(t) for t, g in gpus if len(g) > k]
        ax.plot(xs, [100 * g[k][0] if g[k][0] is not None else math.nan for t, g in gpus if len(g) > k], lw=1,
                label=f"GPU {k} busy %")
        ax.plot(xs, [g[k][2] if g[k][2] is not None else math.nan for t, g in gpus if len(g) > k], lw=1, ls="--",
                label=f"GPU {k} \N{DEGREE SIGN}C")
    ax.set_ylabel("GPU")
    ax.legend(loc="upper left", fontsize=7, frameon=False, ncol=2 * min(count, 4))


def epochs(rows: list[dict[str, float]], fmt: str = "svg") -> bytes | None:
    """Ultralytics' results.csv as small multiples: the losses and the validation metrics per epoch."""
    if not rows:
        return None
    plt = _pyplot()
    keys = [k for k in rows[0] if k != "epoch" and not k.startswith("lr/") and k != "time"]
    if not keys:
        return None
    cols = min(5, len(keys))
    fig, axes = plt.subplots(math.ceil(len(keys) / cols), cols, figsize=(2.6 * cols, 1.9 * math.ceil(len(keys) / cols)),
                             dpi=DPI, squeeze=False)
    x = [r.get("epoch", i + 1) for i, r in enumerate(rows)]
    for ax, key in zip(axes.flat, keys):
        ax.plot(x, [r.get(key, math.nan) for r in rows], marker="o", ms=3, lw=1.2)
        ax.set_title(key, fontsize=8)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.tight_layout()
    return _save(plt, fig, fmt)


def _save(plt, fig, fmt: str) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=DPI, metadata={"Date": None} if fmt == "svg" else None)
    plt.close(fig)
    return buffer.getvalue()
