"""Checkpoints on the job's volume: ``<dir>/step-<N>/`` directories made visible only by an atomic
manifest ``<dir>/latest.json``.

HF Trainer writes a checkpoint (model, optimizer, scheduler, RNG, trainer_state with the data position)
into ``<dir>/.partial/attempt-<A>/checkpoint-N``; :func:`publish` then renames it to ``step-N`` (same filesystem, so
atomic), moves the manifest with write-tmp + fsync + os.replace, and only then deletes old checkpoints.
A crash at any point leaves latest.json naming a complete checkpoint.

Every checkpoint and the manifest carry the :class:`Owner` that wrote them: the GRPOJob (namespace, name,
uid), the gang attempt, and what shapes the weights (model, revision, LoRA rank and target modules).
That identity is what keeps two writers apart:

* fencing: an attempt never overwrites the manifest of a newer attempt of its job nor prunes for it, and
  a new attempt claims the manifest when it starts, so the SIGTERM checkpoint of the attempt it replaces
  (which may still be writing) cannot move the manifest or prune the new attempt's resume point;
* identity: a checkpoint of another job, or for another model or LoRA setting, is never resumed and never
  pruned; the trainer stops with :class:`CheckpointMismatch` naming the difference.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from grpo_operator.api.trainer_config import TrainerConfig

from grpo_trainer.errors import CheckpointMismatch, ConfigError
from grpo_trainer.grpo_config import STAGING_DIRNAME

log = logging.getLogger("grpo_trainer.checkpoints")

MANIFEST = "latest.json"
# flock()ed around every read-decide-write of the manifest: a claim and a publish of two attempts of the
# job must not interleave (see manifest_lock).
MANIFEST_LOCK = ".latest.lock"
# Written into every step-N directory: the owner, the dynamic-sampling stream position.
GRPO_STATE_FILE = "grpo_state.json"
STEP_DIR_RE = re.compile(r"^step-(\d+)$")
ATTEMPT_DIR_RE = re.compile(r"^attempt-(\d+)$")


@dataclass(frozen=True)
class Owner:
    """Who wrote a checkpoint, and for which weights."""

    namespace: str
    name: str
    uid: str | None
    attempt: int
    model: str
    revision: str
    # None: full weights; else (r, sorted target modules) of the LoRA adapters.
    lora: tuple[int, tuple[str, ...]] | None

    @staticmethod
    def from_config(config: TrainerConfig, attempt: int, namespace: str, name: str) -> Owner:
        lora = config.grpo.lora
        return Owner(
            namespace=namespace,
            name=name,
            uid=config.job.uid,
            attempt=attempt,
            model=config.model.name,
            revision=config.model.revision,
            lora=(lora.r, tuple(sorted(lora.target_modules))) if lora.enabled else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "job": {"namespace": self.namespace, "name": self.name, "uid": self.uid},
            "attempt": self.attempt,
            "model": {"name": self.model, "revision": self.revision},
            "lora": None if self.lora is None else {"r": self.lora[0], "targetModules": list(self.lora[1])},
        }

    @staticmethod
    def from_json(raw: Any) -> Owner | None:
        """The owner recorded in a manifest or grpo_state.json; None for checkpoints written before owners
        were recorded (they are accepted: nothing can be checked)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("job"), dict):
            return None
        job, model, lora = raw["job"], raw.get("model") or {}, raw.get("lora")
        return Owner(
            namespace=str(job.get("namespace") or ""),
            name=str(job.get("name") or ""),
            uid=str(job["uid"]) if job.get("uid") else None,
            attempt=int(raw.get("attempt") or 0),
            model=str(model.get("name") or ""),
            revision=str(model.get("revision") or ""),
            lora=(int(lora["r"]), tuple(sorted(str(m) for m in lora["targetModules"])))
            if isinstance(lora, dict)
            else None,
        )

    def job_text(self) -> str:
        uid = f", uid {self.uid}" if self.uid else ""
        return f"GRPOJob {self.namespace}/{self.name}{uid}"

    def weights_text(self) -> str:
        if self.lora is None:
            adapters = "full weights"
        else:
            adapters = f"LoRA r={self.lora[0]} targetModules={list(self.lora[1])}"
        return f"model {self.model}@{self.revision}, {adapters}"

    def same_job(self, other: Owner) -> bool:
        if self.uid and other.uid:
            return self.uid == other.uid
        # A hand-written trainer.json has no uid: fall back to the name.
        return (self.namespace, self.name) == (other.namespace, other.name)

    def same_weights(self, other: Owner) -> bool:
        return (self.model, self.revision, self.lora) == (other.model, other.revision, other.lora)


