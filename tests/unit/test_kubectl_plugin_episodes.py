"""`kubectl grpo samples` for a job with spec.environment: its episodes from episodes.jsonl, turn by turn, with
which tokens the loss trained checked against what the model sampled, and the reward. The trainer's rank 0
writes that file from what the tenant's model and environment produced, so a hostile record must render
without a traceback and without a character a terminal would act on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from grpo_operator.kubectl_plugin import cli, data, episodes_view
from grpo_operator.kubectl_plugin.arguments import parser
from grpo_operator.kubectl_plugin.errors import NotFound, PluginError
from grpo_operator.kubectl_plugin.volume import HostPathTransport

from tests.unit.test_kubectl_plugin import ATTACKS, acted_on, samples_args

ENV_JOB: dict[str, Any] = {
    "metadata": {"name": "calc", "namespace": "ns", "uid": "u-1"},
    "spec": {"environment": {"image": "calc:1"}},
    "status": {"phase": "Running", "progress": {"display": "3/10"}},
}
PROMPT = "What is 17 * 23 + 9? Use calc <expression>, then answer <number>."


def turn(
    ids: list[int], text: str, observation: str | None, glue: list[int], reward: float
) -> dict[str, Any]:
    return {
        "ids": ids,
        "logprobs": [-0.25] * len(ids),
        "text": text,
        "action": {"message": text},
        "observation": observation,
        "observationIds": glue,
        "reward": reward,
        "stepSeconds": 0.012,
    }


def episode(index: Any = 0, reward: Any = 1.0, **extra: Any) -> dict[str, Any]:
    """A 3-turn calculator episode as the trainer writes it: the loss saw every turn's ids then its
    environment tokens, the mask 1 on the model's tokens only."""
    turns = [
        turn([101, 102, 103, 104], "calc 17*23", "391", [7, 8, 9], 0.0),
        turn([105, 106], "calc 391+9", "400", [7, 10, 9], 0.0),
        turn([107, 108, 109], "answer 400", None, [], 1.0),
    ]
    record: dict[str, Any] = {
        "step": 3,
        "index": index,
        "outcome": "done",
        "reward": reward,
        "reason": "",
        "promptIds": [1, 2, 3],
        "prompt": PROMPT,
        "turns": turns,
        "trainedIds": [t for x in turns for t in x["ids"] + x["observationIds"]],
        "trainedMask": [m for x in turns for m in [1] * len(x["ids"]) + [0] * len(x["observationIds"])],
    }
    return {**record, **extra}


def test_a_three_turn_episode_shows_its_turns_what_was_trained_and_its_reward() -> None:
    assert episodes_view.episodes_text([episode()]).splitlines() == [
        "── step 3 · episodes ──",
        "PROMPT",
        f"  │ {PROMPT}",
        "GROUP  1 episodes  mean +1.0000  std 0.0000",
        "EPISODE 0  done  reward +1.0000  3 turns  9 of 15 tokens trained",
        "  turn 1 of 3  reward +0.0000  environment step 0.012 s",
        "    model · trained (4 tokens)",
        "      │ calc 17*23",
        "    action",
        '      │ {"message": "calc 17*23"}',
        "    environment · not trained (3 tokens)",
        "      │ 391",
        "  turn 2 of 3  reward +0.0000  environment step 0.012 s",
        "    model · trained (2 tokens)",
        "      │ calc 391+9",
        "    action",
        '      │ {"message": "calc 391+9"}',
        "    environment · not trained (3 tokens)",
        "      │ 400",
        "  turn 3 of 3  reward +1.0000  environment step 0.012 s",
        "    model · trained (3 tokens)",
        "      │ answer 400",
        "    action",
        '      │ {"message": "answer 400"}',
    ]


