"""Exit codes and the one-line failure reason the operator reads (docs/trainer.md, "Exit codes")."""

from __future__ import annotations

import sys
from enum import IntEnum
from pathlib import Path

TERMINATION_LOG = Path("/dev/termination-log")


class ExitCode(IntEnum):
    # All S steps done, or SIGTERM received and a checkpoint written: nothing to retry.
    OK = 0
    # Anything unexpected (a crash, NCCL, OOM, I/O): transient, restart from the last checkpoint.
    TRANSIENT = 1
    # trainer.json invalid, B/G/S not mappable onto the world size, dataset/model/RESUME_FROM unusable:
    # a restart fails the same way, so the operator must not retry.
    CONFIG_INVALID = 2
    # The metric service stayed unavailable past metric.errorBudget (or never became ready): transient on
    # the trainer's side, worth a restart once the metric Deployment is healthy.
    METRIC_UNAVAILABLE = 3
    # The checkpoint to resume from belongs to another job, or was written for a different model or LoRA
    # setting: resuming would load the wrong weights (or none), and a restart finds the same checkpoint.
    CHECKPOINT_MISMATCH = 4
    # A step produced a non-finite loss or gradient norm (or non-finite weights): nothing from it is
    # published; a restart resumes from the last good checkpoint and counts against backoffLimit.
    NON_FINITE = 5


class ConfigError(ValueError):
    """A configuration or input the user must change; exits with ExitCode.CONFIG_INVALID."""


class CheckpointMismatch(ValueError):
    """The checkpoint found is not this job's, or not for this model/LoRA setting; exits with
    ExitCode.CHECKPOINT_MISMATCH. The message names the mismatch and what to do."""


class NonFiniteTraining(RuntimeError):
    """A step's loss, gradient norm or weights are NaN or infinite; exits with ExitCode.NON_FINITE."""


def write_termination_message(message: str, path: Path = TERMINATION_LOG) -> None:
    """Kubernetes copies this file into the container's termination message; outside a pod the path is
    usually absent or not writable, which is fine."""
    try:
        with path.open("w", encoding="utf-8") as handle:
            handle.write(message[:4000])
    except OSError:
        pass


def fail(code: ExitCode, reason: str) -> int:
    """Report ``reason`` as one line on stderr and in the termination log; return ``code`` for sys.exit."""
    line = " ".join(reason.split())
    print(f"grpo-trainer: {code.name.lower().replace('_', '-')}: {line}", file=sys.stderr, flush=True)
    write_termination_message(line)
    return int(code)
