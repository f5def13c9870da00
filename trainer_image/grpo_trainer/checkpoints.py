"""Checkpoints on the job's volume: ``<dir>/step-<N>/`` directories made visible only by an atomic
manifest ``<dir>/latest.json`` = {"step": N, "path": ".../step-N", "time": ISO8601}.

HF Trainer writes a checkpoint (model, optimizer, scheduler, RNG, trainer_state with the data position)
into ``<dir>/.partial/checkpoint-N``; :func:`publish` then renames it to ``step-N`` (same filesystem, so
atomic), moves the manifest with write-tmp + fsync + os.replace, and only then deletes old checkpoints.
A crash at any point leaves latest.json naming a complete checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from grpo_trainer.errors import ConfigError

log = logging.getLogger("grpo_trainer.checkpoints")

MANIFEST = "latest.json"
STEP_DIR_RE = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class Manifest:
    step: int
    path: str
    time: str

    def to_json(self) -> dict[str, object]:
        return {"step": self.step, "path": self.path, "time": self.time}


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
        return Manifest(step=int(raw["step"]), path=str(raw["path"]), time=str(raw["time"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # Only os.replace ever writes the manifest, so a damaged one means someone edited it by hand.
        raise ConfigError(
            f"{path} is unreadable ({exc}); restore it or delete it to start from scratch"
        ) from None


def publish(staged: Path, checkpoint_dir: Path, step: int, keep_last: int) -> Manifest:
    """Make a fully written HF checkpoint directory the newest checkpoint, then prune old ones."""
    target = checkpoint_dir / f"step-{step}"
    current = read_manifest(checkpoint_dir)
    if target.exists():
        if current is not None and Path(current.path) == target:
            # The same step saved twice (e.g. SIGTERM right after a periodic save): keep the published one.
            shutil.rmtree(staged, ignore_errors=True)
            return current
        shutil.rmtree(target)  # a leftover from a crash between rename and manifest; never published
    _fsync_tree(staged)
    os.replace(staged, target)
    _fsync_dir(checkpoint_dir)
    manifest = Manifest(step=step, path=str(target), time=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    write_manifest(checkpoint_dir, manifest)
    prune(checkpoint_dir, keep_last, protect=target)
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


def prune(checkpoint_dir: Path, keep_last: int, protect: Path) -> None:
    dirs = step_dirs(checkpoint_dir)
    for _, path in dirs[: max(0, len(dirs) - keep_last)]:
        if path != protect:
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed old checkpoint %s (keepLast=%d)", path, keep_last)


def resolve_resume(resume_from: str | None, checkpoint_dir: Path) -> str | None:
    """RESUME_FROM (a step directory, or a checkpoint root holding latest.json) wins; otherwise the
    manifest in checkpoints.dir; otherwise a fresh start."""
    if resume_from:
        path = Path(resume_from)
        if (path / MANIFEST).is_file():
            manifest = read_manifest(path)
            assert manifest is not None
            path = Path(manifest.path)
        if not (path / "trainer_state.json").is_file():
            raise ConfigError(
                f"RESUME_FROM={resume_from} is not a complete checkpoint (no trainer_state.json in {path}); "
                f"point it at a step-N directory named by {checkpoint_dir / MANIFEST}, or leave it empty"
            )
        return str(path)
    manifest = read_manifest(checkpoint_dir)
    if manifest is None:
        return None
    if not (Path(manifest.path) / "trainer_state.json").is_file():
        raise ConfigError(
            f"{checkpoint_dir / MANIFEST} names {manifest.path}, which is missing or incomplete; "
            "the volume was modified by hand: restore the directory or delete latest.json"
        )
    return manifest.path