def test_a_group_shares_its_prompt_and_a_failed_episode_says_why_unscored() -> None:
    failed = episode(
        1, reward=None, outcome="environment_error", reason="the environment did not answer a step within 30s"
    )
    lines = episodes_view.episodes_text([episode(0), failed]).splitlines()
    assert lines.count("PROMPT") == 1 and "GROUP  2 episodes  mean +1.0000  std 0.0000" in lines
    at = lines.index("EPISODE 1  ENVIRONMENT ERROR  reward - (not scored)  3 turns  9 of 15 tokens trained")
    assert lines[at + 1] == "  reason: the environment did not answer a step within 30s"


def test_a_token_trained_that_was_not_sampled_or_one_left_out_is_a_loud_mismatch() -> None:
    record = episode()
    mask = record["trainedMask"]
    # The 4th sampled token masked out, the 1st observation token trained, a sampled id replaced.
    mask[3], mask[4] = 0, 1
    record["trainedIds"][7] = 999
    counted = episodes_view.training(record)
    first, second = counted.turns[0], counted.turns[1]
    assert (first.trained, first.environment_trained, second.trained, second.differ) == (3, 1, 1, 1)
    lines = episodes_view.episodes_text([record]).splitlines()
    assert lines[4] == "EPISODE 0  done  reward +1.0000  3 turns  9 of 15 tokens trained  MISMATCH"
    assert lines[5].startswith("  MISMATCH: the loss did not train exactly the tokens the model sampled")
    assert "    model · MISMATCH: 3 of 4 tokens trained" in lines
    assert "    environment · MISMATCH: 1 of 3 tokens trained" in lines
    assert "    model · MISMATCH: 1 of 2 tokens trained, 1 not at their place in trainedIds" in lines


def test_lengths_that_do_not_add_up_are_named() -> None:
    record = episode(trainedMask=episode()["trainedMask"][:10], trainedIds=[*episode()["trainedIds"], 5])
    text = episodes_view.episodes_text([record])
    assert "MISMATCH: trainedMask has 10 entries for 16 trainedIds" in text
    assert "MISMATCH: trainedIds has 16 tokens, the turns 15" in text


def test_an_episode_without_the_trained_tokens_says_so_rather_than_guess() -> None:
    record = episode()
    del record["trainedIds"], record["trainedMask"]
    lines = episodes_view.episodes_text([record]).splitlines()
    assert lines[4] == "EPISODE 0  done  reward +1.0000  3 turns  15 tokens, training not recorded"
    assert "    model · 4 tokens, training not recorded" in lines and "MISMATCH" not in "\n".join(lines)


def test_an_episode_dynamic_sampling_replaced_says_it_was_not_trained_and_a_refill_names_its_round() -> None:
    replaced = episode(0, reward=0.0, round=0, trained=False)
    del replaced["trainedIds"], replaced["trainedMask"]
    refill = episode(1, round=1, trained=True)
    lines = episodes_view.episodes_text([replaced, refill]).splitlines()
    heads = [line for line in lines if line.startswith("EPISODE")]
    assert heads == [
        "EPISODE 0  done  reward +0.0000  3 turns  15 tokens, not trained (tied group replaced)",
        "EPISODE 1  done  reward +1.0000  3 turns  refill round 1  9 of 15 tokens trained",
    ]


# -- hostile records --------------------------------------------------------------------------------

PAYLOAD = "".join(ATTACKS.values())
HUGE = 10 * 1000 * 1000


