"""Client rollouts trained on what was sampled: the policy server answers each sample's token ids and
log-probabilities as vLLM does and records them; rank 0 finds each rollout of the client's groups in that
record, and the rollout function hands TRL exactly the sampled ids (or, for text the policy server never
sampled, the text's tokens with NaN log-probabilities, counted)."""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest
from grpo_trainer.client_rollouts import GroupFeed, SampleMatcher, make_rollout_func, prompt_ids
from grpo_trainer.gateway_client import Group, GroupsAnswer, Rollout
from grpo_trainer.policy_server import PolicyServer, Sample, Sampling
from grpo_trainer.sample_book import SampleBook, SampledTokens
from grpo_trainer.tiny import build_tokenizer

CHAT = [{"role": "user", "content": "q1:"}]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


def test_the_book_finds_a_sample_by_prompt_and_text_and_forgets_the_oldest_past_its_bound() -> None:
    book = SampleBook(max_tokens=6)
    book.record([1, 2], "ab", SampledTokens((5, 6, 1), (-0.5, -0.25, -1.0)))
    assert book.lookup([1, 2], "ab") == SampledTokens((5, 6, 1), (-0.5, -0.25, -1.0))
    assert book.lookup([1, 3], "ab") is None and book.lookup([1, 2], "abc") is None
    book.record([1, 2], "cd", SampledTokens((7, 8, 1), None))
    book.record([1, 2], "ef", SampledTokens((9,), None))  # 7 tokens now: "ab" goes
    assert book.lookup([1, 2], "ab") is None
    assert book.lookup([1, 2], "cd") == SampledTokens((7, 8, 1), None) and len(book) == 2


def scripted(tokenizer: Any, texts: list[str], special: bool = False) -> Any:
    """A sampler that answers ``texts`` as sampled: their characters' ids (an <unk> token first when
    ``special``: it decodes to nothing, as a random model's stray special tokens do), EOS, and a
    log-probability per token."""

    def sample(ids: list[int], sampling: Sampling) -> list[Sample]:
        out = []
        for text in texts[: sampling.n]:
            tokens = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            if special:
                tokens = [tokenizer.unk_token_id, *tokens]
            logprobs = tuple(-0.1 * (i + 1) for i in range(len(tokens)))
            out.append(
                Sample(tokenizer.decode(tokens, skip_special_tokens=True), "stop", tuple(tokens), logprobs)
            )
        return out

    return sample


def server(tokenizer: Any, sampler: Any) -> PolicyServer:
    return PolicyServer(
        0, "tiny", tokenizer, sampler, max_completion_length=16, temperature=1.0, top_p=1.0, host="127.0.0.1"
    )


def test_the_policy_server_answers_token_ids_and_logprobs_as_vllm_does(tokenizer: Any) -> None:
    policy = server(tokenizer, scripted(tokenizer, ["ab1"], special=True))
    answer = policy.chat({"messages": CHAT, "logprobs": True, "return_token_ids": True})
    choice = answer["choices"][0]
    sampled = [tokenizer.unk_token_id, *tokenizer("ab1", add_special_tokens=False)["input_ids"]]
    assert choice["message"]["content"] == "ab1"
    assert choice["token_ids"] == [*sampled, tokenizer.eos_token_id]
    assert choice["prompt_token_ids"] == prompt_ids(tokenizer, CHAT)
    content = choice["logprobs"]["content"]
    assert [entry["logprob"] for entry in content] == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5])
    assert "".join(entry["token"] for entry in content[1:4]) == "ab1"
    # Without the request fields the answer is OpenAI's plain one.
    plain = policy.chat({"messages": CHAT})["choices"][0]
    assert plain["logprobs"] is None and "token_ids" not in plain
    text = policy.completions({"prompt": "q1:", "logprobs": 0})["choices"][0]["logprobs"]
    assert text["tokens"][1:4] == ["a", "b", "1"] and text["text_offset"][:4] == [0, 0, 1, 2]
    # Every sample is in the book under the prompt it was sampled from.
    assert policy.book.lookup(prompt_ids(tokenizer, CHAT), "ab1") is not None


