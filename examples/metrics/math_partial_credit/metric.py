"""Partial-credit metric for math word problems (GSM8K-style rows: {"question", "answer"}, where the
reference answer holds the worked solution with <<a*b=c>> calculator annotations and "#### <final>").

    reward = 0.6 * [final answer correct] + 0.4 * (share of the reference's intermediate results that
             appear in the completion's working)

so a correct answer with full working scores 1.0, a wrong answer with the right working gets up to 0.4,
and a wrong answer without working scores 0.0 (the trainer's failureScore). A completion with no final
answer in the required form ("#### <number>" or "Answer: <number>") cannot be graded: FormatFailure,
which the trainer scores formatFailureScore (below a wrong answer). When the reference has no
annotations, the working share equals the final-answer correctness."""

from __future__ import annotations

import os
import re
from typing import Any

from grpo_metric import FormatFailure, serve

ANSWER_FIELD = os.environ.get("ANSWER_FIELD", "answer")
FINAL_WEIGHT = 0.6
WORKING_WEIGHT = 0.4

_NUMBER = r"-?\$?\d[\d,]*(?:\.\d+)?"
_FINAL = re.compile(rf"(?:####|answer\s*:)\s*({_NUMBER})", re.IGNORECASE)
_ANNOTATION = re.compile(r"<<[^=<>]*=\s*(" + _NUMBER + r")\s*>>")
_ANY_NUMBER = re.compile(_NUMBER)


def to_number(text: str) -> float:
    return float(text.replace("$", "").replace(",", ""))


def reference(example: dict[str, Any]) -> tuple[float, list[float]]:
    raw = example.get(ANSWER_FIELD)
    if raw is None:
        raise KeyError(f"dataset row has no {ANSWER_FIELD!r} column; set ANSWER_FIELD to the answer column")
    if isinstance(raw, int | float):
        return float(raw), []
    text = str(raw)
    finals = _FINAL.findall(text)
    final = to_number(finals[-1]) if finals else to_number(text.strip())
    steps = [to_number(value) for value in _ANNOTATION.findall(text)]
    return final, steps


def metric(example: dict[str, Any], completion: str) -> float:
    final, steps = reference(example)
    found = _FINAL.findall(completion)
    if not found:
        raise FormatFailure('no final answer: end with "#### <number>" or "Answer: <number>"')
    correct = abs(to_number(found[-1]) - final) < 1e-6
    working_text = _FINAL.split(completion)[0]
    shown = {to_number(n) for n in _ANY_NUMBER.findall(working_text)}
    if steps:
        working = sum(any(abs(s - v) < 1e-6 for v in shown) for s in steps) / len(steps)
    else:
        working = 1.0 if correct else 0.0
    return round(FINAL_WEIGHT * float(correct) + WORKING_WEIGHT * working, 6)


if __name__ == "__main__":
    serve(metric)
