"""The rules of asynchronous GRPO's rollout producer (grpo_trainer/async_rollouts.py), on its own thread with
a sampler that records what it was asked and when: nothing is sampled beyond the bound on staleness, no
request runs during a weight push, each step's groups carry the version they were sampled with, and what
cannot be trained (too stale, other prompts, a failed request) is handed back to be sampled anew."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from grpo_trainer.async_rollouts import Payload, RolloutProducer


class Sampler:
    """Answers each request with its prompts, after ``delay`` seconds; records (prompts, version served,
    whether a push was under way) for each request it ran."""

    def __init__(self, delay: float = 0.05) -> None:
        self.delay = delay
        self.calls: list[tuple[list[list[int]], int, bool]] = []
        self.served = 0
        self.pushing = False
        self.fail_next = False
        self.release = threading.Event()
        self.release.set()

    def __call__(self, prompts: list[list[int]]) -> Payload:
        self.calls.append((prompts, self.served, self.pushing))
        self.release.wait(5)
        time.sleep(self.delay)
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("vLLM went away")
        return (prompts, [[1, 2]] * len(prompts), [[[-0.5]] * 2] * len(prompts), None)


def prompts(step: int) -> list[list[int]]:
    return [[step, 1], [step, 2]]


def push(producer: RolloutProducer, sampler: Sampler, version: int) -> None:
    """A weight push as the trainer makes it: the sampler serves ``version`` afterwards."""
    with producer.pushing(version=version):
        sampler.pushing = True
        time.sleep(0.02)
        sampler.served = version
        sampler.pushing = False


@pytest.fixture
def sampler() -> Sampler:
    return Sampler()


def make(sampler: Sampler, eta: int) -> RolloutProducer:
    return RolloutProducer(sampler, max_staleness=eta)


def test_nothing_is_sampled_before_the_first_push(sampler: Sampler) -> None:
    producer = make(sampler, 1)
    producer.submit(1, prompts(1))
    time.sleep(0.2)
    assert sampler.calls == []  # what the server serves is unknown until the trainer pushed its weights
    push(producer, sampler, 0)
    taken = producer.take(1, prompts(1))
    assert taken.rollout is not None and taken.rollout.version == 0 and taken.staleness == 0
    producer.close()


def test_sampling_runs_ahead_by_at_most_eta_steps(sampler: Sampler) -> None:
    producer = make(sampler, 2)
    for step in range(1, 7):
        producer.submit(step, prompts(step))
    push(producer, sampler, 0)
    time.sleep(0.6)
    # With version 0 served, steps 1..3 train on version <= 2: within eta 2. Step 4 would be 3 stale.
    assert [c[0][0][0] for c in sampler.calls] == [1, 2, 3]
    assert producer.take(3, prompts(3)).staleness == 2
    push(producer, sampler, 1)
    time.sleep(0.3)
    assert [c[0][0][0] for c in sampler.calls] == [1, 2, 3, 4]
    taken = producer.take(4, prompts(4))
    assert (taken.rollout.version if taken.rollout else None, taken.staleness) == (1, 2)
    producer.close()


def test_a_push_waits_for_the_request_in_flight_and_none_starts_during_it(sampler: Sampler) -> None:
    producer = make(sampler, 1)
    push(producer, sampler, 0)
    sampler.release.clear()  # the next request hangs in vLLM until released
    producer.submit(1, prompts(1))
    producer.submit(2, prompts(2))
    time.sleep(0.1)
    pushed = threading.Event()

    def trainer() -> None:
        push(producer, sampler, 1)
        pushed.set()

    threading.Thread(target=trainer).start()
    time.sleep(0.2)
    assert not pushed.is_set()  # it waits for step 1's request, which started on version 0
    sampler.release.set()
    assert pushed.wait(5)
    one = producer.take(1, prompts(1))
    two = producer.take(2, prompts(2))
    assert one.rollout is not None and one.rollout.version == 0
    # Step 2 could start at version 0 (1 stale at training), but waited while the push ran, then started on 1.
    assert two.rollout is not None and two.rollout.version in (0, 1)
    assert all(not during_push for _, _, during_push in sampler.calls)
    # Every request's stamp is the version the sampler served when the request ran.
    assert [c[1] for c in sampler.calls] == [one.rollout.version, two.rollout.version]
    producer.close()


def test_sampling_resumes_once_the_weights_are_in_while_the_rest_of_the_push_runs(sampler: Sampler) -> None:
    """The served-model probe runs after the weights are in place and changes none: requests may start
    during it, stamped with the version just pushed."""
    producer = make(sampler, 1)
    push(producer, sampler, 0)
    with producer.pushing(version=1):
        sampler.served = 1  # the weights of version 1 are in
        producer.submit(2, prompts(2))
        time.sleep(0.2)
        assert sampler.calls == []  # nothing starts before the weights are in
        producer.pushed(1)
        taken = producer.take(2, prompts(2))  # sampled while the block (the probe) still runs
    assert taken.rollout is not None and taken.rollout.version == 1 and taken.staleness == 0
    assert [c[1] for c in sampler.calls] == [1]
    producer.close()


def test_the_bound_is_checked_again_when_groups_are_taken(sampler: Sampler) -> None:
    producer = make(sampler, 2)
    push(producer, sampler, 0)
    producer.submit(3, prompts(3))
    time.sleep(0.2)
    assert len(sampler.calls) == 1  # step 3 at version 0: 2 stale at training, within eta 2
    producer.max_staleness = 1  # the check at take time does not trust the one before sampling
    taken = producer.take(3, prompts(3))
    assert taken.rollout is None and taken.dropped == "stale" and taken.staleness == 2
    producer.close()


def test_groups_for_other_prompts_or_a_failed_request_are_handed_back(sampler: Sampler) -> None:
    producer = make(sampler, 1)
    push(producer, sampler, 0)
    producer.submit(1, prompts(1))
    taken = producer.take(1, [[9, 9]])
    assert taken.rollout is None and taken.dropped == "other_prompts"

    sampler.fail_next = True
    producer.submit(2, prompts(2))
    producer.submit(3, prompts(3))
    taken = producer.take(2, prompts(2))
    assert taken.rollout is None and taken.dropped == "request_failed" and "vLLM went away" in taken.detail
    # After a failure nothing more is sampled until the trainer's own request has recovered the server.
    time.sleep(0.2)
    assert len(sampler.calls) == 2
    push(producer, sampler, 1)
    taken = producer.take(3, prompts(3))
    assert taken.rollout is not None and taken.rollout.version == 1
    producer.close()


def test_the_overlap_clock_counts_only_time_spent_sampling(sampler: Sampler) -> None:
    sampler.delay = 0.3
    producer = make(sampler, 1)
    start = time.monotonic()
    push(producer, sampler, 0)
    producer.submit(1, prompts(1))
    producer.take(1, prompts(1))
    end = time.monotonic()
    busy = producer.clock.overlap(start, end)
    assert 0.25 < busy <= end - start
    assert producer.clock.overlap(end + 1, end + 2) == 0.0
    producer.close()


def test_eta_0_never_starts_a_producer() -> None:
    def never(_: Any) -> Payload:
        raise AssertionError("sampled")

    with pytest.raises(ValueError, match="maxStaleness >= 1"):
        RolloutProducer(never, max_staleness=0)


def test_a_request_waiting_on_a_push_is_stamped_with_the_version_pushed(sampler: Sampler) -> None:
    """The version changes inside the push's lock: the request that starts the moment the push ends is
    stamped with the weights it samples from, never with the ones they replaced."""
    producer = make(sampler, 2)
    push(producer, sampler, 0)
    producer.submit(1, prompts(1))
    assert producer.take(1, prompts(1)).rollout is not None
    with producer.pushing(version=1):
        producer.submit(2, prompts(2))  # startable under either version: only the push holds it back
        time.sleep(0.1)
        assert len(sampler.calls) == 1
        sampler.served = 1
    taken = producer.take(2, prompts(2))
    assert taken.rollout is not None and taken.rollout.version == 1 == sampler.calls[-1][1]
    # A push that fails serves nothing new: the version stays.
    with pytest.raises(RuntimeError), producer.pushing(version=2):
        raise RuntimeError("the push broke")
    assert producer.version == 1
    producer.close()
