"""A real training run tells the metric each completion's token count and finish reason, for training and
validation answers alike, and "length" agrees with TRL's own count of cut-off completions
(metrics.jsonl truncated_ratio, from completions/clipped_ratio)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from grpo_metric import FINISH_LENGTH, FINISH_STOP, MetricServer
from grpo_trainer.trainer import masked_token_counts

from tests.trainer.toy import fraction_of_target, read_jsonl, start_trainer, trainer_config

pytestmark = pytest.mark.trainer

MAX_COMPLETION = 8


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int | None, str | None]] = []
        self.lock = threading.Lock()

    def __call__(
        self,
        example: dict[str, Any],
        completion: str,
        *,
        completion_tokens: int | None = None,
        finish_reason: str | None = None,
    ) -> float:
        with self.lock:
            self.calls.append((str(example.get("row")), completion_tokens, finish_reason))
        return fraction_of_target(example, completion) if completion else 0.0


def test_the_metric_receives_token_counts_and_finish_reasons(tmp_path: Path, tiny_model: Path) -> None:
    train, validate = Recorder(), Recorder()
    with MetricServer(train, validation=validate) as metric:
        config = trainer_config(
            tmp_path,
            tiny_model,
            metric.url,
            steps=2,
            every_steps=2,
            validation_every=2,
            validation_score_path="/validate",
            max_completion_length=MAX_COMPLETION,
        )
        process = start_trainer(config, tmp_path / "trainer.log")
        assert process.wait(timeout=600) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert len(records) == 2 and train.calls
    for _, tokens, finish in train.calls + validate.calls:
        assert finish in (FINISH_STOP, FINISH_LENGTH) and tokens is not None
        assert 1 <= tokens <= MAX_COMPLETION
        # "length" only for a completion that used the whole budget.
        assert finish == FINISH_STOP or tokens == MAX_COMPLETION
    # The tiny random model rarely ends by itself: most answers are cut off, so "length" is exercised.
    cut = sum(finish == FINISH_LENGTH for _, _, finish in train.calls)
    assert cut > 0
    # Over the run the metric's "length" share is TRL's clipped ratio (the same batch size every step).
    mean_truncated = sum(r["truncated_ratio"] for r in records) / len(records)
    assert cut / len(train.calls) == pytest.approx(mean_truncated)
    assert validate.calls  # and they carried the fields too (checked with the training calls above)


def test_masked_token_counts_per_token_and_per_sequence() -> None:
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    # Token modes: a weight per token; padding carries ratio 1 (TRL multiplies the difference by the mask).
    token = torch.tensor([[1.0, 0.0, 1.2, 1.0], [0.0, 0.9, 1.0, 1.0]])
    assert masked_token_counts(token, mask) == (2, 5)
    # Sequence modes: one weight per completion; a masked completion counts all its tokens.
    sequence = torch.tensor([[0.0], [1.1]])
    assert masked_token_counts(sequence, mask) == (3, 5)
