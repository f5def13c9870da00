"""A gang preempted by Kueue: the old attempt publishes its SIGTERM checkpoint while the new attempt's
pods wait at Kueue's gate, so the new attempt must resume from that checkpoint. The operator gives such
an attempt the checkpoint root as RESUME_FROM (reconcile: Kueue restarts); this pins what the trainer
makes of it, on real directories (keepLast 3, so the older checkpoint is still on disk)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from grpo_trainer.checkpoints import claim, resolve_resume

from tests.trainer.test_checkpoint_fencing import JOB, save, steps_on_disk

pytestmark = pytest.mark.trainer


def test_the_checkpoint_root_resumes_from_the_preempted_attempts_sigterm_checkpoint(tmp_path: Path) -> None:
    save(tmp_path, 50, JOB, keep_last=3)  # the checkpoint in the job's status when Kueue evicted it
    assert save(tmp_path, 57, JOB, keep_last=3) is not None  # SIGTERM checkpoint, before re-admission
    assert steps_on_disk(tmp_path) == ["step-50", "step-57"]
    new = replace(JOB, attempt=2)
    claim(tmp_path, new)  # the new attempt starts only once Kueue admits it again
    assert resolve_resume(str(tmp_path), tmp_path, new) == str(tmp_path / "step-57")
    # The step directory known at eviction time would lose the 7 steps trained since.
    assert resolve_resume(str(tmp_path / "step-50"), tmp_path, new) == str(tmp_path / "step-50")
