"""spec.tracking: experiment trackers the trainer reports to, besides metrics.jsonl, Prometheus and status."""

from __future__ import annotations

from pydantic import Field

from grpo_operator.api.base import ApiModel

# Under the trainer's outputDir (on the job's volume): one directory of event files per job, shared by its
# attempts (a resumed attempt purges the steps it redoes).
TENSORBOARD_SUBDIR = "tensorboard"


class TensorBoardSpec(ApiModel):
    """TensorBoard event files on the job's volume."""

    enabled: bool = Field(
        default=False,
        description="Trainer rank 0 writes TensorBoard event files to <outputDir>/tensorboard on the job's "
        "volume (/workspace/output/tensorboard): every step's figures as scalars (those of metrics.jsonl, "
        "TRL's loss, KL, entropy, clip ratios, learning rate), the learning-health diagnosis, sample "
        "completions as a table, and the resolved configuration (trainer.json and TRL's arguments) as text.",
    )


class TrackingSpec(ApiModel):
    """Experiment trackers."""

    tensor_board: TensorBoardSpec | None = Field(
        default=None, description="TensorBoard event files on the job's volume."
    )

    def tensorboard_enabled(self) -> bool:
        return self.tensor_board is not None and self.tensor_board.enabled