def hostile_records() -> dict[str, dict[str, Any]]:
    long_turns = [turn([1], "t", "o", [2], 0.0) for _ in range(200)]
    return {
        "escapes everywhere": episode(
            prompt=PAYLOAD,
            reason=PAYLOAD,
            outcome=PAYLOAD,
            turns=[
                {**turn([1, 2], PAYLOAD, PAYLOAD, [3], 0.0), "action": {PAYLOAD: [PAYLOAD, {"x": PAYLOAD}]}},
                {**turn([4], "a\rb", "\x1b]52;c;ZXZpbA==\x07", [5], 0.0), "action": "\x9b2J\r"},
            ],
        ),
        "a 10 MB observation": episode(turns=[turn([1], "calc", "\x1b[2J" + "o" * HUGE, [2], 0.0)]),
        "turns a string": episode(turns="turn 1: \x1b[2J"),
        "turns of junk": episode(
            turns=[None, 3, "x", [1, 2], {"ids": "abc", "observationIds": [True, None]}]
        ),
        "reward NaN as text": episode(reward="NaN"),
        "reward a dict": episode(reward={"value": 1}, index="0\x1b[2J"),
        "reward NaN and infinite numbers": episode(
            reward=float("nan"), turns=[{**turn([1], "t", None, [], float("inf")), "stepSeconds": -1e999}]
        ),
        "trainedMask shorter than trainedIds": episode(trainedMask=[1, 1]),
        "trained lists of the wrong types": episode(trainedIds="1,2,3", trainedMask=[True, "1", None]),
        "more turns than an episode may have": episode(turns=long_turns),
        "fields missing": {"step": 3},
        "a prompt that is not text": episode(prompt={"role": [PAYLOAD]}, outcome=["done"]),
    }


@pytest.mark.parametrize("name", list(hostile_records()))
def test_a_hostile_record_renders_without_raising_or_a_control_character(name: str) -> None:
    text = episodes_view.episodes_text([hostile_records()[name]])
    assert acted_on(text) == set(), f"{name}: raw controls {acted_on(text)}"
    # Bounded: a text is cut at 64 Ki characters (and escaping a control character takes 6), at most 64 turns.
    assert len(text) < 2_000_000, (name, len(text))


def test_what_a_hostile_record_holds_is_named_not_shown() -> None:
    records = hostile_records()
    huge = episodes_view.episodes_text([records["a 10 MB observation"]])
    assert f"… [truncated {HUGE + 4 - (64 << 10)} bytes]" in huge
    assert "[turns is str, not a list: no turn to show]" in episodes_view.episodes_text(
        [records["turns a string"]]
    )
    junk = episodes_view.episodes_text([records["turns of junk"]])
    assert (
        "  turn 1 of 5: [NoneType, not an object]" in junk and "  turn 4 of 5: [list, not an object]" in junk
    )
    assert "    [ids and observationIds not a list of token ids: counted as none]" in junk
    missing = episodes_view.episodes_text([records["fields missing"]])
    assert "EPISODE -  outcome -  reward - (not scored)  0 turns  0 tokens, training not recorded" in missing
    for name in ("reward NaN as text", "reward a dict", "reward NaN and infinite numbers"):
        assert "reward - (not scored)" in episodes_view.episodes_text([records[name]]), name
    wrong = episodes_view.episodes_text([records["trained lists of the wrong types"]])
    assert "MISMATCH: trainedIds and trainedMask are not both lists of integers" in wrong
    shorter = episodes_view.episodes_text([records["trainedMask shorter than trainedIds"]])
    assert "2 of 15 tokens trained  MISMATCH" in shorter and "trainedMask has 2 entries for 15" in shorter
    many = episodes_view.episodes_text([records["more turns than an episode may have"]])
    assert "turn 64 of 200" in many and "turn 65 of" not in many and "… 136 more turns not shown" in many
    escaped = episodes_view.episodes_text([records["escapes everywhere"]])
    assert "\\u001b]52;c;" in escaped and "\\u009b2J" in escaped and "outcome '" in escaped


# -- through the command, from the job's volume ---------------------------------------------------------


def volume_with(
    root: Path, lines: list[str], name: str = "episodes.jsonl", end: str = "\n"
) -> HostPathTransport:
    (root / "output").mkdir(parents=True, exist_ok=True)
    (root / "output" / name).write_text("\n".join(lines) + end)
    return HostPathTransport(root)


