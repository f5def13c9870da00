"""The trainer's checks of what the rollout gateway hands it, and of the completion requests its policy
server takes (pure code: no model, no training)."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
from grpo_trainer.gateway_client import GatewayClient, GatewayProtocolError, GatewayUnavailable, parse_groups
from grpo_trainer.policy_server import BadRequest, cut_at_stop, sampling_of

from tests.trainer.gateway_double import GatewayDouble


def item(reward: Any = 0.5, content: Any = "aa") -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "q1:"}],
        "completion": {"role": "assistant", "content": content},
        "reward": reward,
    }


def answer(groups: list[list[dict[str, Any]]], step: int = 3) -> dict[str, Any]:
    return {"step": step, "groups": [{"batch_id": i, "items": g} for i, g in enumerate(groups)]}


def test_well_formed_groups_are_parsed_in_order() -> None:
    parsed = parse_groups(answer([[item(0.1), item(0.2)], [item(1), item(2)]]), 3, count=2, group_size=2)
    assert [[r.reward for r in g.rollouts] for g in parsed.groups] == [[0.1, 0.2], [1.0, 2.0]]
    assert parsed.groups[0].rollouts[0].messages == [{"role": "user", "content": "q1:"}]
    assert parsed.groups[0].rollouts[0].completion == "aa" and parsed.stop is None


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([[item(), item(), item()], [item(), item()]], "has 3 items, but spec.grpo.groupSize is 2"),
        ([[item(), item()]], "needs spec.grpo.promptsPerStep = 2 groups, the gateway sent 1"),
        ([[item(), item(math.inf)], [item(), item()]], "item 1.reward must be a finite number"),
        ([[item(), item(True)], [item(), item()]], "item 1.reward must be a finite number"),
        ([[item(), item(content=3)], [item(), item()]], "item 1.completion must be"),
    ],
)
def test_groups_that_cannot_be_trained_on_are_refused_naming_the_problem(
    groups: list[list[dict[str, Any]]], message: str
) -> None:
    with pytest.raises(GatewayProtocolError, match=message.replace(".", r"\.")):
        parse_groups(answer(groups), 3, count=2, group_size=2)


def test_an_answer_for_another_step_is_refused() -> None:
    with pytest.raises(GatewayProtocolError, match="asked for the groups of step 4"):
        parse_groups(answer([[item(), item()]], step=3), 4, count=1, group_size=2)


def test_waiting_for_the_client_is_reported_and_cleared() -> None:
    seen: list[str | None] = []
    with GatewayDouble() as gateway:
        client = GatewayClient(gateway.url, attempt=0, group_size=2, prompts_per_step=1, wait_seconds=0.2)
        client.on_wait = seen.append
        gateway.stop("terminate")
        assert client.groups(1).stop == "terminate"
        gateway.stop_kind = None
        threading.Timer(0.5, lambda: gateway.submit([item(), item()])).start()
        assert len(client.groups(1).groups) == 1
    assert seen[-2:] == ["client", None]


def test_an_unreachable_gateway_is_reported_as_such() -> None:
    seen: list[str | None] = []
    client = GatewayClient(
        "http://127.0.0.1:9", attempt=0, group_size=2, prompts_per_step=1, unreachable_timeout_seconds=0.5
    )
    client.on_wait, client.sleep = seen.append, lambda _: None
    with pytest.raises(GatewayUnavailable, match="has not answered /internal/v1/groups"):
        client.groups(1)
    assert seen == ["gateway", None]


def test_completion_requests_are_capped_at_max_completion_length() -> None:
    s = sampling_of({"max_completion_tokens": 500, "n": 3, "temperature": 0, "stop": "\n"}, 8, 1.0, 1.0)
    assert (s.max_tokens, s.n, s.temperature, s.stop) == (8, 3, 0.0, ["\n"])
    assert sampling_of({}, 8, 0.7, 0.9).max_tokens == 8
    assert sampling_of({}, 8, 0.7, 0.9).temperature == 0.7
    with pytest.raises(BadRequest, match="n must be"):
        sampling_of({"n": 0}, 8, 1.0, 1.0)
    assert cut_at_stop("abc\ndef", ["\n"]) == ("abc", True)
    assert cut_at_stop("abc", ["x"]) == ("abc", False)


def test_the_trainer_sends_the_internal_secret_the_real_gateway_requires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.harness.gateway import RunningGateway, gateway_config

    monkeypatch.setenv("GRPO_GATEWAY_INTERNAL_TOKEN", "inner")
    config = gateway_config(prompts_per_step=1, internal_token_env="GRPO_GATEWAY_INTERNAL_TOKEN")
    with RunningGateway(config) as gw:
        url = gw.internal_url
        client = GatewayClient(url, attempt=1, group_size=4, prompts_per_step=1, wait_seconds=0.1)
        client.progress(1, {"name": "step-1", "step": 1, "dir": "/c"}, "training")
        status = gw.arbor("status", {}).json()
        assert status["last_checkpoint"] == "step-1"
        monkeypatch.delenv("GRPO_GATEWAY_INTERNAL_TOKEN")
        stranger = GatewayClient(url, attempt=1, group_size=4, prompts_per_step=1, wait_seconds=0.1)
        with pytest.raises(GatewayProtocolError, match="refused /internal/v1/groups with 403"):
            stranger.groups(1)
