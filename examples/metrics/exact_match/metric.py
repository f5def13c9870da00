"""Exact-match metric: reward 1.0 when the completion's final answer equals the dataset's answer column.

The final answer is the text after the last "Answer:" (case-insensitive), or the whole completion when
there is no such marker; comparison ignores case, surrounding whitespace and a trailing period. An empty
completion cannot be judged and is a format failure."""

from __future__ import annotations

import os
import re
from typing import Any

from grpo_metric import FormatFailure, serve

ANSWER_FIELD = os.environ.get("ANSWER_FIELD", "answer")
_MARKER = re.compile(r"answer\s*:", re.IGNORECASE)


def normalize(text: str) -> str:
    return " ".join(text.strip().rstrip(".").lower().split())


def final_answer(completion: str) -> str:
    parts = _MARKER.split(completion)
    return parts[-1]


def metric(example: dict[str, Any], completion: str) -> float:
    if ANSWER_FIELD not in example:
        raise KeyError(f"dataset row has no {ANSWER_FIELD!r} column; set ANSWER_FIELD to the answer column")
    answer = normalize(final_answer(completion))
    if not answer:
        raise FormatFailure("empty answer")
    return 1.0 if answer == normalize(str(example[ANSWER_FIELD])) else 0.0


if __name__ == "__main__":
    serve(metric)
