"""A job's reward curve as a PNG: train reward (mean, ± std band) and validation reward per step.

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


def plot_rows(rows: list[dict[str, Any]], out_png: Path, title: str) -> Path:
    """Draws ``rows`` (records of metrics.jsonl) into ``out_png``."""
    # The trainer image writes metrics.jsonl: a record without a numeric step and reward is not drawn.
    rows = [r for r in rows if step_of(r) is not None and as_float(r.get("reward_mean")) is not None]
    if not rows:
        raise ValueError("no steps to plot yet")
    steps = [step_of(r) or 0 for r in rows]
    mean = [as_float(r["reward_mean"]) or 0.0 for r in rows]
    std = [as_float(r.get("reward_std")) or 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(steps, mean, label="train reward (mean)", color="tab:blue")
    ax.fill_between(
        steps, [m - s for m, s in zip(mean, std, strict=True)], [m + s for m, s in zip(mean, std, strict=True)],
        alpha=0.2, color="tab:blue", label="± std within the step",
    )  # fmt: skip
    val = [(step_of(r), as_float(r.get("validation_mean"))) for r in rows]
    val = [(x, y) for x, y in val if y is not None]
    if val:
        ax.plot(*zip(*val, strict=True), "o-", color="tab:orange", label="validation reward (mean)")
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no 2.5 on the axis
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
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
