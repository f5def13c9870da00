"""Checkpoint ownership on the volume: attempts of one job fence each other, checkpoints of another job or
for other weights are neither resumed nor pruned. Runs publish/claim/resolve_resume on real directories
laid out as HF Trainer stages them."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from grpo_metric import MetricServer
from grpo_trainer.checkpoints import (
    GRPO_STATE_FILE,
    Manifest,
    Owner,
    claim,
    clean_staging,
    manifest_lock,
    publish,
    read_manifest,
    resolve_resume,
    write_manifest,
)
from grpo_trainer.errors import CheckpointMismatch, ConfigError

from tests.harness.ports import free_port
from tests.trainer.toy import start_trainer, trainer_config

pytestmark = pytest.mark.trainer

JOB = Owner(
    namespace="team",
    name="math",
    uid="uid-1",
    attempt=1,
    model="Qwen/Qwen2.5-1.5B-Instruct",
    revision="main",
    lora=None,
)


def stage(root: Path, step: int, owner: Owner) -> Path:
    """A checkpoint as HF Trainer leaves it in .partial, with the owner the trainer stamps into it."""
    staged = root / ".partial" / f"checkpoint-{step}"
    staged.mkdir(parents=True)
    (staged / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (staged / "model.safetensors").write_bytes(b"weights")
    (staged / GRPO_STATE_FILE).write_text(json.dumps({"step": step, "owner": owner.to_json()}))
    return staged


def save(root: Path, step: int, owner: Owner, keep_last: int = 1) -> object:
    return publish(stage(root, step, owner), root, step, keep_last, owner)


def steps_on_disk(root: Path) -> list[str]:
    return sorted((p.name for p in root.glob("step-*")), key=lambda n: int(n.split("-")[1]))


def test_manifest_records_job_attempt_and_weights(tmp_path: Path) -> None:
    save(tmp_path, 10, JOB)
    raw = json.loads((tmp_path / "latest.json").read_text())
    assert raw["step"] == 10 and raw["path"] == str(tmp_path / "step-10")
    assert raw["job"] == {"namespace": "team", "name": "math", "uid": "uid-1"}
    assert raw["attempt"] == 1
    assert raw["model"] == {"name": "Qwen/Qwen2.5-1.5B-Instruct", "revision": "main"}
    assert raw["lora"] is None


def test_sigterm_checkpoint_of_a_replaced_attempt_cannot_take_the_newer_attempts_resume_point(
    tmp_path: Path,
) -> None:
    """keepLast 1: attempt 1 is still writing its SIGTERM checkpoint (step 57) when attempt 2 starts from
    step 50. Attempt 2 claims the manifest; attempt 1's late publish must neither move it nor prune step 50."""
    save(tmp_path, 50, JOB)
    new = replace(JOB, attempt=2)
    claim(tmp_path, new)
    assert resolve_resume(str(tmp_path / "step-50"), tmp_path, new) == str(tmp_path / "step-50")

    assert save(tmp_path, 57, JOB) is None  # the late SIGTERM checkpoint of attempt 1
    manifest = read_manifest(tmp_path)
    assert manifest is not None and manifest.step == 50 and manifest.owner is not None
    assert manifest.owner.attempt == 2
    assert steps_on_disk(tmp_path) == ["step-50"]
    assert not (tmp_path / ".partial" / "checkpoint-57").exists()

    # Attempt 2 goes on publishing and pruning normally.
    assert save(tmp_path, 55, new) is not None
    assert steps_on_disk(tmp_path) == ["step-55"]


def test_resume_falls_back_to_the_manifest_when_resume_from_was_pruned(tmp_path: Path) -> None:
    """Attempt 1 published step 57 (pruning step 50) before attempt 2 could claim: attempt 2's RESUME_FROM
    is gone, and it resumes from the job's newest checkpoint instead of failing for good."""
    save(tmp_path, 50, JOB)
    save(tmp_path, 57, JOB)
    assert steps_on_disk(tmp_path) == ["step-57"]
    new = replace(JOB, attempt=2)
    assert resolve_resume(str(tmp_path / "step-50"), tmp_path, new) == str(tmp_path / "step-57")


def test_missing_resume_from_without_a_manifest_of_the_job_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"RESUME_FROM=.*step-50 is not a complete checkpoint"):
        resolve_resume(str(tmp_path / "step-50"), tmp_path, JOB)


