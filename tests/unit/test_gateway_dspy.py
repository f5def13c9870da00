"""The real clients against the rollout gateway: DSPy 3.4.1's ``GRPO`` optimizer driving arbor-ai 0.2.17's
``ArborProvider`` (initialize, status, step, terminate, and completions through the LM), with trainer
rank 0 played by test code that calls the internal routes as the gateway's contract says.

Needs the ``dspy`` extra (dspy==3.4.1, arbor-ai==0.2.17 without its dependencies); skipped without it.
Only ``arbor.integrations.dspy`` is imported: ``arbor/__init__`` pulls in Arbor's whole server (torch,
vLLM, uvicorn), which the client side does not need.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import sys
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.gateway import MODEL, RunningGateway, gateway_config

# DSPy fetches LiteLLM's model-cost table from the internet on first use unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
dspy = pytest.importorskip("dspy", reason="the dspy extra is not installed")


@functools.cache
def arbor_provider() -> Any:
    """arbor.integrations.dspy.ArborProvider, without executing arbor/__init__ (or arbor/integrations')."""
    spec = importlib.util.find_spec("arbor")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("arbor-ai is not installed")
    for name, path in (("arbor", list(spec.submodule_search_locations)), ("arbor.integrations", None)):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = path or [os.path.join(spec.submodule_search_locations[0], "integrations")]
            sys.modules[name] = module
    return importlib.import_module("arbor.integrations.dspy.arbor_provider").ArborProvider


G, B, S = 4, 2, 3


class AddTwo(dspy.Signature):  # type: ignore[misc,name-defined]
    """Add two to the number."""

    number: int = dspy.InputField()
    answer: int = dspy.OutputField()


def policy_answer(body: dict[str, Any]) -> str:
    """The policy's reply, in the chat adapter's field format: right for even numbers, off by one for odd
    ones, so groups carry different rewards; every eighth reply cannot be parsed (a format failure)."""
    prompt = body["messages"][-1]["content"]
    number = int(re.findall(r"-?\d+", prompt.split("number ## ]]")[-1])[0])
    policy_answer.calls += 1  # type: ignore[attr-defined]
    if policy_answer.calls % 8 == 0:  # type: ignore[attr-defined]
        return "I am not sure."
    guess = number + 2 if number % 2 == 0 else number + 3
    return f"[[ ## answer ## ]]\n{guess}\n\n[[ ## completed ## ]]"


policy_answer.calls = 0  # type: ignore[attr-defined]


class Trainer:
    """Trainer rank 0's side of the contract: for k = 1..S, pull step k's B groups (long poll), 'train',
    report progress with a checkpoint every other step; stop when the gateway says so."""

    def __init__(self, gw: RunningGateway, die_in_step: int | None = None) -> None:
        self.gw = gw
        self.die_in_step = die_in_step
        self.attempt = 1
        self.replayed: list[int] = []
        self.steps: dict[int, list[dict[str, Any]]] = {}
        self.stop: str | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            step = 1
            while step <= S:
                answer = self.gw.groups(step, attempt=self.attempt, wait_seconds=2)
                if answer.get("stop"):
                    self.stop = answer["stop"]
                    break
                if not answer["groups"]:
                    continue
                if step in self.steps:
                    assert answer["groups"] == self.steps[step], "a resumed trainer must get the same groups"
                    self.replayed.append(step)
                self.steps[step] = answer["groups"]
                if step == self.die_in_step and self.attempt == 1:
                    self._die_and_resume(from_checkpoint=step - 1)
                    continue  # resume at the checkpoint's step + 1: this step again
                self.gw.progress(step, attempt=self.attempt, checkpoint=step if step % 2 == 0 else None)
                step += 1
            self.gw.progress(
                len(self.steps), attempt=self.attempt, checkpoint=len(self.steps), state="finished"
            )
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def _die_and_resume(self, from_checkpoint: int) -> None:
        """SIGKILL in the middle of a step: the policy server is gone for a while (the client's completions
        wait at the gateway), then attempt 2 starts from the last checkpoint."""
        self.gw.stop_policy()
        time.sleep(2.0)
        self.attempt = 2
        self.gw.start_policy(policy_answer)
        self.gw.progress(from_checkpoint, attempt=self.attempt)


@pytest.fixture
def gw() -> Iterator[RunningGateway]:
    with RunningGateway(gateway_config(group_size=G, prompts_per_step=B, steps=S)) as running:
        running.start_policy(policy_answer)
        yield running


def metric(example: Any, prediction: Any, trace: Any = None) -> float:
    return 1.0 if int(prediction.answer) == example.number + 2 else 0.0


# With and without the trailing slash: the provider joins routes with urljoin, which drops a last path
# segment not ending in "/", so the second sends the fine-tuning routes to /fine_tuning/grpo/... .
@pytest.mark.parametrize("base", ["/v1/", "/v1"])
def test_dspy_grpo_trains_through_the_gateway_from_initialize_to_terminate(
    gw: RunningGateway, base: str
) -> None:
    provider = arbor_provider()
    lm = dspy.LM(
        f"openai/arbor:{MODEL}",
        provider=provider(),
        api_base=f"{gw.client_url}{base}",
        api_key="anything",
        temperature=1.0,
        cache=False,
    )
    adapter = dspy.ChatAdapter()
    dspy.configure(adapter=adapter)
    program = dspy.Predict(AddTwo)
    program.set_lm(lm)
    trainset = [dspy.Example(number=n).with_inputs("number") for n in range(10)]
    # dspy 3.4.1 does not export GRPO at the top level.
    from dspy.teleprompt.grpo import GRPO

    optimizer = GRPO(
        metric=metric,
        num_train_steps=S,
        num_dspy_examples_per_grpo_step=B,
        num_rollouts_per_grpo_step=G,
        exclude_demos=True,
        adapter=adapter,
        num_threads=2,
        failure_score=0.0,
        format_failure_score=-1.0,
    )
    trainer = Trainer(gw)
    trainer.thread.start()
    optimizer.compile(program, trainset=trainset)
    trainer.thread.join(30)
    assert trainer.error is None, trainer.error
    # Every step trained B groups of G scored completions of the client's, each group one prompt.
    assert sorted(trainer.steps) == [1, 2, 3]
    for groups in trainer.steps.values():
        assert len(groups) == B and all(len(g["items"]) == G for g in groups)
        for g in groups:
            prompts = {item["messages"][-1]["content"] for item in g["items"]}
            assert len(prompts) == 1
    rewards = [item["reward"] for groups in trainer.steps.values() for g in groups for item in g["items"]]
    assert set(rewards) <= {1.0, 0.0, -1.0} and 1.0 in rewards and 0.0 in rewards
    # DSPy sampled through the gateway (the model it names is the job's) and finished with terminate.
    assert len(gw.policy.requests) >= S * B * G  # type: ignore[union-attr]
    assert {r["model"].removeprefix("arbor:") for r in gw.policy.requests} == {MODEL}  # type: ignore[union-attr]
    assert lm.model == f"openai/arbor:{MODEL}"
    final = gw.arbor("status", {"job_id": "team-a/dspy"}).json()
    assert final["status"] == "succeeded" and final["last_checkpoint"] == "step-3"


def test_dspy_survives_a_trainer_killed_mid_step(gw: RunningGateway) -> None:
    """The trainer dies in step 2 and attempt 2 resumes after step 1: DSPy's rollouts meanwhile wait at the
    gateway instead of failing, and the resumed trainer trains step 2 on the same groups (replay)."""
    lm = dspy.LM(
        f"openai/arbor:{MODEL}",
        provider=arbor_provider()(),
        api_base=f"{gw.client_url}/v1/",
        api_key="x",
        cache=False,
    )
    adapter = dspy.ChatAdapter()
    dspy.configure(adapter=adapter)
    program = dspy.Predict(AddTwo)
    program.set_lm(lm)
    from dspy.teleprompt.grpo import GRPO

    optimizer = GRPO(
        metric=metric,
        num_train_steps=S,
        num_dspy_examples_per_grpo_step=B,
        num_rollouts_per_grpo_step=G,
        exclude_demos=True,
        adapter=adapter,
        num_threads=2,
    )
    trainer = Trainer(gw, die_in_step=2)
    trainer.thread.start()
    optimizer.compile(program, trainset=[dspy.Example(number=n).with_inputs("number") for n in range(10)])
    trainer.thread.join(30)
    assert trainer.error is None, trainer.error
    assert trainer.replayed == [2] and sorted(trainer.steps) == [1, 2, 3]
    final = gw.arbor("status", {"job_id": "team-a/dspy"}).json()
    assert final["status"] == "succeeded"


def test_dspy_trains_through_a_gateway_that_requires_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """With tokenSecretRef set every route needs the token; DSPy sends it on all of them when api_base
    carries it in its path (Arbor's provider sends no headers of its own)."""
    monkeypatch.setenv("GRPO_ROLLOUTS_TOKEN", "s3cret")
    config = gateway_config(group_size=G, prompts_per_step=B, steps=S, token_env="GRPO_ROLLOUTS_TOKEN")
    with RunningGateway(config) as gw:
        gw.start_policy(policy_answer)
        base = f"{gw.client_url}/t/s3cret/v1/"
        lm = dspy.LM(
            f"openai/arbor:{MODEL}", provider=arbor_provider()(), api_base=base, api_key="s3cret", cache=False
        )
        adapter = dspy.ChatAdapter()
        dspy.configure(adapter=adapter)
        program = dspy.Predict(AddTwo)
        program.set_lm(lm)
        from dspy.teleprompt.grpo import GRPO

        optimizer = GRPO(
            metric=metric,
            num_train_steps=S,
            num_dspy_examples_per_grpo_step=B,
            num_rollouts_per_grpo_step=G,
            exclude_demos=True,
            adapter=adapter,
            num_threads=2,
        )
        trainer = Trainer(gw)
        trainer.thread.start()
        optimizer.compile(program, trainset=[dspy.Example(number=n).with_inputs("number") for n in range(10)])
        trainer.thread.join(30)
        assert trainer.error is None, trainer.error
        assert sorted(trainer.steps) == [1, 2, 3]
        assert gw.arbor("status", {"job_id": "team-a/dspy"}, token="s3cret").json()["status"] == "succeeded"
        # Without the token in api_base, the provider's first call is refused.
        anonymous = gw.arbor("initialize", {"model": MODEL})
        assert anonymous.status_code == 401
