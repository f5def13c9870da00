"""The errors the trainer exits on and the one-line failure reason the operator reads.

The exit codes themselves are the operator's catalog (grpo_operator.api.exit_codes, rendered into
docs/trainer.md "Exit codes"): re-exported here so the trainer's modules name one ExitCode.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpo_operator.api.exit_codes import ExitCode as ExitCode

TERMINATION_LOG = Path("/dev/termination-log")


class ConfigError(ValueError):
    """A configuration or input the user must change; exits with ExitCode.CONFIG_INVALID."""


class CheckpointMismatch(ValueError):
    """The checkpoint found is not this job's, or not for this model/LoRA setting; exits with
    ExitCode.CHECKPOINT_MISMATCH. The message names the mismatch and what to do."""


class MemoryPlanExceeded(RuntimeError):
    """The memory plan at start (memory_plan.py) does not fit the GPU; exits with
    ExitCode.MEMORY_PLAN_EXCEEDED. The message gives the need, the GPU and the settings that would fit."""


class NotLearning(RuntimeError):
    """grpo.learningHealth.stopWhenUnhealthy and a diagnosis held (learning_health.py); a checkpoint of the
    last step was written. Exits with ExitCode.NOT_LEARNING; the message names the diagnosis and the fix."""


class NonFiniteTraining(RuntimeError):
    """A step's loss, gradient norm or weights are NaN or infinite; exits with ExitCode.NON_FINITE."""


# Texts CUDA out-of-memory errors carry: torch.cuda.OutOfMemoryError ("CUDA out of memory. Tried to
# allocate ..."), a raw CUDA runtime error ("CUDA error: out of memory"), and cuBLAS failing to allocate
# its workspace, which is the same condition surfacing from a library call.
_CUDA_OOM_MARKERS = ("CUDA out of memory", "CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED")


def is_cuda_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, is CUDA running out of GPU memory.

    Judged by type name and message so that this module needs no torch: torch.cuda.OutOfMemoryError
    subclasses RuntimeError, and libraries often wrap it in an error of their own.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__name__ == "OutOfMemoryError" or any(m in str(current) for m in _CUDA_OOM_MARKERS):
            return True
        current = current.__cause__ or current.__context__
    return False


def out_of_memory_reason(exc: BaseException, *, per_device_batch_size: int, lora: bool, gpus: int) -> str:
    """What ran out and what to change, for the termination message the job's status quotes."""
    first = str(exc).strip().split("\n", 1)[0]
    # torch appends allocator advice (PYTORCH_CUDA_ALLOC_CONF) after the figures; the figures suffice.
    detail = ". ".join(first.split(". ")[:3]).rstrip(".")
    tries = [
        f"a smaller spec.trainer.perDeviceBatchSize (now {per_device_batch_size})"
        if per_device_batch_size > 1
        else "shorter grpo.maxCompletionLength or grpo.maxPromptLength",
    ]
    if not lora:
        tries.append("LoRA (spec.grpo.lora.enabled: true) instead of full fine-tuning")
    tries.append(f"more trainer GPUs (now {gpus}; spec.trainer.gpusPerNode or nodes)")
    tries.append("or a smaller model")
    return (
        f"the trainer ran out of GPU memory (CUDA out of memory: {detail}); a restart needs the same memory, "
        f"so the job is not retried. Try {', '.join(tries)}."
    )


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
