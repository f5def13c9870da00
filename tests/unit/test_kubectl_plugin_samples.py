"""`kubectl grpo samples` as a reader sees a group: the reference answer over it, a header with the group's
mean, std and whether it tied (no signal), and per completion whether it was cut off and its reward's parts.
Everything comes from samples.jsonl, which the tenant's trainer image writes: what is malformed is left out."""

from __future__ import annotations

from typing import Any

from grpo_operator.kubectl_plugin import data, render

from tests.unit.test_kubectl_plugin import sample as step_sample


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


SAMPLES = [
    step_sample(1, "p1", 0.1),
    step_sample(1, "p1", 0.9),
    step_sample(2, "p2", 0.4),
    step_sample(2, "p2", None),
    step_sample(2, "p2", -1.0),
    step_sample(2, "v", 0.7, "validation"),
]


def test_samples_default_to_the_newest_step_of_the_split() -> None:
    chosen = data.select_samples(SAMPLES, split="train", step=None, order=None, limit=None)
    assert [s["reward"] for s in chosen] == [0.4, None, -1.0]
    val = data.select_samples(SAMPLES, split="validation", step=None, order=None, limit=None)
    assert [s["prompt"] for s in val] == ["v"]


def test_best_and_worst_rank_groups_by_mean_and_keep_unscored_last() -> None:
    best = data.select_samples(SAMPLES, split="train", step=None, order="best", limit=1)
    # Group p1 (mean 0.5) beats p2 (mean -0.3); its completions best first.
    assert [(s["prompt"], s["reward"]) for s in best] == [("p1", 0.9), ("p1", 0.1)]
    worst = data.select_samples(SAMPLES, split="train", step=2, order="worst", limit=None)
    assert [s["reward"] for s in worst] == [-1.0, 0.4, None]


def test_worst_looks_at_the_recent_steps_not_at_step_one_noise() -> None:
    """Step 1's random policy fails everywhere; --worst without --step shows what fails now."""
    samples = [step_sample(1, "early", -1.0), step_sample(1, "early", -1.0)]
    for step in range(2, 12):
        samples += [
            step_sample(step, f"q{step}", 0.8),
            step_sample(step, f"q{step}", 0.6 if step != 10 else -0.5),
        ]
    worst = data.select_samples(samples, split="train", step=None, order="worst", limit=1)
    assert [(s["step"], s["reward"]) for s in worst] == [(10, -0.5), (10, 0.8)]
    everything = data.select_samples(samples, split="train", step=None, order="worst", limit=None, recent=100)
    assert everything[0]["prompt"] == "early"
    recent = data.select_samples(samples, split="train", step=None, order="best", limit=None, recent=3)
    assert {s["step"] for s in recent} == {9, 10, 11}