def test_another_jobs_checkpoints_are_refused_and_never_pruned(tmp_path: Path) -> None:
    """A shared existingClaim (or a same-name job on a retained claim): the other job's manifest is not
    resumed, and its checkpoints survive this job's publishing with keepLast 1."""
    other = replace(JOB, name="math", uid="uid-OLD", attempt=3)
    save(tmp_path, 400, other)
    with pytest.raises(CheckpointMismatch) as refused:
        resolve_resume(None, tmp_path, JOB)
    message = str(refused.value)
    assert "belongs to GRPOJob team/math, uid uid-OLD" in message and "uid uid-1" in message
    assert "its own volume" in message

    # Even when this job publishes into the same directory (the other manifest gone), keepLast only counts
    # this job's checkpoints.
    (tmp_path / "latest.json").unlink()
    save(tmp_path, 10, JOB)
    save(tmp_path, 20, JOB)
    assert steps_on_disk(tmp_path) == ["step-20", "step-400"]


def test_publishing_over_another_jobs_manifest_is_refused(tmp_path: Path) -> None:
    save(tmp_path, 400, replace(JOB, uid="uid-OTHER"))
    with pytest.raises(CheckpointMismatch, match="uid-OTHER"):
        save(tmp_path, 10, JOB)
    manifest = read_manifest(tmp_path)
    assert manifest is not None and manifest.step == 400
    assert steps_on_disk(tmp_path) == ["step-400"]


@pytest.mark.parametrize(
    ("written", "resumed", "expected"),
    [
        (None, (16, ("q_proj", "v_proj")), "full weights, but this job trains .* LoRA r=16"),
        (
            (16, ("q_proj",)),
            None,
            "LoRA r=16 targetModules=\\['q_proj'\\], but this job trains .* full weights",
        ),
        ((16, ("q_proj",)), (8, ("q_proj",)), "LoRA r=16 .* LoRA r=8"),
    ],
)
def test_a_checkpoint_for_other_weights_is_refused(
    tmp_path: Path,
    written: tuple[int, tuple[str, ...]] | None,
    resumed: tuple[int, tuple[str, ...]] | None,
    expected: str,
) -> None:
    save(tmp_path, 10, replace(JOB, lora=written))
    me = replace(JOB, lora=resumed, attempt=2)
    with pytest.raises(CheckpointMismatch, match=expected):
        resolve_resume(None, tmp_path, me)
    with pytest.raises(CheckpointMismatch, match=expected):
        resolve_resume(str(tmp_path / "step-10"), tmp_path, me)


def test_another_model_is_refused(tmp_path: Path) -> None:
    save(tmp_path, 10, JOB)
    with pytest.raises(CheckpointMismatch, match=r"Qwen2\.5-1\.5B-Instruct@main.*Qwen2\.5-7B-Instruct@main"):
        resolve_resume(None, tmp_path, replace(JOB, model="Qwen/Qwen2.5-7B-Instruct"))


def test_checkpoints_written_before_owners_were_recorded_are_resumed(tmp_path: Path) -> None:
    step = tmp_path / "step-5"
    step.mkdir()
    (step / "trainer_state.json").write_text(json.dumps({"global_step": 5}))
    (tmp_path / "latest.json").write_text(
        json.dumps({"step": 5, "path": str(step), "time": "2026-01-01T00:00:00Z"})
    )
    assert resolve_resume(None, tmp_path, JOB) == str(step)
    save(tmp_path, 6, JOB)
    assert steps_on_disk(tmp_path) == ["step-6"]  # an unowned old checkpoint counts as the job's


def test_staging_of_dead_attempts_is_removed_but_not_the_replaced_attempts(tmp_path: Path) -> None:
    save(tmp_path, 10, JOB)
    staging = tmp_path / ".partial"
    for name in ("attempt-1", "attempt-2", "attempt-3", "checkpoint-7"):
        (staging / name / "checkpoint-12").mkdir(parents=True)
    clean_staging(tmp_path, replace(JOB, attempt=3))
    # attempt-2 may still be writing its SIGTERM checkpoint; attempt-1 and the pre-attempt layout are dead.
    assert sorted(p.name for p in staging.iterdir()) == ["attempt-2", "attempt-3"]

    # With another job's manifest the staging area may be that job's: nothing is touched.
    foreign = Manifest(400, str(tmp_path / "step-400"), "2026-01-01T00:00:00Z", replace(JOB, uid="uid-OTHER"))
    write_manifest(tmp_path, foreign)
    clean_staging(tmp_path, replace(JOB, attempt=9))
    assert sorted(p.name for p in staging.iterdir()) == ["attempt-2", "attempt-3"]


