"""What samples.jsonl records beside each completion for `kubectl grpo samples` to show: the reference answer
(the dataset's answerField column), why the completion ended, and the parts of its reward."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A reference answer longer than this is cut in samples.jsonl (a worked solution, not a book).
MAX_ANSWER_CHARS = 4096


def sample_context(
    answer_field: str,
    example: Mapping[str, Any],
    finish_reason: str | None,
    components: Mapping[str, float] | None,
) -> dict[str, Any]:
    """The optional keys of one samples.jsonl record: ``answer``, ``finishReason`` and ``components``, each
    left out when unknown."""
    out: dict[str, Any] = {}
    if example.get(answer_field) is not None:
        out["answer"] = str(example[answer_field])[:MAX_ANSWER_CHARS]
    if finish_reason is not None:
        out["finishReason"] = finish_reason
    if components:
        out["components"] = dict(components)
    return out
