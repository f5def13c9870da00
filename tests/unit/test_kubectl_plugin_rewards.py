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


def test_rewards_follow_prints_each_new_step_aligned_and_stops_when_the_job_ends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Steps 1-2 are on the volume when it starts; step 3 and an unterminated step 4 are written while it
    waits; the job ends after the third poll. Every complete step is printed once, aligned under the header."""
    import argparse
    import json

    from grpo_operator.kubectl_plugin.rewards_view import follow_rewards
    from grpo_operator.kubectl_plugin.volume import HostPathTransport

    metrics = tmp_path / "output" / "metrics.jsonl"
    metrics.parent.mkdir()

    def row(step: int, reward: float) -> str:
        return json.dumps({"step": step, "reward_mean": reward, "reward_std": 0.1, "kl": 0.001 * step}) + "\n"

    metrics.write_text(row(1, 0.25) + row(2, 0.5))
    # What the trainer appends before each poll of the job's phase; the job has ended at the third.
    appended = iter([row(3, 0.75), '{"step": 4, "reward_mean"', ""])
    polls = iter([False, False, True])

    def finished() -> bool:
        with metrics.open("a") as handle:
            handle.write(next(appended))
        return next(polls)

    args = argparse.Namespace(columns="reward,kl", output=None, plot=None, interval=0.0)
    assert follow_rewards(HostPathTransport(tmp_path), args, "t", finished) == 0
    lines = capsys.readouterr().out.splitlines()
    # The half-written step 4 is not a step yet.
    assert [line.split()[0] for line in lines] == ["STEP", "1", "2", "3"]
    for line in lines[1:]:
        assert line.index(line.split()[1]) == lines[0].index("REWARD")

    metrics.write_text(row(1, 0.25))
    args = argparse.Namespace(columns=None, output="json", plot=None, interval=0.0)
    polls = iter([True])
    assert follow_rewards(HostPathTransport(tmp_path), args, "t", lambda: next(polls)) == 0
    assert [json.loads(x)["step"] for x in capsys.readouterr().out.splitlines()] == [1]
