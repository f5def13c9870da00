"""Episodes' pure parts: the glue between turns is exactly the chat template's text, a turn becomes the
action the spec asks for (or the model's format failure), and whatever an environment sends back is either
a checked observation or an EnvironmentFailure that names what was wrong."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from grpo_operator.api.environment import EnvironmentClientConfig
from grpo_trainer.environment_client import EnvironmentFailure, parse_answer, ws_url
from grpo_trainer.environment_rollouts import EnvironmentReward, sampled_logprobs
from grpo_trainer.episodes import ChatGlue, Episode, Turn, observation_text, parse_action
from grpo_trainer.tiny import build_tokenizer

# A chat template in the tiny tokenizer's alphabet; <eos> ends every turn, as <|im_end|> does in ChatML.
TEMPLATE = (
    "{% for m in messages %}#{{ m['role'] }}: {{ m['content'] }}<eos>\n{% endfor %}"
    "{% if add_generation_prompt %}#assistant: {% endif %}"
)


def chat_tokenizer() -> Any:
    tokenizer: Any = build_tokenizer()
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def config(**fields: Any) -> EnvironmentClientConfig:
    return EnvironmentClientConfig(url="http://env:8000", **fields)


@pytest.mark.parametrize("ended", [True, False])
def test_prompt_turns_and_glue_are_the_templates_rendering_of_the_conversation(ended: bool) -> None:
    tokenizer = chat_tokenizer()
    glue = ChatGlue(tokenizer)
    history: list[dict[str, Any]] = [{"role": "user", "content": "add 2 and 3"}]
    ids = glue.ids(glue.prompt_text(history))
    turn = glue.ids("call add(2, 3)") + ([tokenizer.eos_token_id] if ended else [])
    observation = {"role": "tool", "content": "5"}
    after = glue.ids(glue.glue(history, turn, observation))
    text = tokenizer.decode(ids + turn + after)
    # Whether the model ended its turn with <eos> or ran out of tokens, the context the next turn samples from
    # (and the loss trains on) renders the conversation as the template would.
    expected = glue.render([*history, {"role": "assistant", "content": "call add(2, 3)"}, observation], True)
    assert text == expected
    assert tokenizer.eos_token_id not in after[:1] or not ended


def test_a_model_without_a_chat_template_gets_blank_lines_between_turns() -> None:
    glue = ChatGlue(build_tokenizer())
    assert (
        glue.glue([{"role": "user", "content": "q"}], [5, 6], {"role": "user", "content": "obs"})
        == "\n\nobs\n\n"
    )


def test_the_episode_mask_covers_exactly_the_model_tokens_and_logprobs_are_nan_elsewhere() -> None:
    episode = Episode(prompt_ids=[1], prompt_text="p")
    episode.turns = [
        Turn(ids=[10, 11], logprobs=[-0.1, -0.2], text="a", glue_ids=[20, 21, 22]),
        Turn(ids=[12], logprobs=[-0.3], text="b"),
    ]
    assert episode.completion_ids == [10, 11, 20, 21, 22, 12]
    assert episode.env_mask == [1, 1, 0, 0, 0, 1]
    lps = episode.logprobs
    assert lps[:2] == [-0.1, -0.2] and all(math.isnan(x) for x in lps[2:5]) and lps[5] == -0.3
    assert episode.model_tokens == 3


def test_text_actions_carry_the_turn_and_tool_calls_become_openenvs_call_tool() -> None:
    assert parse_action(config(), "hello") == {"message": "hello"}
    assert parse_action(config(action_field="command"), "ls") == {"command": "ls"}
    tool = config(action_format="ToolCall")
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    assert parse_action(tool, f"let me add\n{call}") == {
        "type": "call_tool",
        "tool_name": "add",
        "arguments": {"a": 2, "b": 3},
    }
    # Arguments as a JSON string, as some templates emit them.
    call_str = '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>'
    assert parse_action(tool, call_str)["arguments"] == {"a": 1}
    for bad in [
        "no call here",
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "x", "arguments": [1]}</tool_call>',
    ]:
        with pytest.raises(ValueError):
            parse_action(tool, bad)


def test_an_observation_field_is_read_and_a_missing_one_is_the_environments_failure() -> None:
    assert observation_text(config(observation_field="text"), {"text": "hi", "n": 1}) == "hi"
    assert json.loads(observation_text(config(), {"text": "hi", "n": 1})) == {"text": "hi", "n": 1}
    with pytest.raises(EnvironmentFailure, match="no field 'text'"):
        observation_text(config(observation_field="text"), {"other": 1})


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"\xff\xfe", "not JSON"),
        ("[1, 2]", "not an object"),
        (json.dumps({"type": "error", "data": {"message": "boom\x1b[2J"}}), "reported an error: boom"),
        (json.dumps({"type": "state", "data": {}}), "not an observation"),
        (json.dumps({"type": "observation", "data": {"observation": [1]}}), "not a JSON object"),
        (json.dumps({"type": "observation", "data": {"observation": {}, "reward": "1"}}), "not a number"),
        (json.dumps({"type": "observation", "data": {"observation": {}, "reward": True}}), "not a number"),
        ('{"type": "observation", "data": {"observation": {}, "reward": NaN}}', "not finite"),
        (json.dumps({"type": "observation", "data": {"observation": {}, "reward": 1e300}}), "not finite"),
        (json.dumps({"type": "observation", "data": {"observation": {}, "done": "yes"}}), "not a boolean"),
    ],
)
def test_whatever_an_environment_sends_is_a_checked_observation_or_a_named_failure(
    raw: Any, says: str
) -> None:
    with pytest.raises(EnvironmentFailure, match=says) as caught:
        parse_answer(raw)
    # Terminal-safe: no escape sequence of the environment's reaches a log line.
    assert "\x1b" not in str(caught.value)


def test_a_well_formed_answer_parses() -> None:
    answer = parse_answer(
        json.dumps({"type": "observation", "data": {"observation": {"a": 1}, "reward": 2, "done": True}})
    )
    assert (answer.observation, answer.reward, answer.done) == ({"a": 1}, 2.0, True)
    assert ws_url("http://job-env.ns.svc:8000") == "ws://job-env.ns.svc:8000/ws"
    assert ws_url("https://h/base/") == "wss://h/base/ws"


def test_failed_episodes_are_unscored_not_zero_and_format_failures_are_counted_apart() -> None:
    reward = EnvironmentReward()
    out = reward(
        ["p"] * 4,
        ["c"] * 4,
        environment_reward=[1.0, None, -1.0, 0.5],
        environment_outcome=["done", "environment_error", "format_failure", "truncated"],
        environment_reason=["", "the environment reported an error: x", "turn 1: no call", "no end"],
        environment_prompt=["p"] * 4,
        environment_episode=["e"] * 4,
    )
    assert out == [1.0, None, -1.0, 0.5]
    assert reward.last.errors == 1 and reward.last.format_failures == 1
    # The environment's failure is not the metric's (metric_error_ratio, MetricErrors, grpo_metric_errors_total).
    assert reward.last.metric_errors == 0 and reward.last.environment_errors == 1


def test_the_sampled_tokens_logprob_is_found_among_top_alternatives() -> None:
    assert sampled_logprobs([7, 8], [[-0.5], [-1.5]], None) == [-0.5, -1.5]
    assert sampled_logprobs([7], [[-0.1, -2.0]], [[3, 7]]) == [-2.0]
    assert math.isnan(sampled_logprobs([7], [[None]], None)[0])


def test_kubectl_grpo_status_shows_the_last_steps_episodes() -> None:
    from grpo_operator.kubectl_plugin import render

    status = {
        "phase": "Running",
        "progress": {"step": 3, "totalSteps": 10, "display": "3/10"},
        "episodes": {
            "count": 32,
            "turnsMean": 2.75,
            "tokensMean": 51.5,
            "environmentErrorRatio": 0.03125,
            "truncatedRatio": 0.5,
            "formatFailureRatio": 0.0,
        },
    }
    text = render.status_text({"name": "j", "namespace": "ns", "status": status})
    line = next(x for x in text.splitlines() if x.startswith("Episodes"))
    assert "32 last step, 2.75 turns and 51.5 tokens each" in line, line
    assert "environment failed 3.1%" in line and "truncated 50.0%" in line, line


def test_a_metric_beside_the_environment_scores_final_answers_and_fails_apart() -> None:
    """spec.metric with spec.environment: the metric sees each scored episode's last model turn and its
    dataset row; the reward is the environment's plus the metric's, the environment's part named; a
    malformed final answer is the model's format failure, a metric that cannot score leaves the episode
    unscored and counted as the metric's error; an episode the environment failed never reaches the metric."""
    from grpo_metric import FormatFailure, MetricServer
    from grpo_trainer.metric_client import ClientSettings, MetricClient
    from grpo_trainer.reward import MetricReward

    seen: list[tuple[str, str]] = []

    def score(example: dict[str, Any], completion: str) -> dict[str, float]:
        seen.append((completion, example["answer"]))
        if completion == "garbled":
            raise FormatFailure("no number")
        if completion == "crash":
            raise RuntimeError("boom")
        return {"correct": float(completion.strip() == example["answer"])}

    with MetricServer(score) as server:
        client = MetricClient(
            ClientSettings(url=server.url, batch_size=8, concurrency=1, timeout_seconds=5, max_retries=0)
        )
        try:
            reward = EnvironmentReward(MetricReward(client, format_failure_score=-1.0))
            out = reward(
                ["p"] * 5,
                ["c"] * 5,
                answer=["7", "7", "7", "7", "7"],
                environment_reward=[0.25, 0.0, None, 0.5, 0.0],
                environment_outcome=["done", "truncated", "environment_error", "done", "done"],
                environment_reason=["", "no end", "the environment did not answer", "", ""],
                environment_prompt=["p"] * 5,
                environment_episode=["e"] * 5,
                environment_final_answer=["7", "8", "7", "garbled", "crash"],
            )
        finally:
            client.close()
    assert out == [1.25, 0.0, None, -1.0, None]
    assert sorted(seen) == sorted([("7", "7"), ("8", "7"), ("garbled", "7"), ("crash", "7")])
    results = reward.last.results
    assert results[0].components == {"environment": 0.25, "correct": 1.0}
    assert results[3].kind == "format_failure" and "malformed" in results[3].reason
    assert results[4].kind == "error" and "metric service" in results[4].reason
    assert results[2].kind == "error" and "did not answer" in results[2].reason
    assert reward.metric_errors == 1 and reward.last.errors == 2
    # Only the metric's failure is the metric's: the environment's is counted apart.
    assert reward.last.metric_errors == 1 and reward.last.environment_errors == 1