def test_a_claim_made_while_the_old_attempt_publishes_is_not_lost(tmp_path: Path) -> None:
    """The old attempt holds the manifest lock between its last check and its replace; a claim made in that
    window waits, then stamps the manifest the old attempt wrote, and the old attempt publishes no more."""
    save(tmp_path, 2, JOB)
    new = replace(JOB, attempt=2)
    claimer = threading.Thread(target=claim, args=(tmp_path, new))
    with manifest_lock(tmp_path):
        claimer.start()
        claimer.join(timeout=0.5)
        assert claimer.is_alive(), "the claim did not wait for the publish in progress"
        write_manifest(tmp_path, Manifest(4, str(tmp_path / "step-4"), "2026-01-01T00:00:00Z", JOB))
    claimer.join(timeout=10)
    manifest = read_manifest(tmp_path)
    assert manifest is not None and manifest.owner is not None
    assert (manifest.step, manifest.owner.attempt) == (4, 2)
    assert save(tmp_path, 6, JOB) is None  # superseded: nothing published, nothing pruned
    assert read_manifest(tmp_path) == manifest


def test_a_replaced_attempts_sigterm_checkpoint_leaves_the_new_attempt_alone(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer
) -> None:
    """Two real trainer processes of one job, keepLast 1: attempt 1 keeps checkpointing while attempt 2
    starts from its RESUME_FROM; attempt 1 gets SIGTERM only after attempt 2 has claimed the manifest, as
    when the operator deletes the old gang's pods. Attempt 1's SIGTERM checkpoint is discarded, and attempt
    2 resumes (from RESUME_FROM, or from the manifest if attempt 1 pruned it meanwhile) and finishes."""
    config = trainer_config(tmp_path, tiny_model, toy_metric.url, steps=10_000, every_steps=2, keep_last=1)
    old = start_trainer(config, tmp_path / "attempt-1.log", GRPO_TRAINER_ATTEMPT="1")
    new: subprocess.Popen[bytes] | None = None
    try:
        manifest_path = tmp_path / "ckpt" / "latest.json"
        wait_until(lambda: manifest_path.is_file(), "attempt 1's first checkpoint")
        resume_from = json.loads(manifest_path.read_text())["path"]

        new_config = tmp_path / "attempt-2.json"
        raw = json.loads(config.read_text())
        raw["metricsPort"] = free_port()  # both attempts run at once here
        new_config.write_text(json.dumps(raw))
        new = start_trainer(
            new_config, tmp_path / "attempt-2.log", GRPO_TRAINER_ATTEMPT="2", RESUME_FROM=resume_from
        )
        wait_until(
            lambda: json.loads(manifest_path.read_text()).get("attempt") == 2,
            "attempt 2's claim",
            alive={
                "attempt 1": (old, tmp_path / "attempt-1.log"),
                "attempt 2": (new, tmp_path / "attempt-2.log"),
            },
        )
        claimed_step = json.loads(manifest_path.read_text())["step"]
        old.send_signal(signal.SIGTERM)
        assert old.wait(timeout=300) == 0
        old_log = (tmp_path / "attempt-1.log").read_text()
        assert "was replaced by attempt 2" in old_log, old_log[-3000:]
        assert json.loads(manifest_path.read_text())["attempt"] == 2  # attempt 1 never took it back

        # Attempt 2 trains on, publishes and prunes as usual, then stops on its own SIGTERM.
        wait_until(
            lambda: json.loads(manifest_path.read_text())["step"] > claimed_step,
            "attempt 2's checkpoint",
            alive={"attempt 2": (new, tmp_path / "attempt-2.log")},
        )
        new.send_signal(signal.SIGTERM)
        assert new.wait(timeout=300) == 0, (tmp_path / "attempt-2.log").read_text()[-3000:]
        final = read_manifest(tmp_path / "ckpt")
        assert final is not None and final.owner is not None and final.owner.attempt == 2
        assert final.step > claimed_step
        assert steps_on_disk(tmp_path / "ckpt") == [f"step-{final.step}"]
    finally:
        for process in (old, new):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


def wait_until(
    predicate: Callable[[], bool],
    what: str,
    timeout: float = 300,
    alive: dict[str, tuple[subprocess.Popen[bytes], Path]] | None = None,
) -> None:
    """Poll ``predicate``; fail at once, with its log, when a trainer in ``alive`` exits meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, (process, log) in (alive or {}).items():
            if process.poll() is not None:
                raise AssertionError(
                    f"{name} exited {process.returncode} while waiting for {what}:\n{log.read_text()[-3000:]}"
                )
        try:
            if predicate():
                return
        except (OSError, ValueError):  # the manifest is replaced atomically, but may not exist yet
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
