"""The demo job's metric (examples/tiny/metric.py), 0.15 s per completion: with the metric SDK's 4 scoring
threads a step of the tiny job takes over a second whatever the model writes, so each step outlasts the
trainer's status report and the operator's reaction to it (tests/integration/test_budget.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "tiny"))

from grpo_metric import serve
from metric import target_fraction  # type: ignore[import-not-found]


def slow_target_fraction(example: dict[str, Any], completion: str) -> float:
    time.sleep(0.15)
    return float(target_fraction(example, completion))


if __name__ == "__main__":
    serve(slow_target_fraction)
