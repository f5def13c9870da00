"""Draws a job's reward curve from the trainer's per-step log (metrics.jsonl) into a PNG.

The drawing lives in the package (grpo_operator.kubectl_plugin.plot), shared with `kubectl grpo rewards
--plot`; this is its command line for a metrics.jsonl at hand.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpo_operator.kubectl_plugin.plot import plot

if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: plot_rewards.py METRICS_JSONL OUT_PNG TITLE")
    print(plot(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]))