def mismatch(found: Owner | None, me: Owner, where: Path) -> str | None:
    """Why the checkpoint at ``where`` (written by ``found``) cannot be resumed by ``me``, with the fix;
    None when it can."""
    if found is None:
        return None
    if not found.same_job(me):
        return (
            f"checkpoint {where} belongs to {found.job_text()}, not to this job ({me.job_text()}); it is "
            "neither resumed nor overwritten. Give this job its own volume (another "
            "spec.checkpoints.volume.existingClaim, or none), or delete that job's checkpoints "
            f"({where.parent}) if nobody needs them, then recreate the job"
        )
    if not found.same_weights(me):
        return (
            f"checkpoint {where} holds {found.weights_text()}, but this job trains {me.weights_text()}; "
            "loading it would silently drop or misplace weights. Use the model and LoRA settings the "
            "checkpoint was written with, or a new volume to start from scratch"
        )
    return None


@dataclass(frozen=True)
class Manifest:
    step: int
    path: str
    time: str
    owner: Owner | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"step": self.step, "path": self.path, "time": self.time}
        if self.owner is not None:
            out.update(self.owner.to_json())
        return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as handle:
                os.fsync(handle.fileno())
        _fsync_dir(Path(dirpath))


@contextmanager
def manifest_lock(checkpoint_dir: Path) -> Iterator[None]:
    """Hold an exclusive flock on the checkpoint directory's lock file.

    Two attempts of a job can run at once for a while (a node cut off from the API server keeps running
    the old gang's processes). Without the lock, an old attempt could read the manifest, see it unclaimed,
    and replace it just after the new attempt claimed it: the claim is lost, and the old attempt prunes the
    checkpoint the new one is loading. The kernel drops the lock when its holder dies, so a killed attempt
    never leaves it held. Linux NFS clients map flock onto NFS byte-range locks, so the lock holds across
    nodes on an NFS-backed ReadWriteMany volume; where a filesystem refuses locks the attempt goes on
    unlocked, with a warning."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(checkpoint_dir / MANIFEST_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            log.warning(
                "cannot lock %s (%s): publishing without the lock", checkpoint_dir / MANIFEST_LOCK, exc
            )
        yield
    finally:
        os.close(fd)  # releases the lock


def write_manifest(checkpoint_dir: Path, manifest: Manifest) -> None:
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    tmp = checkpoint_dir / f".{MANIFEST}.tmp-{os.getpid()}"
    with tmp.open("w", encoding="utf-8") as handle:
        json.dump(manifest.to_json(), handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, checkpoint_dir / MANIFEST)
    _fsync_dir(checkpoint_dir)


def read_manifest(checkpoint_dir: Path) -> Manifest | None:
    path = checkpoint_dir / MANIFEST
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return Manifest(
            step=int(raw["step"]), path=str(raw["path"]), time=str(raw["time"]), owner=Owner.from_json(raw)
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # Only os.replace ever writes the manifest, so a damaged one means someone edited it by hand.
        raise ConfigError(
            f"{path} is unreadable ({exc}); restore it or delete it to start from scratch"
        ) from None


def read_owner(step_dir: Path) -> Owner | None:
    """The owner recorded in a step directory's grpo_state.json (None: not recorded or unreadable)."""
    try:
        raw = json.loads((step_dir / GRPO_STATE_FILE).read_text(encoding="utf-8"))
        return Owner.from_json(raw.get("owner"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _superseded(current: Manifest | None, me: Owner) -> bool:
    return (
        current is not None
        and current.owner is not None
        and current.owner.same_job(me)
        and current.owner.attempt > me.attempt
    )


def claim(checkpoint_dir: Path, me: Owner) -> None:
    """At the start of a gang attempt: stamp this attempt into the job's manifest, so that an older attempt
    still writing its SIGTERM checkpoint sees it is superseded and neither publishes nor prunes."""
    if not (checkpoint_dir / MANIFEST).is_file():
        return
    with manifest_lock(checkpoint_dir):
        current = read_manifest(checkpoint_dir)
        if current is None or current.owner is None or not current.owner.same_job(me):
            return
        if current.owner.attempt >= me.attempt:
            return
        owner = replace(current.owner, attempt=me.attempt)
        write_manifest(checkpoint_dir, Manifest(current.step, current.path, current.time, owner))
    log.info("gang attempt %d claimed %s (step %d)", me.attempt, checkpoint_dir / MANIFEST, current.step)


def clean_staging(checkpoint_dir: Path, me: Owner) -> None:
    """Delete half-written checkpoints that attempts older than the one this attempt replaces left in
    ``.partial`` (they were killed mid-save). The replaced attempt's own directory stays: it may still be
    writing its SIGTERM checkpoint. Only done when the manifest is the job's: with another job's (or
    none) the directory may be someone else's staging area."""
    current = read_manifest(checkpoint_dir)
    staging = checkpoint_dir / STAGING_DIRNAME
    if current is None or current.owner is None or not current.owner.same_job(me) or not staging.is_dir():
        return
    for entry in staging.iterdir():
        match = ATTEMPT_DIR_RE.match(entry.name)
        stale = int(match.group(1)) < me.attempt - 1 if match else entry.name.startswith("checkpoint-")
        if stale:
            shutil.rmtree(entry, ignore_errors=True)
            log.info("removed the half-written checkpoint staging directory %s", entry)


def publish(staged: Path, checkpoint_dir: Path, step: int, keep_last: int, owner: Owner) -> Manifest | None:
    """Make a fully written HF checkpoint directory the newest checkpoint, then prune this job's old ones.

    Returns None, discarding ``staged``, when a newer attempt of the job owns the manifest (this attempt
    is being replaced). Raises CheckpointMismatch when another job's manifest appeared in the directory."""
    target = checkpoint_dir / f"step-{step}"
    current = read_manifest(checkpoint_dir)
    if _superseded(current, owner):
        assert current is not None and current.owner is not None
        log.warning(
            "gang attempt %d was replaced by attempt %d: checkpoint step %d is discarded, %s stays as it is",
            owner.attempt,
            current.owner.attempt,
            step,
            checkpoint_dir / MANIFEST,
        )
        shutil.rmtree(staged, ignore_errors=True)
        return None
    if current is not None and current.owner is not None and not current.owner.same_job(owner):
        shutil.rmtree(staged, ignore_errors=True)
        problem = mismatch(current.owner, owner, Path(current.path))
        raise CheckpointMismatch(problem or f"{checkpoint_dir / MANIFEST} belongs to another job")
    if target.exists():
        if current is not None and Path(current.path) == target:
            # The same step saved twice (e.g. SIGTERM right after a periodic save): keep the published one.
            shutil.rmtree(staged, ignore_errors=True)
            return current
        found = read_owner(target)
        if found is not None and (not found.same_job(owner) or found.attempt > owner.attempt):
            # Not ours to replace: another job's, or written by a newer attempt that has not published yet.
            shutil.rmtree(staged, ignore_errors=True)
            return None
        shutil.rmtree(target)  # our leftover from a crash between rename and manifest; never published
    _fsync_tree(staged)
    os.replace(staged, target)
    _fsync_dir(checkpoint_dir)
    manifest = Manifest(
        step=step, path=str(target), time=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), owner=owner
    )
    # Checked again under the lock a claim takes: once a newer attempt has claimed the manifest, this
    # attempt neither moves it nor prunes the checkpoint the newer attempt is about to load.
    with manifest_lock(checkpoint_dir):
        if _superseded(read_manifest(checkpoint_dir), owner):
            log.warning(
                "gang attempt %d was replaced while publishing step %d: manifest left alone",
                owner.attempt,
                step,
            )
            return None
        write_manifest(checkpoint_dir, manifest)
        prune(checkpoint_dir, keep_last, protect=target, owner=owner)
    return manifest


def step_dirs(checkpoint_dir: Path) -> list[tuple[int, Path]]:
    if not checkpoint_dir.is_dir():
        return []
    found = []
    for entry in checkpoint_dir.iterdir():
        match = STEP_DIR_RE.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def prune(checkpoint_dir: Path, keep_last: int, protect: Path, owner: Owner) -> None:
    """Delete all but the newest ``keep_last`` checkpoints of ``owner``'s job. Directories of other jobs
    are never counted or touched; directories without a recorded owner (written before owners were
    recorded) count as the job's."""

    def ours(path: Path) -> bool:
        found = read_owner(path)
        return found is None or found.same_job(owner)

    dirs = [(step, path) for step, path in step_dirs(checkpoint_dir) if ours(path)]
    for _, path in dirs[: max(0, len(dirs) - keep_last)]:
        if path != protect:
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed old checkpoint %s (keepLast=%d)", path, keep_last)


def _check(path: Path, me: Owner) -> None:
    problem = mismatch(read_owner(path), me, path)
    if problem:
        raise CheckpointMismatch(problem)


def resolve_resume(resume_from: str | None, checkpoint_dir: Path, me: Owner) -> str | None:
    """RESUME_FROM (a step directory, or a checkpoint root holding latest.json) wins; when the directory it
    names is gone (pruned by the attempt this one replaces, which had already published a newer
    checkpoint) the job's manifest in checkpoints.dir is used instead; otherwise a fresh start.

    Raises CheckpointMismatch when the checkpoint found belongs to another job or other weights."""
    if resume_from:
        path = Path(resume_from)
        if (path / MANIFEST).is_file():
            manifest = read_manifest(path)
            assert manifest is not None
            problem = mismatch(manifest.owner, me, Path(manifest.path))
            if problem:
                raise CheckpointMismatch(problem)
            path = Path(manifest.path)
        if (path / "trainer_state.json").is_file():
            _check(path, me)
            return str(path)
        fallback = read_manifest(checkpoint_dir)
        usable = (
            fallback is not None
            and (fallback.owner is None or fallback.owner.same_job(me))
            and (Path(fallback.path) / "trainer_state.json").is_file()
        )
        if not usable:
            raise ConfigError(
                f"RESUME_FROM={resume_from} is not a complete checkpoint (no trainer_state.json in {path}) "
                f"and {checkpoint_dir / MANIFEST} names none of this job's; point RESUME_FROM at a step-N "
                "directory, or leave it empty"
            )
        assert fallback is not None
        log.warning(
            "RESUME_FROM=%s is gone; resuming from the job's newest checkpoint %s (step %d) named by %s",
            resume_from,
            fallback.path,
            fallback.step,
            checkpoint_dir / MANIFEST,
        )
        _check(Path(fallback.path), me)
        return fallback.path
    manifest = read_manifest(checkpoint_dir)
    if manifest is None:
        return None
    problem = mismatch(manifest.owner, me, Path(manifest.path))
    if problem:
        raise CheckpointMismatch(problem)
    if not (Path(manifest.path) / "trainer_state.json").is_file():
        raise ConfigError(
            f"{checkpoint_dir / MANIFEST} names {manifest.path}, which is missing or incomplete; "
            "the volume was modified by hand: restore the directory or delete latest.json"
        )
    _check(Path(manifest.path), me)
    return manifest.path
