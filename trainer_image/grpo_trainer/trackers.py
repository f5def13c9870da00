"""The trackers rank 0 reports to (spec.tracking), opened together and called together, each one unable to
stop or slow the training for long: see Trackers."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpo_operator.api.tracking import TENSORBOARD_SUBDIR

from grpo_trainer.tracking import TensorBoardTracker, Tracker, TrackingPlan
from grpo_trainer.tracking_remote import MlflowTracker, WandbTracker

log = logging.getLogger("grpo_trainer.tracking")

# Failed calls in a row after which a tracker is given up for the rest of the attempt: a tracking server
# that is down must cost the training a few log lines, not a timeout every step.
MAX_FAILURES_IN_A_ROW = 3


class Trackers:
    """The enabled trackers, each call made on each of them in turn. A tracker that fails is logged and, after
    MAX_FAILURES_IN_A_ROW failures in a row, dropped: metrics.jsonl, Prometheus and the job's status hold
    every step whatever a tracker does, and training never waits on or dies of one."""

    def __init__(self, trackers: Sequence[Tracker]) -> None:
        self.active = list(trackers)
        self._failures = {id(t): 0 for t in trackers}

    def _each(self, what: str, call: Callable[[Tracker], None]) -> None:
        for tracker in list(self.active):
            try:
                call(tracker)
            except Exception as exc:
                failures = self._failures[id(tracker)] = self._failures[id(tracker)] + 1
                if failures >= MAX_FAILURES_IN_A_ROW:
                    self.active.remove(tracker)
                    log.error(
                        "%s: %s failed %d times in a row (last: %s: %s); no more reports to %s in this attempt. "
                        "metrics.jsonl, Prometheus and the job's status still hold every step; check the "
                        "tracker's address and credentials in spec.tracking",
                        tracker.name, what, failures, type(exc).__name__, exc, tracker.name,
                    )  # fmt: skip
                else:
                    log.warning("%s: %s failed: %s: %s", tracker.name, what, type(exc).__name__, exc)
            else:
                self._failures[id(tracker)] = 0

    def configuration(self, trainer_json: str, trl_arguments: str, step: int) -> None:
        self._each(
            "recording the configuration", lambda t: t.configuration(trainer_json, trl_arguments, step)
        )

    def step(self, step: int, record: Mapping[str, Any], samples: Sequence[Mapping[str, Any]]) -> None:
        self._each(f"reporting step {step}", lambda t: t.step(step, record, samples))

    def validation(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        self._each(f"reporting step {step}'s validation", lambda t: t.validation(step, samples))

    def close(self) -> None:
        self._each("closing", lambda t: t.close())
        self.active = []


def open_trackers(plan: TrackingPlan, resumed_step: int) -> Trackers:
    """The trackers spec.tracking enables, opened at the step the attempt resumes from. One that cannot be
    opened (server unreachable, bad credentials) is logged and left out; the others still report."""
    opened: list[Tracker] = []
    openers: list[tuple[str, Callable[[], Tracker]]] = []
    if plan.spec.tensorboard_enabled():
        openers.append(
            ("TensorBoard", lambda: TensorBoardTracker(plan.output_dir / TENSORBOARD_SUBDIR, resumed_step))
        )
    if (mlflow := plan.spec.mlflow_enabled()) is not None:
        openers.append(("MLflow", lambda: MlflowTracker(mlflow, plan, resumed_step)))
    if (wandb := plan.spec.wandb_enabled()) is not None:
        openers.append(("W&B", lambda: WandbTracker(wandb, plan, resumed_step)))
    for name, opener in openers:
        try:
            opened.append(opener())
        except Exception as exc:
            log.error(
                "%s: could not be opened (%s: %s); this attempt reports to it nothing. metrics.jsonl, Prometheus "
                "and the job's status still hold every step; check spec.tracking's address and credentials",
                name, type(exc).__name__, exc,
            )  # fmt: skip
    return Trackers(opened)
