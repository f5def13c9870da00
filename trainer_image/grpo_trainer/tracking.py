"""Experiment trackers (spec.tracking), written by rank 0: TensorBoard event files on the job's volume, and
MLflow and W&B (tracking_remote.py) behind the same four calls (the Tracker protocol), all driven by
trackers.py.

What a step reports is what metrics.jsonl holds (the metric's rewards, tied groups, TRL's loss, KL, entropy,
clip ratios, learning rate, timings, the update check), so the two never disagree: every number of the step's
record becomes a scalar under ``grpo/``, the learning-health diagnosis a text, the step's sample completions a
Markdown table. The resolved configuration (trainer.json with the preset's knobs filled in, and TRL's own
arguments) is written once per attempt as text. A resumed attempt purges the steps after its checkpoint, which
it is about to redo, as it truncates metrics.jsonl.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from grpo_operator.api.tracking import TrackingSpec

log = logging.getLogger("grpo_trainer.tracking")

# Characters of one prompt or completion in the samples table: enough to read, small enough for the UI.
SAMPLE_TEXT_LIMIT = 400


def _cell(value: Any) -> str:
    """A Markdown table cell: the table's own syntax and line breaks escaped."""
    text = str(value)
    if len(text) > SAMPLE_TEXT_LIMIT:
        text = text[:SAMPLE_TEXT_LIMIT] + "…"
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", "⏎")


def samples_table(samples: Sequence[Mapping[str, Any]]) -> str:
    rows = ["| prompt | completion | reward | advantage | format failure |", "|---|---|---|---|---|"]
    for sample in samples:
        rows.append(
            "| "
            + " | ".join(
                _cell(sample.get(key, ""))
                for key in ("prompt", "completion", "reward", "advantage", "formatFailure")
            )
            + " |"
        )
    return "\n".join(rows)


def numbers(record: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Every finite number of a metrics.jsonl record (nested dicts flattened with '/'), the step excluded."""
    found: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            found.update(numbers(value, f"{name}/"))
        elif isinstance(value, bool) or (
            isinstance(value, int | float) and math.isfinite(value) and name != "step"
        ):
            found[name] = float(value)
    return found


class Tracker(Protocol):
    name: str

    def configuration(self, trainer_json: str, trl_arguments: str, step: int) -> None: ...

    def step(self, step: int, record: Mapping[str, Any], samples: Sequence[Mapping[str, Any]]) -> None: ...

    def validation(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class TrackingPlan:
    """What rank 0 opens its trackers with: the resolved spec.tracking, the job, the volume's output
    directory and the resolved trainer.json."""

    spec: TrackingSpec
    namespace: str
    name: str
    uid: str
    output_dir: Path
    configuration: str


class TensorBoardTracker:
    """Rank 0's SummaryWriter on <outputDir>/tensorboard."""

    name = "TensorBoard"

    def __init__(self, log_dir: Path, resumed_step: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        log_dir.mkdir(parents=True, exist_ok=True)
        # purge_step: events of the steps this attempt redoes are dropped when it writes them again.
        self.writer = SummaryWriter(
            log_dir=str(log_dir), purge_step=resumed_step + 1 if resumed_step else None
        )
        self.log_dir = log_dir
        log.info("TensorBoard: writing event files to %s", log_dir)

    def configuration(self, trainer_json: str, trl_arguments: str, step: int) -> None:
        self.writer.add_text("config/trainer.json", _code(trainer_json), step)
        self.writer.add_text("config/trl_arguments", _code(trl_arguments), step)
        self.writer.flush()

    def step(self, step: int, record: Mapping[str, Any], samples: Sequence[Mapping[str, Any]]) -> None:
        for name, value in numbers(record).items():
            self.writer.add_scalar(f"grpo/{name}", value, step)
        health = record.get("learning_health")
        if isinstance(health, str):
            self.writer.add_text("grpo/learning_health", health, step)
        if samples:
            self.writer.add_text("samples/train", samples_table(samples), step)
        self.writer.flush()

    def validation(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        if samples:
            self.writer.add_text("samples/validation", samples_table(samples), step)
            self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _code(text: str) -> str:
    """Text shown as written (TensorBoard renders text summaries as Markdown): indented as a code block."""
    return "\n".join("    " + line for line in text.splitlines())
