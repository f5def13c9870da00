"""What the trainer writes on the job's volume, parsed (pure functions, no I/O).

Layout (``/workspace`` is the claim's root in every pod that mounts it):

- ``output/metrics.jsonl``: one record per optimisation step (``step``, ``reward_mean``, ``reward_std``,
  ``format_failure_ratio``, ``zero_std_group_ratio``, ``validation_mean`` on validation steps, ...);
- ``output/samples.jsonl``: prompts and completions with their rewards (``split`` train or validation);
- ``output/episodes.jsonl``: jobs with ``spec.environment``: each logged episode's turns, its reward, and the
  token ids and mask the loss trained;
- ``checkpoints/step-<N>/`` made visible by the manifest ``checkpoints/latest.json``;
- ``output/model/``: the final model, once training has finished.

It also reads ``status.learning`` (the learning-health diagnosis trainer rank 0 patches into the job's
status): through its API model only, so a status that does not validate is left out rather than shown.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from grpo_metric.protocol import finite_number
from pydantic import ValidationError

from grpo_operator.api.learning_health import LearningStatus, describe
from grpo_operator.api.trainer_config import (
    DEFAULT_CHECKPOINT_DIR,
    DEFAULT_OUTPUT_DIR,
    VOLUME_MOUNT_PATH,
)

MOUNT = VOLUME_MOUNT_PATH
CHECKPOINT_DIR = DEFAULT_CHECKPOINT_DIR
OUTPUT_DIR = DEFAULT_OUTPUT_DIR
METRICS_FILE = f"{OUTPUT_DIR}/metrics.jsonl"
SAMPLES_FILE = f"{OUTPUT_DIR}/samples.jsonl"
EPISODES_FILE = f"{OUTPUT_DIR}/episodes.jsonl"
MODEL_DIR = f"{OUTPUT_DIR}/model"
MANIFEST_FILE = f"{CHECKPOINT_DIR}/latest.json"
STEP_DIR = re.compile(r"^step-(\d+)$")


# What the plugin reads of one file. The trainer's image is the tenant's code, so none of these files
# can be trusted to be small: every read is bounded, and what is left out is said.
LINE_LIMIT = 1 << 20  # one record; a sample with a 32k-token completion is ~150 KB
# An episode carries its tokens three times (as sampled, their log-probabilities, as trained): a 32k-token
# episode is ~1.5 MB.
EPISODE_LINE_LIMIT = 8 << 20
FILE_LIMIT = 64 << 20  # one read of a file: its newest part (the newest steps are at its end)
RECORD_LIMIT = 100_000  # records kept from one read (64 MiB of `{}` lines would be 20 M dicts)
MANIFEST_LIMIT = 64 << 10  # latest.json is a few hundred bytes


def size_text(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


class JsonlScanner:
    """Splits a JSON-lines file, fed in chunks, into records in linear time with bounded memory.

    A line longer than ``line_limit`` is not kept: its bytes are skipped up to the next newline and a
    notice says so. ``feed`` leaves an unterminated last line for the next chunk (a file being
    appended to); ``finish`` parses it when the file is complete. ``skip_first`` drops the bytes before
    the first newline, for a read that starts in the middle of a line."""

    def __init__(self, path: str, *, line_limit: int = LINE_LIMIT, skip_first: bool = False) -> None:
        self.path = path
        self.line_limit = line_limit
        self.pending = bytearray()
        self.dropping = skip_first
        self.partial_start = skip_first
        self.dropped = 0
        self.notices: list[str] = []
        self.malformed = 0
        self.long_lines = 0

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        start = 0
        while start < len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if self.dropping:
                self.dropped += len(piece)
            else:
                room = self.line_limit - len(self.pending)
                if len(piece) > room:
                    self.dropped = len(self.pending) + len(piece)
                    self.pending.clear()
                    self.dropping = True
                else:
                    self.pending += piece
            if end < 0:
                break
            self._end_line(records)
            start = end + 1
        return records

    def finish(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        if self.pending or self.dropping:
            self._end_line(records)
        return records

    def _end_line(self, records: list[dict[str, Any]]) -> None:
        if self.dropping:
            if self.partial_start:
                self.partial_start = False
            else:
                self.long_lines += 1
                if self.long_lines <= 3:
                    self.notices.append(
                        f"skipped a line of {self.path} of {size_text(self.dropped)}, more than the "
                        f"{size_text(self.line_limit)} a record may have (… [truncated {self.dropped} bytes])"
                    )
            self.dropping = False
            self.dropped = 0
            return
        line = bytes(self.pending).strip()
        self.pending.clear()
        if not line:
            return
        try:
            record = json.loads(line.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:
            self.malformed += 1

    def summary(self) -> list[str]:
        """Notices about what was left out, for the user's stderr."""
        notes = list(self.notices)
        if self.long_lines > 3:
            notes.append(f"skipped {self.long_lines - 3} more over-long lines of {self.path}")
        if self.malformed:
            notes.append(f"skipped {self.malformed} line(s) of {self.path} that are not JSON objects")
        return notes


def parse_jsonl(text: str) -> list[dict[str, Any]]:
    """The complete records of a JSON-lines text; a last line still being written is skipped."""
    scanner = JsonlScanner("(text)")
    return scanner.feed(text.encode("utf-8")) + scanner.finish()


