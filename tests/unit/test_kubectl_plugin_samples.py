"""`kubectl grpo samples` as a reader sees a group: the reference answer over it, a header with the group's
mean, std and whether it tied (no signal), and per completion whether it was cut off and its reward's parts.
Everything comes from samples.jsonl, which the tenant's trainer image writes: what is malformed is left out."""

from __future__ import annotations

from typing import Any

from grpo_operator.kubectl_plugin import render


def sample(reward: float | None, **extra: Any) -> dict[str, Any]:
    return {
        "step": 7,
        "split": "train",
        "prompt": "Natalia sold 48 clips...",
        "completion": "#### 72",
        "reward": reward,
        **extra,
    }


def test_a_group_shows_its_reference_answer_statistics_truncation_and_components() -> None:
    text = render.samples_text(
        [
            sample(
                1.2, answer="... #### 72", finishReason="stop", components={"math_answer": 1.0, "format": 1.0}
            ),
            sample(
                0.0,
                answer="... #### 72",
                finishReason="length",
                components={"math_answer": 0.0, "format": 0.0},
            ),
        ]
    )
    assert text.splitlines() == [
        "── step 7 · train ──",
        "PROMPT",
        "  │ Natalia sold 48 clips...",
        "REFERENCE ANSWER",
        "  │ ... #### 72",
        "GROUP  2 completions  mean +0.6000  std 0.6000",
        "  reward +1.2000  (math_answer +1, format +1)",
        "    │ #### 72",
        "  reward +0.0000  TRUNCATED  (math_answer +0, format +0)",
        "    │ #### 72",
    ]


def test_a_tied_group_says_it_has_no_signal() -> None:
    head = render.samples_text([sample(0.0), sample(0.0), sample(None)]).splitlines()[3]
    assert head == "GROUP  3 completions  mean +0.0000  std 0.0000  TIED (no signal)"


def test_malformed_components_are_left_out() -> None:
    shown = render.sample_head(
        sample(1.0, components={"ok": 1, "Bad Name": 2.0, "\x1b[2J": 3.0, "nan": float("nan"), "text": "x"})
    )
    assert shown == "reward +1.0000  (ok +1)"
    assert render.sample_head(sample(1.0, components=["not", "a", "dict"])) == "reward +1.0000"