def test_an_environment_job_shows_episodes_and_hostile_lines_cost_a_notice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = episode(index=2, turns=[turn([1], "calc", "o" * HUGE, [2], 0.0)])
    lines = [json.dumps(r, ensure_ascii=False) for r in hostile_records().values()]
    lines += [json.dumps(big), json.dumps(episode(1))]
    # The last line is cut off mid-record, as a trainer killed while writing leaves it.
    volume = volume_with(tmp_path, [*lines, json.dumps(episode(3))[:40]], end="")
    assert cli.print_samples(volume, ENV_JOB, samples_args(), lambda: True) == 0
    seen = capsys.readouterr()
    assert acted_on(seen.out + seen.err) == set()
    assert "EPISODE 1  done  reward +1.0000  3 turns  9 of 15 tokens trained" in seen.out
    assert "skipped a line of /workspace/output/episodes.jsonl of 10.0 MB" in seen.err
    assert "skipped 1 line(s) of /workspace/output/episodes.jsonl that are not JSON objects" in seen.err


def test_json_passes_the_records_through(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = [episode(0, prompt=PAYLOAD), episode(1, reward=None, outcome="truncated", turns="junk")]
    volume = volume_with(tmp_path, [json.dumps(r, ensure_ascii=False) for r in records])
    assert cli.print_samples(volume, ENV_JOB, samples_args("json"), lambda: True) == 0
    shown = capsys.readouterr().out
    assert acted_on(shown) == set() and json.loads(shown) == records
    # Following, one record per line, so the stream can be piped to jq.
    assert (
        cli.print_samples(volume, ENV_JOB, samples_args("json", follow=True, interval=0), lambda: True) == 0
    )
    streamed = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in streamed] == records


def test_no_episodes_yet_names_the_file_and_the_job(tmp_path: Path) -> None:
    volume = volume_with(
        tmp_path, [json.dumps({"step": 1, "prompt": "p", "completion": "c"})], "samples.jsonl"
    )
    with pytest.raises(NotFound) as caught:
        cli.print_samples(volume, ENV_JOB, samples_args(), lambda: True)
    assert str(caught.value).startswith(
        f"no episodes yet: {data.EPISODES_FILE} does not exist on the job's volume (job calc is Running, step 3/10)"
    )
    assert "--no-episodes" in str(caught.value)
    with pytest.raises(NotFound, match=r"no episodes at step 9 \(.*steps with episodes: \[3\]\)"):
        cli.print_samples(
            volume_with(tmp_path, [json.dumps(episode())]), ENV_JOB, samples_args(step=9), lambda: True
        )


def test_the_flag_overrides_what_the_spec_chooses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    volume_with(
        tmp_path, [json.dumps({"step": 1, "prompt": "p", "completion": "the transcript"})], "samples.jsonl"
    )
    volume = volume_with(tmp_path, [json.dumps(episode())])
    assert cli.print_samples(volume, ENV_JOB, samples_args(episodes=False), lambda: True) == 0
    assert "│ the transcript" in capsys.readouterr().out
    plain = {**ENV_JOB, "spec": {}}
    assert cli.print_samples(volume, plain, samples_args(episodes=True), lambda: True) == 0
    assert "EPISODE 0  done" in capsys.readouterr().out
    with pytest.raises(PluginError, match="episodes are train only"):
        cli.print_samples(volume, ENV_JOB, samples_args(split="validation"), lambda: True)
    assert episodes_view.wanted(plain, None) is False and episodes_view.wanted(ENV_JOB, None) is True
    assert episodes_view.wanted({"spec": {"environment": "junk"}}, None) is False
    assert parser().parse_args(["samples", "calc"]).episodes is None
    assert parser().parse_args(["samples", "calc", "--no-episodes"]).episodes is False


def test_worst_ranks_groups_of_episodes_even_with_a_prompt_that_is_not_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [
        episode(0, reward=1.0),
        episode(1, reward=0.0),
        episode(2, reward=-1.0, prompt="an easier one"),
        episode(3, reward=-1.0, prompt={"not": "text"}),
    ]
    volume = volume_with(tmp_path, [json.dumps(r) for r in records])
    assert cli.print_samples(volume, ENV_JOB, samples_args(order="worst", limit=1), lambda: True) == 0
    shown = capsys.readouterr().out
    assert "EPISODE 2" in shown and "EPISODE 0" not in shown and "EPISODE 3" not in shown