def test_a_stop_string_keeps_the_tokens_of_the_text_the_client_got(tokenizer: Any) -> None:
    policy = server(tokenizer, scripted(tokenizer, ["ab#cd"]))
    choice = policy.chat({"messages": CHAT, "stop": ["#"], "return_token_ids": True})["choices"][0]
    assert choice["message"]["content"] == "ab" and choice["finish_reason"] == "stop"
    assert choice["token_ids"] == tokenizer("ab", add_special_tokens=False)["input_ids"]
    found = policy.book.lookup(prompt_ids(tokenizer, CHAT), "ab")
    assert found is not None and found.logprobs == pytest.approx((-0.1, -0.2))
    # A token that shows as nothing (here first) stays with the text it precedes.
    special = server(tokenizer, scripted(tokenizer, ["ab#" + "c" * 500], special=True))
    kept = special.chat({"messages": CHAT, "stop": ["#"], "return_token_ids": True})["choices"][0]
    assert kept["token_ids"] == [
        tokenizer.unk_token_id,
        *tokenizer("ab", add_special_tokens=False)["input_ids"],
    ]


def rollout_of(policy: PolicyServer, tokenizer: Any, texts: list[str]) -> tuple[dict[str, Any], GroupFeed]:
    """What the rollout function hands TRL for one group of ``texts`` sent back by a client."""
    group = Group(0, [Rollout(CHAT, text, 1.0) for text in texts])
    answer = GroupsAnswer(step=1, groups=[group])
    feed = GroupFeed(client=None, world_size=1, match=SampleMatcher(policy.book, tokenizer))
    feed.client = SimpleNamespace(groups=lambda step, should_stop: answer)  # type: ignore[assignment]
    rollout = make_rollout_func(feed, tokenizer, 16, None)
    trainer = SimpleNamespace(
        state=SimpleNamespace(global_step=0), accelerator=SimpleNamespace(num_processes=1, process_index=0)
    )
    return rollout([None] * len(texts), trainer), feed


def test_training_gets_the_sampled_ids_even_where_the_text_tokenises_otherwise(tokenizer: Any) -> None:
    policy = server(tokenizer, scripted(tokenizer, ["ab1", "c"], special=True))
    sampled = policy.chat({"messages": CHAT, "n": 2, "return_token_ids": True})["choices"]
    out, feed = rollout_of(policy, tokenizer, ["ab1", "c", "rewritten"])
    # Byte-equal ids from sampling to what TRL trains on: the <unk> the text does not show included.
    assert out["completion_ids"][:2] == [c["token_ids"] for c in sampled]
    assert out["completion_ids"][0] != tokenizer("ab1", add_special_tokens=False)["input_ids"] + [2]
    assert out["logprobs"][0] == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5])
    # Text the policy server never sampled: its own tokens and EOS, no sampling log-probabilities.
    assert out["completion_ids"][2] == [*tokenizer("rewritten", add_special_tokens=False)["input_ids"], 1]
    assert all(math.isnan(x) for x in out["logprobs"][2])
    assert (feed.matched, feed.unmatched) == (2, 1)


@pytest.mark.parametrize(
    ("per_token", "expected"),
    [
        ([[-0.5], [-1.25]], (-0.5, -1.25)),
        ([[-0.5]], None),  # one number for two tokens
        ([[-0.5], []], None),
        ([[-0.5], [None]], None),
        (None, None),
    ],
)
def test_the_vllm_sampler_keeps_log_probabilities_only_when_each_token_has_one(
    per_token: Any, expected: tuple[float, ...] | None
) -> None:
    from grpo_trainer.policy_server import _sampled_logprobs

    assert _sampled_logprobs(per_token, 2) == expected


def test_a_request_being_answered_when_the_trainer_ends_gets_its_answer(tokenizer: Any) -> None:
    started, release = threading.Event(), threading.Event()
    answer_ab = scripted(tokenizer, ["ab"])

    def slow(ids: list[int], sampling: Sampling) -> list[Sample]:
        started.set()
        release.wait(10)
        return list(answer_ab(ids, sampling))

    policy = server(tokenizer, slow).start()
    replies: list[Any] = []

    def client() -> None:
        body = json.dumps({"model": "tiny", "messages": CHAT}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{policy.port}/v1/chat/completions", data=body, method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            replies.append(json.loads(response.read()))

    thread = threading.Thread(target=client)
    thread.start()
    assert started.wait(10)
    closing = threading.Thread(target=policy.close)
    closing.start()
    time.sleep(1.5)  # past serve_forever's 0.5-s poll: the listener is closed by now
    assert closing.is_alive()  # close() waits for the request it accepted
    release.set()
    closing.join(10)
    thread.join(10)
    assert not closing.is_alive()
    assert replies and replies[0]["choices"][0]["message"]["content"] == "ab"
    # Closed: a new connection is refused rather than accepted and dropped.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{policy.port}/healthz", timeout=2)
