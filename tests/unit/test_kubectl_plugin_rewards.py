"""`kubectl grpo rewards`: the table's columns chosen with --columns (the trainer's KL, entropy, completion
length and the rest of metrics.jsonl, or a reward component), and the PNG with a panel per curve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from grpo_operator.kubectl_plugin import render

ROWS: list[dict[str, Any]] = [
    {
        "step": 1,
        "reward_mean": 0.1,
        "kl": 0.00012,
        "entropy": 2.5,
        "completion_length": 41.0,
        "truncated_ratio": 0.25,
    },
    {
        "step": 2,
        "reward_mean": 0.3,
        "kl": 0.0004,
        "completion_length": 38.5,
        "reward_components": {"format": 1.0},
    },
]


def test_columns_pick_the_fields_in_the_order_given() -> None:
    columns = render.reward_columns("reward,kl,entropy,length,format", ROWS)
    lines = render.rewards_text(ROWS, columns).splitlines()
    assert lines[0].split() == ["STEP", "REWARD", "KL", "ENTROPY", "LENGTH", "FORMAT"]
    assert lines[1].split() == ["1", "0.1000", "0.00012", "2.5000", "41.0"]
    assert lines[2].split() == ["2", "0.3000", "0.00040", "-", "38.5", "1.0000"]


def test_the_default_columns_are_the_reward_figures_and_every_component() -> None:
    assert render.reward_columns(None, ROWS) == [*render.DEFAULT_REWARD_COLUMNS, "format"]


def test_an_unknown_column_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown column klx: choose from reward, std, .*, health, format"):
        render.reward_columns("reward,klx", ROWS)


def test_the_png_has_a_panel_per_curve_the_steps_have(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from grpo_operator.kubectl_plugin.plot import plot_rows
    from matplotlib import image

    wide = image.imread(plot_rows(ROWS, tmp_path / "all.png", "t"))
    narrow = image.imread(plot_rows([{"step": 1, "reward_mean": 0.1}], tmp_path / "one.png", "t"))
    # reward, KL, entropy, length, truncated: five panels in three columns; the reward alone: one.
    assert wide.shape[1] > 2.5 * narrow.shape[1]
