"""What the operator remembers of a job between reconciles is one record (runtime/job_memory.py): its own
write's echo is ignored, and a job that is deleted, or gone at a resync, leaves nothing behind."""

from __future__ import annotations

import asyncio
from typing import Any

from grpo_operator.reconcile import Refusal
from grpo_operator.runtime.controller import Controller
from grpo_operator.settings import OperatorSettings


class NoKube:
    def count_requests(self, hook: Any) -> None:
        pass


def test_the_echo_of_the_operators_own_write_wakes_nobody_and_a_deleted_job_is_forgotten_whole() -> None:
    async def run() -> None:
        controller = Controller(OperatorSettings(), NoKube())  # type: ignore[arg-type]
        key = ("team-a", "math")
        memory = controller.jobs.know(key)
        memory.written_rv, memory.phase = "41", "Running"
        memory.refusals = (Refusal(kind="Pod", name="math-trainer-1-0", code=403, message="exceeded quota"),)
        memory.verified[("ConfigMap", "math-config")] = "40"
        controller.job_event("MODIFIED", *key, "41")  # our own status patch, seen again through the watch
        assert len(controller.queue) == 0
        controller.job_event("MODIFIED", *key, "42")  # someone else's change
        assert len(controller.queue) == 1
        assert controller.jobs.phases() == {key: "Running"}
        controller.job_event("DELETED", *key, "43")
        assert controller.jobs.get(key) is None and controller.jobs.phases() == {}
        await controller.stop()

    asyncio.run(run())
