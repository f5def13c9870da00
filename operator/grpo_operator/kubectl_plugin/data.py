"""What the trainer writes on the job's volume, parsed (pure functions, no I/O).

Layout (``/workspace`` is the claim's root in every pod that mounts it):

- ``output/metrics.jsonl``: one record per optimisation step (``step``, ``reward_mean``, ``reward_std``,
  ``format_failure_ratio``, ``zero_std_group_ratio``, ``validation_mean`` on validation steps, ...);
- ``output/samples.jsonl``: prompts and completions with their rewards (``split`` train or validation);
- ``checkpoints/step-<N>/`` made visible by the manifest ``checkpoints/latest.json``;
- ``output/model/``: the final model, once training has finished.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from grpo_operator.api.trainer_config import (
    DEFAULT_CHECKPOINT_DIR,
    DEFAULT_OUTPUT_DIR,
    VOLUME_MOUNT_PATH,
)

MOUNT = VOLUME_MOUNT_PATH
CHECKPOINT_DIR = DEFAULT_CHECKPOINT_DIR
OUTPUT_DIR = DEFAULT_OUTPUT_DIR
METRICS_FILE = f"{OUTPUT_DIR}/metrics.jsonl"
SAMPLES_FILE = f"{OUTPUT_DIR}/samples.jsonl"
MODEL_DIR = f"{OUTPUT_DIR}/model"
MANIFEST_FILE = f"{CHECKPOINT_DIR}/latest.json"
STEP_DIR = re.compile(r"^step-(\d+)$")


def parse_jsonl(text: str) -> list[dict[str, Any]]:
    """The complete records of a JSON-lines file; a last line still being written is skipped."""
    records: list[dict[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def complete_lines(chunk: str) -> tuple[str, int]:
    """The part of ``chunk`` that ends with a newline, and its length in bytes (for following a file
    that is being appended to: the rest is read again next time)."""
    end = chunk.rfind("\n") + 1
    head = chunk[:end]
    return head, len(head.encode("utf-8"))


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: str
    latest: bool

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "path": self.path, "latest": self.latest}


def checkpoints(entries: list[str], manifest: dict[str, Any] | None) -> list[Checkpoint]:
    """Published checkpoints (``step-N`` directories) in step order; ``latest`` marks the one the
    manifest names, which is the one a restart resumes from."""
    latest = manifest.get("step") if manifest else None
    found = []
    for entry in entries:
        match = STEP_DIR.match(entry)
        if match:
            step = int(match.group(1))
            found.append(Checkpoint(step, f"{CHECKPOINT_DIR}/{entry}", step == latest))
    return sorted(found, key=lambda c: c.step)


def series(rows: list[dict[str, Any]], key: str) -> list[float | None]:
    out: list[float | None] = []
    for row in rows:
        value = row.get(key)
        out.append(float(value) if isinstance(value, int | float) else None)
    return out


def select_samples(
    samples: list[dict[str, Any]],
    *,
    split: str,
    step: int | None,
    order: str | None,
    limit: int | None,
) -> list[dict[str, Any]]:
    """The samples a user asked for. ``step`` None means the newest step of ``split`` (or every step
    when ``order`` ranks them); ``order`` is ``best`` or ``worst`` by reward (unscored ones last)."""
    chosen = [s for s in samples if s.get("split", "train") == split]
    if step is None and order is None and chosen:
        step = max(int(s.get("step", 0)) for s in chosen)
    if step is not None:
        chosen = [s for s in chosen if s.get("step") == step]
    if order is not None:
        scored = [s for s in chosen if isinstance(s.get("reward"), int | float)]
        unscored = [s for s in chosen if not isinstance(s.get("reward"), int | float)]
        scored.sort(key=lambda s: float(s["reward"]), reverse=order == "best")
        chosen = scored + unscored
    return chosen[:limit] if limit is not None else chosen
