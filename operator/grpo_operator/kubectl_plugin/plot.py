"""A job's curves as a PNG: train reward (mean, ± std band) and validation reward per step, and beside them
KL, entropy, completion length, truncation and format failures where the steps have them.

Used by ``kubectl grpo rewards --plot`` and by hack/plot_rewards.py (the demo). Needs matplotlib, which
the operator itself does not: it is imported here only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from grpo_operator.kubectl_plugin.data import as_float, step_of

# The panels beside the reward's, each drawn when some step has its metrics.jsonl field.
PANELS = (
    ("kl", "KL to the reference"),
    ("entropy", "entropy"),
    ("completion_length", "completion length (tokens)"),
    ("truncated_ratio", "truncated (share)"),
    ("format_failure_ratio", "format failures (share)"),
)


def plot_rows(rows: list[dict[str, Any]], out_png: Path, title: str) -> Path:
    """Draws ``rows`` (records of metrics.jsonl) into ``out_png``: train reward ± std and validation in the
    first panel, then one panel per field of PANELS that some step has."""
    # The trainer image writes metrics.jsonl: a record without a numeric step and reward is not drawn.
    rows = [r for r in rows if step_of(r) is not None and as_float(r.get("reward_mean")) is not None]
    if not rows:
        raise ValueError("no steps to plot yet")
    panels = [
        (key, label, [(step_of(r) or 0, v) for r in rows if (v := as_float(r.get(key))) is not None])
        for key, label in PANELS
    ]
    panels = [p for p in panels if p[2]]
    count = 1 + len(panels)
    cols = 1 if count == 1 else 2 if count <= 4 else 3
    grid = -(-count // cols)
    fig, axes = plt.subplots(grid, cols, figsize=(5.5 * cols, 3.6 * grid), dpi=110, squeeze=False)
    flat = list(axes.flat)
    ax = flat[0]
    steps = [step_of(r) or 0 for r in rows]
    mean = [as_float(r["reward_mean"]) or 0.0 for r in rows]
    std = [as_float(r.get("reward_std")) or 0.0 for r in rows]
    ax.plot(steps, mean, label="train reward (mean)", color="tab:blue")
    ax.fill_between(
        steps, [m - s for m, s in zip(mean, std, strict=True)], [m + s for m, s in zip(mean, std, strict=True)],
        alpha=0.2, color="tab:blue", label="± std within the step",
    )  # fmt: skip
    val = [(step_of(r), as_float(r.get("validation_mean"))) for r in rows]
    val = [(x, y) for x, y in val if y is not None]
    if val:
        ax.plot(*zip(*val, strict=True), "o-", color="tab:orange", label="validation reward (mean)")
    ax.set_ylabel("reward")
    ax.set_title("reward")
    ax.legend(loc="lower right")
    for axis, (_key, label, points) in zip(flat[1:], panels, strict=False):
        axis.plot(*zip(*points, strict=True), color="tab:green")
        axis.set_title(label)
    for axis in flat[:count]:
        axis.set_xlabel("step")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no 2.5 on the axis
        axis.grid(alpha=0.3)
    for axis in flat[count:]:
        axis.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return out_png


def plot(metrics_jsonl: Path, out_png: Path, title: str) -> Path:
    rows = [json.loads(line) for line in metrics_jsonl.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"{metrics_jsonl} has no steps yet")
    return plot_rows(rows, out_png, title)


def plot_curves(series: dict[str, list[tuple[int, float]]], out_png: Path, title: str) -> Path:
    """Several jobs' train reward per step, overlaid (``kubectl grpo compare --plot``)."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for name, points in series.items():
        if points:
            ax.plot(*zip(*points, strict=True), label=name)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("train reward (mean)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return out_png