def complete_lines(chunk: str) -> tuple[str, int]:
    """The part of ``chunk`` that ends with a newline, and its length in bytes (for following a file
    that is being appended to: the rest is read again next time)."""
    end = chunk.rfind("\n") + 1
    head = chunk[:end]
    return head, len(head.encode("utf-8"))


def step_of(record: dict[str, Any]) -> int | None:
    """A record's step when it is an integer; the tenant's trainer may write anything there."""
    step = record.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def manifest_step(raw: bytes | None, path: str) -> tuple[dict[str, Any] | None, str | None]:
    """The parsed checkpoint manifest, or None and what is wrong with it."""
    if raw is None:
        return None, None
    try:
        manifest = json.loads(raw.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError) as exc:
        return None, f"{path} is not JSON ({exc})"
    if not isinstance(manifest, dict) or step_of(manifest) is None:
        return None, f'{path} is not a JSON object with an integer "step"'
    return manifest, None


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: str
    latest: bool

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "path": self.path, "latest": self.latest}


def checkpoints(entries: list[str], manifest: dict[str, Any] | None) -> list[Checkpoint]:
    """Published checkpoints (``step-N`` directories) in step order; ``latest`` marks the one the
    manifest names, which is the one a restart resumes from."""
    latest = step_of(manifest) if manifest else None
    found = []
    for entry in entries:
        match = STEP_DIR.match(entry)
        if match:
            step = int(match.group(1))
            found.append(Checkpoint(step, f"{CHECKPOINT_DIR}/{entry}", step == latest))
    return sorted(found, key=lambda c: c.step)


# A finite number, or None: the trainer's JSON figures as the plugin shows them (one definition, the metric
# protocol's).
as_float = finite_number


def series(rows: list[dict[str, Any]], key: str) -> list[float | None]:
    out: list[float | None] = []
    for row in rows:
        out.append(as_float(row.get(key)))
    return out


# Steps --best/--worst rank the groups of when no --step is given: the policy as it is now, not step 1's.
DEFAULT_RECENT_STEPS = 5


def select_samples(
    samples: list[dict[str, Any]],
    *,
    split: str,
    step: int | None,
    order: str | None,
    limit: int | None,
    recent: int = DEFAULT_RECENT_STEPS,
) -> list[dict[str, Any]]:
    """The samples a user asked for. ``step`` None means the newest step of ``split``, or with ``order`` its
    newest ``recent`` steps. ``order`` (``best`` or ``worst``) ranks GRPO groups (one step's completions of
    one prompt) by their mean reward, each group's completions ranked the same way, groups without a
    scored completion and unscored completions last; ``limit`` then counts groups, otherwise samples."""
    chosen = [s for s in samples if s.get("split", "train") == split and step_of(s) is not None]
    if step is None and chosen:
        steps = sorted({step_of(s) or 0 for s in chosen})
        kept = set(steps[-max(recent, 1) :] if order is not None else steps[-1:])
        chosen = [s for s in chosen if step_of(s) in kept]
    elif step is not None:
        chosen = [s for s in chosen if step_of(s) == step]
    if order is None:
        return chosen[:limit] if limit is not None else chosen
    groups: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for sample in chosen:
        # A prompt that is not text (a list or object in a hostile file) cannot be a key: such share one group.
        prompt = sample.get("prompt")
        groups.setdefault((step_of(sample), prompt if isinstance(prompt, str) else None), []).append(sample)
    sign = -1.0 if order == "best" else 1.0

    def ranked(members: list[dict[str, Any]]) -> list[dict[str, Any]]:
        scored = sorted(
            (s for s in members if _score(s) is not None), key=lambda s: sign * (_score(s) or 0.0)
        )
        return scored + [s for s in members if _score(s) is None]

    def mean(members: list[dict[str, Any]]) -> float | None:
        rewards = [r for r in (_score(s) for s in members) if r is not None]
        return sum(rewards) / len(rewards) if rewards else None

    # Newest first among equal means: the policy as it is now.
    ordered = sorted(
        groups.values(),
        key=lambda g: (mean(g) is None, sign * (mean(g) or 0.0), -(step_of(g[0]) or 0)),
    )
    if limit is not None:
        ordered = ordered[:limit]
    return [s for group in ordered for s in ranked(group)]


def _score(sample: dict[str, Any]) -> float | None:
    return as_float(sample.get("reward"))


def learning_status(status: Any) -> LearningStatus | None:
    """``status.learning`` as its API model, or None when it is absent or does not validate: trainer rank 0
    (the tenant's code) writes it, so it is shown only through its typed fields, never as text it wrote."""
    raw = status.get("learning") if isinstance(status, dict) else None
    if not isinstance(raw, dict):
        return None
    try:
        return LearningStatus.model_validate(raw)
    except (ValidationError, RecursionError):
        return None


def learning_report(status: Any) -> dict[str, Any] | None:
    """The diagnosis as ``-o json``/``-o yaml`` print it: the validated fields (camelCase) and ``summary``,
    the line ``status`` prints (what was seen since when, and what to change); None without a valid one."""
    learning = learning_status(status)
    if learning is None:
        return None
    return {
        **learning.model_dump(by_alias=True, exclude_none=True, mode="json"),
        "summary": describe(learning),
    }
