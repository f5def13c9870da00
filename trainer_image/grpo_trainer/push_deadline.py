"""A deadline on the NCCL weight push (spec.generation.weightSync NCCL, TRL's own transport).

TRL's NCCL push has no timeout: rank 0 posts ``/update_weights`` and broadcasts each tensor over vLLM's
PyNccl communicator, and a server lost mid-push leaves that broadcast waiting for a peer that will never
answer, for ever. The trainer cannot cancel an NCCL collective from Python, so a push that overruns its
deadline ends the process: one line naming the server and the deadline, the termination message, exit
TRANSIENT. The operator restarts the gang from the newest checkpoint (the restart policy's NCCL row),
which re-forms the group with the replacement server. Broadcast and Volume have their own bounds (the
group's timeout; the HTTP request's).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from grpo_trainer.errors import ExitCode, fail

T = TypeVar("T")


def with_deadline(
    push: Callable[..., T],
    seconds: float,
    server: str,
    exit_process: Callable[[int], Any] = os._exit,
) -> Callable[..., T]:
    """``push`` that ends the process (``exit_process``, os._exit: no cleanup can run while a collective
    holds the GIL-free NCCL thread) when one call takes longer than ``seconds``."""

    def guarded(*args: Any, **kwargs: Any) -> T:
        def expire() -> None:
            code = fail(
                ExitCode.TRANSIENT,
                f"the NCCL weight push to the vLLM server at {server} did not finish within {seconds:g}s "
                "(trainer.json generation.requestTimeoutSeconds): a server lost mid-push leaves NCCL's broadcast "
                "waiting for ever, so the trainer exits and the operator restarts the gang from the newest "
                "checkpoint",
            )
            exit_process(code)

        timer = threading.Timer(seconds, expire)
        timer.daemon = True
        timer.start()
        try:
            return push(*args, **kwargs)
        finally:
            timer.cancel()

    return guarded
