"""The asynchronous producer's group-by-group sampling (grpo_trainer/group_sampling.py), with a generator that
answers each group when the test releases it: the step's payload is assembled in group order whatever order
groups come back in, every group is stamped with the version that sampled it, a push that interrupts a
step keeps only the groups complete before it began and has the others sampled again on the new weights, and scores streamed
per group travel with the step. tests/trainer/test_vllm_weight_sync.py runs the same against real vLLM."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from grpo_trainer.async_rollouts import RolloutProducer
from grpo_trainer.group_sampling import GroupResult, GroupSampler, Interrupted, SampledStep, StepRequest

G = 2


class Groups:
    """Answers a group's request once ``release(prompt's first token)`` was called (or at once when
    ``auto``); records which groups it was asked for, under which served version."""

    def __init__(self, auto: bool = False) -> None:
        self.auto = auto
        self.version = 0
        self.asked: list[tuple[int, int]] = []
        self._gates: dict[int, threading.Event] = {}
        self._lock = threading.Lock()

    def gate(self, group: int) -> threading.Event:
        with self._lock:
            return self._gates.setdefault(group, threading.Event())

    def release(self, group: int) -> None:
        self.gate(group).set()

    def __call__(self, prompt: list[int]) -> dict[str, Any]:
        group = prompt[0]
        self.asked.append((group, self.version))
        if not self.auto:
            assert self.gate(group).wait(5), f"group {group} never released"
        version = self.version
        return {
            "prompt_ids": [prompt],
            "completion_ids": [[group, version, k] for k in range(G)],
            "logprobs": [[[-0.1 * k]] for k in range(G)],
            "logprob_token_ids": [[[k]] for k in range(G)],
        }


def sampler_for(groups: Groups, score: bool = False) -> GroupSampler:
    def score_group(request: StepRequest, group: int, result: GroupResult) -> list[Any]:
        return [("key", f"score {group}/{k}") for k in range(len(result.completion_ids))]

    return GroupSampler(
        groups, version=lambda: groups.version, server_urls=lambda: [], concurrency=8,
        score_group=score_group if score else None,
    )  # fmt: skip


def request(count: int) -> StepRequest:
    prompts = [[g, 7] for g in range(count)]
    rows = [{"row": g} for g in range(count) for _ in range(G)]
    return StepRequest(prompts, row_prompts=[f"p{g}" for g in range(count) for _ in range(G)], rows=rows)


def wait_until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_groups_come_back_in_any_order_and_are_assembled_in_step_order_with_their_scores() -> None:
    groups = Groups()
    sampler = sampler_for(groups, score=True)
    out: list[SampledStep] = []
    thread = threading.Thread(target=lambda: out.append(sampler(request(3))))
    thread.start()
    for g in (2, 0, 1):
        groups.release(g)
    thread.join(5)
    (step,) = out
    prompts, completions, logprobs, token_ids = step.payload
    assert prompts == [[0, 7], [1, 7], [2, 7]]
    assert completions == [[g, 0, k] for g in range(3) for k in range(G)]
    assert len(logprobs) == len(token_ids) == 3 * G
    assert step.versions == [0, 0, 0] and step.resampled == 0
    # The scores may still be under way when the step is handed on; its take waits for them.
    step.finish_scoring()
    assert step.scoring is None
    assert step.scores == [("key", f"score {g}/{k}") for g in range(3) for k in range(G)]


def test_a_push_keeps_the_groups_done_before_it_and_resamples_the_others_on_the_new_weights() -> None:
    groups = Groups()
    sampler = sampler_for(groups)
    step = request(4)
    errors: list[BaseException] = []

    def first_call() -> None:
        try:
            sampler(step)
        except Interrupted as exc:
            errors.append(exc)

    thread = threading.Thread(target=first_call)
    thread.start()
    groups.release(1)
    groups.release(3)
    wait_until(lambda: 1 in step.results and 3 in step.results)
    assert sampler.interrupt() is True  # the push begins: groups 0 and 2 are in flight
    groups.release(0)  # answers after the push began: possibly aborted midway, so not kept
    groups.release(2)
    thread.join(5)
    assert errors and isinstance(errors[0], Interrupted)
    assert sorted(step.results) == [1, 3] and step.resampled == 2

    groups.version = 1  # the push is done
    sampled = sampler(step)
    # Only the groups missing were asked for again, under version 1; groups 1 and 3 kept version 0.
    assert sorted(a for a in groups.asked if a[1] == 1) == [(0, 1), (2, 1)]
    assert sampled.versions == [1, 0, 1, 0]
    assert sampled.payload[1][G : 2 * G] == [[1, 0, k] for k in range(G)]
    assert sampled.resampled == 2


def test_interrupt_outside_a_call_does_nothing() -> None:
    groups = Groups(auto=True)
    sampler = sampler_for(groups)
    assert sampler.interrupt() is False
    assert sampler(request(2)).versions == [0, 0]


def test_a_push_interrupts_a_later_step_than_the_next_and_waits_for_the_next() -> None:
    groups = Groups()
    sampler = sampler_for(groups)
    producer = RolloutProducer(sampler, max_staleness=2, interrupt=sampler.interrupt)

    def push_in_background(version: int) -> threading.Event:
        pushed = threading.Event()

        def push() -> None:
            with producer.pushing(version=version):
                groups.version = version
            pushed.set()

        threading.Thread(target=push).start()
        return pushed

    try:
        with producer.pushing(version=0):
            pass
        # Step 1 is the next step the trainer takes after version 0: a push of version 0 again waits.
        step1 = request(2)
        producer.submit(1, step1.prompts, request=step1)
        wait_until(lambda: sorted(g for g, _ in groups.asked) == [0, 1])
        pushed = push_in_background(0)
        assert not pushed.wait(0.3), "a push interrupted the groups the trainer takes next"
        groups.release(0)
        groups.release(1)
        assert pushed.wait(5) and producer.interrupted == 0
        assert producer.take(1, step1.prompts).rollout is not None

        # Step 3 is two steps ahead of version 1: the push of version 1 does not wait for it.
        groups.asked.clear()
        step3 = request(2)
        for g in (0, 1):
            groups.gate(g).clear()
        producer.submit(3, step3.prompts, request=step3)
        groups.release(0)
        wait_until(lambda: 0 in step3.results)
        assert push_in_background(1).wait(5), "the push waited for a later step's group"
        assert producer.interrupted == 1
        groups.release(1)
        taken = producer.take(3, step3.prompts)
        assert taken.rollout is not None
        assert taken.rollout.payload.versions == [0, 1]
        # The step is as old as its oldest group: staleness (3 - 1) - 0.
        assert (taken.rollout.version, taken.staleness) == (0, 2)
    finally:
        producer.close()


@pytest.mark.parametrize("fail_group", [0, 1])
def test_a_group_whose_request_fails_fails_the_step(fail_group: int) -> None:
    def generate(prompt: list[int]) -> dict[str, Any]:
        if prompt[0] == fail_group:
            raise ConnectionError("vLLM went away")
        return Groups(auto=True)(prompt)

    sampler = GroupSampler(generate, version=lambda: 0, server_urls=lambda: [], concurrency=4)
    with pytest.raises(ConnectionError):
        sampler(request(2))
