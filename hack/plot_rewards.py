"""Draws a job's reward curve from the trainer's per-step log (metrics.jsonl) into a PNG."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt


def plot(metrics_jsonl: Path, out_png: Path, title: str) -> Path:
    rows = [json.loads(line) for line in metrics_jsonl.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"{metrics_jsonl} has no steps yet")
    steps = [r["step"] for r in rows]
    mean = [r["reward_mean"] for r in rows]
    std = [r.get("reward_std") or 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(steps, mean, label="train reward (mean)", color="tab:blue")
    ax.fill_between(
        steps, [m - s for m, s in zip(mean, std, strict=True)], [m + s for m, s in zip(mean, std, strict=True)],
        alpha=0.2, color="tab:blue", label="± std within the step",
    )  # fmt: skip
    val = [(r["step"], r["validation_mean"]) for r in rows if r.get("validation_mean") is not None]
    if val:
        ax.plot(*zip(*val, strict=True), "o-", color="tab:orange", label="validation reward (mean)")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out_png)
    return out_png


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: plot_rewards.py METRICS_JSONL OUT_PNG TITLE")
    print(plot(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]))
