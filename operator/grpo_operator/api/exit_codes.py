"""The trainer's exit codes: the one catalog the trainer exits with, the operator's restart policy
(reconcile/restart_policy.py) decides from, the operator setting ``permanent_exit_codes`` defaults to,
and ``make generate`` renders into docs/trainer.md ("Exit codes").

Kubernetes hands the operator nothing but the number and the termination message, so the number is
the whole contract between the two images: it lives here, in ``api``, which both import.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    TRANSIENT = 1
    CONFIG_INVALID = 2
    METRIC_UNAVAILABLE = 3
    CHECKPOINT_MISMATCH = 4
    NON_FINITE = 5
    OUT_OF_MEMORY = 6
    CANCELLED = 7
    MEMORY_PLAN_EXCEEDED = 8
    NOT_LEARNING = 9


@dataclass(frozen=True)
class ExitCodeEntry:
    """One exit code: when the trainer exits with it, and whether retrying can help."""

    code: ExitCode
    # When the trainer exits with the code, in the words of docs/trainer.md's table.
    meaning: str
    # A restart would fail the same way, so the operator fails the job at once by default (the setting
    # GRPO_OPERATOR_PERMANENT_EXIT_CODES can change that per installation).
    permanent: bool


EXIT_CODES: tuple[ExitCodeEntry, ...] = (
    ExitCodeEntry(
        ExitCode.OK,
        "all S steps done (final model in `<outputDir>/model`), or SIGTERM received and a checkpoint written",
        permanent=False,
    ),
    ExitCodeEntry(
        ExitCode.TRANSIENT,
        "unexpected failure (crash, NCCL, I/O); client rollouts: the rollout gateway unreachable past its "
        "timeout, or answering groups that cannot be trained on",
        permanent=False,
    ),
    ExitCodeEntry(
        ExitCode.CONFIG_INVALID,
        "configuration invalid: trainer.json, B·G not divisible over the world size, "
        "dataset/model/`RESUME_FROM` unusable",
        permanent=True,
    ),
    ExitCodeEntry(
        ExitCode.METRIC_UNAVAILABLE,
        "metric service (or, for `spec.environment` jobs, environment service) never ready, or failures "
        "beyond `metric.errorBudget` (`environment.errorBudget`): worth a restart once that Deployment is "
        "healthy",
        permanent=False,
    ),
    ExitCodeEntry(
        ExitCode.CHECKPOINT_MISMATCH,
        "checkpoint mismatch: the checkpoint to resume belongs to another GRPOJob, or holds another model "
        "or LoRA setting",
        permanent=True,
    ),
    ExitCodeEntry(
        ExitCode.NON_FINITE,
        "non-finite training: a step's loss or gradient norm, or the weights about to be checkpointed, are "
        "NaN or infinite; nothing of that step is published",
        permanent=False,
    ),
    ExitCodeEntry(
        ExitCode.OUT_OF_MEMORY,
        'CUDA out of memory (`torch.cuda.OutOfMemoryError`, "CUDA error: out of memory", cuBLAS failing to '
        "allocate), also when wrapped in another error; the message quotes the allocation that failed and "
        "lists what lowers the need: a smaller `trainer.perDeviceBatchSize` (or shorter "
        "prompts/completions when it is already 1), LoRA, more trainer GPUs, a smaller model. The same "
        "model and batch need the same memory after a restart",
        permanent=True,
    ),
    ExitCodeEntry(
        ExitCode.CANCELLED,
        "client rollouts: the client cancelled the run (Arbor's `cancel`); nothing more is trained or saved",
        permanent=True,
    ),
    ExitCodeEntry(
        ExitCode.MEMORY_PLAN_EXCEEDED,
        "the memory plan at start does not fit the GPU: weights, gradients, optimizer state and activations "
        "planned from the model's config.json and the job's settings exceed the GPU's memory less 10 % "
        "headroom; nothing was loaded. The message gives the need per GPU and the settings that would fit "
        "(FSDP over N GPUs, optimizer CPU offload, LoRA, a batch of one), each with its need",
        permanent=True,
    ),
    ExitCodeEntry(
        ExitCode.NOT_LEARNING,
        "not learning, stopped as asked: `grpo.learningHealth.stopWhenUnhealthy` is true and a learning-health "
        "diagnosis other than Healthy or Solved held for `windowSteps` steps in a row; a checkpoint of the "
        "last step was written. The message names the diagnosis and the setting to change",
        permanent=True,
    ),
)

BY_CODE: dict[ExitCode, ExitCodeEntry] = {entry.code: entry for entry in EXIT_CODES}
# The default of the operator setting permanent_exit_codes.
PERMANENT_EXIT_CODES: tuple[int, ...] = tuple(int(e.code) for e in EXIT_CODES if e.permanent)
