"""The evaluation report's plots, drawn from training histories as PNG bytes.

A history is the trainer's `train_history.json` (contracts.artifacts.TRAIN_HISTORY), read as it
is: `points` with `tokens`, `loss`, `tokens_per_s` and, on GPU, maybe `mfu`; `eval_points` with
`tokens` and `val_loss`. Figures are drawn with matplotlib's Agg renderer on a `Figure` of their
own (never pyplot's global state), so this works in a pod without a display.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, PercentFormatter

History = Mapping[str, Any]  # one model's train_history.json
SIZE_IN = (8.0, 3.4)  # every figure's width and height, in inches
DPI = 100
SHORT_SERIES = 30  # points: a series shorter than this is drawn with a dot on each
# One colour per model: the candidate stands out, the baseline recedes.
COLORS = {"candidate": "#1f6feb", "baseline": "#8c8c8c"}


def series(points: Sequence[Mapping[str, Any]], x: str, y: str) -> tuple[list[float], list[float]]:
    """The (x, y) pairs of the points that hold both as numbers; a non-finite y is kept as NaN."""
    xs: list[float] = []
    ys: list[float] = []
    for point in points:
        px, py = point.get(x), point.get(y)
        if is_number(px) and is_number(py) and math.isfinite(px):
            xs.append(float(px))
            ys.append(float(py))
    return xs, ys


def loss_curves(histories: Mapping[str, History | None]) -> bytes | None:
    """Train and eval loss against tokens seen, one colour per model; None if nothing to draw."""
    fig, ax = _figure("Loss against tokens seen", "loss (nats/token)")
    drawn = False
    for name, history in histories.items():
        if not history:
            continue
        color = COLORS.get(name, "#444444")
        xs, ys = series(history.get("points", []), "tokens", "loss")
        if xs:
            ax.plot(xs, ys, color=color, linewidth=1.4, marker=_marker(xs), label=f"{name} train")
            drawn = True
        xs, ys = series(history.get("eval_points", []), "tokens", "val_loss")
        if xs:
            ax.plot(xs, ys, color=color, linestyle="--", marker="o", label=f"{name} eval")
            drawn = True
    return _png(fig, ax) if drawn else None


def throughput(histories: Mapping[str, History | None]) -> bytes | None:
    """Tokens/s against tokens seen, and MFU on a second axis where recorded; None if no data."""
    fig, ax = _figure("Training throughput", "tokens/s")
    mfu_ax = None
    drawn = False
    for name, history in histories.items():
        if not history:
            continue
        color = COLORS.get(name, "#444444")
        points = history.get("points", [])
        xs, ys = series(points, "tokens", "tokens_per_s")
        if xs:
            ax.plot(
                xs, ys, color=color, linewidth=1.4, marker=_marker(xs), label=f"{name} tokens/s"
            )
            drawn = True
        xs, ys = series(points, "tokens", "mfu")
        if xs:
            mfu_ax = mfu_ax or ax.twinx()
            mfu_ax.plot(xs, ys, color=color, linestyle=":", label=f"{name} MFU")
            mfu_ax.set_ylabel("MFU")
            mfu_ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    if mfu_ax is not None:
        handles, labels = ax.get_legend_handles_labels()
        more, more_labels = mfu_ax.get_legend_handles_labels()
        ax.legend(handles + more, labels + more_labels, fontsize="small", loc="best")
    return _png(fig, ax, legend=mfu_ax is None) if drawn else None


def _marker(xs: Sequence[float]) -> str | None:
    """Dots on a short series, so that even one point shows; none on a long one."""
    return "." if len(xs) < SHORT_SERIES else None


def _figure(title: str, ylabel: str) -> tuple[Figure, Any]:
    fig = Figure(figsize=SIZE_IN, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel("tokens seen")
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_formatter(EngFormatter())
    ax.yaxis.set_major_formatter(EngFormatter())
    ax.grid(True, alpha=0.3)
    return fig, ax


def _png(fig: Figure, ax: Any, legend: bool = True) -> bytes:
    if legend:
        ax.legend(fontsize="small", loc="best")
    out = io.BytesIO()
    # No timestamp or software tag: the same history draws the same bytes.
    fig.savefig(out, format="png", metadata={"Software": None})
    return out.getvalue()


def is_number(value: object) -> TypeGuard[float]:
    """True for an int or float (NaN included), False for a bool, None or text."""
    return isinstance(value, int | float) and not isinstance(value, bool)
