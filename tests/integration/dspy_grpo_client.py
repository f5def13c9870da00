"""The user's side of the DSPy acceptance test, run as its own process (as a notebook would be): DSPy
3.4.1's ``GRPO`` optimizer with arbor-ai 0.2.17's ``ArborProvider``, pointed at a GRPOJob's rollout
gateway. The task suits the tiny character-level model: answer a short prompt with as many ``a`` as
possible (the metric is the share of ``a`` in the answer), so a custom adapter sends the bare prompt and
takes the raw completion as the answer.

    python -m tests.integration.dspy_grpo_client BASE_URL MODEL G B S
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import time
import types
from typing import Any

# DSPy fetches LiteLLM's model-cost table from the internet on first use unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy
from dspy.teleprompt.grpo import GRPO  # dspy 3.4.1 does not export dspy.GRPO

TARGET = "a"


def arbor_provider() -> Any:
    """arbor.integrations.dspy.ArborProvider, without executing arbor/__init__ (Arbor's whole server)."""
    spec = importlib.util.find_spec("arbor")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("arbor-ai is not installed: pip install --no-deps arbor-ai==0.2.17")
    root = next(iter(spec.submodule_search_locations))
    for name, path in (("arbor", root), ("arbor.integrations", os.path.join(root, "integrations"))):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [path]
            sys.modules[name] = module
    return importlib.import_module("arbor.integrations.dspy.arbor_provider").ArborProvider


class Say(dspy.Signature):  # type: ignore[misc,name-defined]
    """Answer the prompt."""

    prompt: str = dspy.InputField()
    answer: str = dspy.OutputField()


class RawAdapter(dspy.ChatAdapter):  # type: ignore[misc,name-defined]
    """The prompt alone as the user message, and the model's raw completion as the answer: the tiny model
    knows only lower-case letters, digits and a little punctuation, not DSPy's field markers. GRPO needs a
    ChatAdapter, and re-renders each rollout with ``format`` and ``format_finetune_data``."""

    def format(
        self, signature: Any, demos: list[dict[str, Any]], inputs: dict[str, Any]
    ) -> list[dict[str, Any]]:
        return [{"role": "user", "content": str(inputs["prompt"])}]

    def parse(self, signature: Any, completion: str) -> dict[str, Any]:
        return {"answer": completion}

    def format_assistant_message_content(
        self, signature: Any, outputs: dict[str, Any], missing_field_message: str | None = None
    ) -> str:
        return str(outputs["answer"])


def share_of_target(example: Any, prediction: Any, trace: Any = None) -> float:
    answer = str(prediction.answer)
    return answer.count(TARGET) / len(answer) if answer else 0.0


def main() -> int:
    base, model, g, b, s = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    started = time.monotonic()
    lm = dspy.LM(
        f"openai/arbor:{model}",
        provider=arbor_provider()(),
        api_base=base,
        api_key="unused",
        temperature=1.0,
        max_tokens=8,
        cache=False,
    )
    adapter = RawAdapter()
    dspy.configure(adapter=adapter)
    program = dspy.Predict(Say)
    program.set_lm(lm)
    trainset = [dspy.Example(prompt=f"q{i}:").with_inputs("prompt") for i in range(10)]
    optimizer = GRPO(
        metric=share_of_target,
        num_rollouts_per_grpo_step=g,
        num_dspy_examples_per_grpo_step=b,
        num_train_steps=s,
        exclude_demos=True,
        adapter=adapter,
        num_threads=4,
        failure_score=0.0,
        format_failure_score=-1.0,
    )
    optimizer.compile(program, trainset=trainset)
    print(json.dumps({"compiled": True, "seconds": round(time.monotonic() - started, 1), "model": lm.model}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
