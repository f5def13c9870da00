"""spec.grpo.preset: what each preset sets, that a knob the spec sets wins, where the resolved values show
(trainer.json, the Created event), and the CRD leaving the preset's knobs without a server-side default."""

from __future__ import annotations

import json
from typing import Any

import pytest
from grpo_operator.api import GRPOJobSpec, GRPOSpec, TrainerConfig, compute_rollouts
from grpo_operator.api.compat import wire_name
from grpo_operator.api.crd import build_crd
from grpo_operator.api.generate import repo_root
from grpo_operator.api.grpo_presets import PRESET_KNOBS, PRESETS
from grpo_trainer.client_rollouts import prompt_ids, render_prompt_text
from grpo_trainer.policy_server import PolicyServer, Sample, Sampling

from tests.unit.manifests import CLIENT, with_changes
from tests.unit.reconcile_world import World, job_object

# What each preset sets, written out: a change to grpo_presets.PRESETS must change this table too.
EXPECTED: dict[str, dict[str, Any]] = {
    "dapo": {
        "loss_type": "dapo",
        "epsilon": 0.2,
        "epsilon_high": 0.28,
        "mask_truncated_completions": True,
        "dynamic_sampling": True,
        "scale_rewards": "group",
        "importance_sampling_level": None,
    },
    "dr-grpo": {
        "loss_type": "dr_grpo",
        "scale_rewards": "none",
        "epsilon": 0.2,
        "epsilon_high": None,
        "mask_truncated_completions": None,
        "dynamic_sampling": False,
        "importance_sampling_level": None,
    },
    "gspo": {
        "importance_sampling_level": "sequence",
        "loss_type": "grpo",
        "epsilon": 3e-4,
        "epsilon_high": 4e-4,
        "scale_rewards": "group",
        "dynamic_sampling": False,
        "mask_truncated_completions": None,
    },
}


def job_spec(changes: dict[str, Any] | None = None) -> GRPOJobSpec:
    return GRPOJobSpec.model_validate(with_changes(changes or {})["spec"])


def grpo(**knobs: Any) -> GRPOSpec:
    return GRPOSpec.model_validate({"groupSize": 4, "promptsPerStep": 2, "steps": 10, **knobs})


@pytest.mark.parametrize("preset", list(PRESETS))
def test_each_preset_resolves_to_its_papers_knobs(preset: str) -> None:
    resolved = grpo(preset=preset).resolved()
    assert {name: getattr(resolved, name) for name in EXPECTED[preset]} == EXPECTED[preset]
    # Resolving again changes nothing: trainer.json, parsed back by the trainer, holds the same values.
    assert resolved.resolved() == resolved


def test_without_a_preset_the_defaults_stay() -> None:
    spec = grpo()
    assert spec.resolved() == spec
    assert (spec.loss_type, spec.epsilon, spec.scale_rewards, spec.dynamic_sampling) == (
        "dapo",
        0.2,
        "group",
        False,
    )
    assert spec.preset_summary() is None


@pytest.mark.parametrize(
    ("preset", "knob", "value"),
    [
        ("dapo", "dynamicSampling", False),
        ("dapo", "epsilonHigh", 0.3),
        ("dapo", "maskTruncatedCompletions", False),
        ("dapo", "lossType", "bnpo"),
        ("dr-grpo", "scaleRewards", "group"),
        ("dr-grpo", "lossType", "dapo"),
        ("gspo", "epsilon", 0.2),
        ("gspo", "importanceSamplingLevel", "token"),
    ],
)
def test_a_knob_the_spec_sets_wins_over_the_preset_even_at_its_default(
    preset: str, knob: str, value: Any
) -> None:
    # Even a value equal to the knob's default wins: the CRD gives these knobs no server-side default, so
    # a knob in the stored spec is one the user wrote.
    knobs: dict[str, Any] = {"preset": preset, knob: value}
    if preset == "gspo" and knob == "epsilon":
        knobs["epsilonHigh"] = 0.28  # else the preset's 4e-4 would be below it (rejected)
    resolved = grpo(**knobs).resolved()
    assert getattr(resolved, next(n for n in GRPOSpec.model_fields if wire_name(n) == knob)) == value
    others = {
        n: v for n, v in EXPECTED[preset].items() if wire_name(n) not in knobs and n in PRESETS[preset].knobs
    }
    assert {n: getattr(resolved, n) for n in others} == others


def test_client_rollouts_leave_out_the_presets_sampling() -> None:
    client = job_spec({**CLIENT, "spec.grpo.preset": "dapo"})
    resolved = client.resolved_grpo()
    assert resolved.dynamic_sampling is False  # the client samples; the rest of DAPO applies
    assert (resolved.loss_type, resolved.epsilon_high, resolved.mask_truncated_completions) == (
        "dapo",
        0.28,
        True,
    )
    assert job_spec({"spec.grpo.preset": "dapo"}).resolved_grpo().dynamic_sampling is True
    assert client.preset_summary() == (
        "preset dapo: lossType=dapo, epsilonHigh=0.28, maskTruncatedCompletions=true, "
        "dynamicSampling=false (the client samples)"
    )


def test_trainer_json_carries_the_resolved_knobs_and_reads_back_the_same() -> None:
    spec = job_spec({"spec.grpo.preset": "dr-grpo", "spec.grpo.epsilonHigh": 0.28})
    config = TrainerConfig.from_spec("ns", "job", None, spec, metric_url="http://m:8080", generation_host="h")
    grpo_json = json.loads(config.dump_json())["grpo"]
    assert {k: grpo_json[k] for k in ("preset", "lossType", "scaleRewards", "epsilonHigh")} == {
        "preset": "dr-grpo",
        "lossType": "dr_grpo",
        "scaleRewards": "none",
        "epsilonHigh": 0.28,
    }
    assert TrainerConfig.model_validate_json(config.dump_json()).grpo == config.grpo
    # A trainer.json written by hand with only the preset resolves the same way when the trainer loads it.
    hand = json.loads(config.dump_json())
    for key in ("lossType", "scaleRewards"):
        del hand["grpo"][key]
    assert TrainerConfig.model_validate(hand).grpo.loss_type == "dr_grpo"


def test_the_created_event_names_what_the_preset_set() -> None:
    world = World(job_object(grpo={"preset": "gspo", "numIterations": 2}))
    created = next(e for e in world.reconcile().events if e.reason == "Created")
    assert created.message.endswith(
        "; preset gspo: importanceSamplingLevel=sequence, lossType=grpo, epsilon=0.0003, epsilonHigh=0.0004"
    )
    plain = next(e for e in World(job_object()).reconcile().events if e.reason == "Created")
    assert "preset" not in plain.message


def test_the_crd_leaves_exactly_the_presets_defaulted_knobs_without_a_default() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    grpo_props = schema["properties"]["spec"]["properties"]["grpo"]["properties"]
    no_default = {
        name for name, field in GRPOSpec.model_fields.items() if "default" not in grpo_props[wire_name(name)]
    }
    defaulted_knobs = {name for name in PRESET_KNOBS if GRPOSpec.model_fields[name].default is not None}
    assert defaulted_knobs == {"loss_type", "scale_rewards", "epsilon", "dynamic_sampling"}
    # Without a default in the CRD: the required fields, the optional (None) ones, and the preset's knobs.
    expected = {
        name
        for name, field in GRPOSpec.model_fields.items()
        if field.is_required() or field.default is None or name in defaulted_knobs
    }
    assert no_default == expected
    assert "x-grpo" not in json.dumps(schema)  # the generator's marker never reaches the API server


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        (
            {"spec.grpo.preset": "dapo", "spec.grpo.epsilon": 0.3},
            "spec.grpo.epsilonHigh must be >= spec.grpo.epsilon",
        ),
        (
            {"spec.grpo.preset": "gspo", "spec.grpo.epsilon": 0.1},
            "spec.grpo.epsilonHigh must be >= spec.grpo.epsilon",
        ),
        ({"spec.grpo.lossType": "luspo"}, "set spec.grpo.importanceSamplingLevel: sequence"),
        ({"spec.grpo.lossType": "vespo"}, "token_truncate or token_mask"),
        ({**CLIENT, "spec.grpo.numIterations": 3}, "numIterations > 1 is not supported"),
        ({**CLIENT, "spec.grpo.repetitionPenalty": 1.1}, "the client samples"),
    ],
)
def test_resolved_values_are_checked_at_apply_time(changes: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        job_spec(changes)


def test_resolved_values_that_fit_are_accepted() -> None:
    # gspo's own clip, raised above by the spec; luspo through gspo's sequence level; vespo for a client
    # (the trainer turns the vLLM correction off there).
    job_spec({"spec.grpo.preset": "gspo", "spec.grpo.epsilonHigh": 0.3})
    job_spec({"spec.grpo.preset": "gspo", "spec.grpo.lossType": "luspo"})
    job_spec({**CLIENT, "spec.grpo.lossType": "vespo"})


def test_num_iterations_divides_the_rollouts() -> None:
    assert compute_rollouts(job_spec()) == 10 * 2 * 4
    assert compute_rollouts(job_spec({"spec.grpo.numIterations": 3})) == 4 * 2 * 4  # ceil(10 / 3) batches


def test_chat_template_values_reach_the_template_as_booleans_where_they_are_flags() -> None:
    spec = grpo(chatTemplateKwargs={"enable_thinking": "false", "add_bos": "true", "reasoning_effort": "low"})
    assert spec.chat_template_arguments() == {
        "enable_thinking": False,
        "add_bos": True,
        "reasoning_effort": "low",
    }
    assert grpo().chat_template_arguments() == {}


class _TemplateTokenizer:
    """A tokenizer whose chat template opens a thinking block unless enable_thinking is false (Qwen3's)."""

    chat_template = "stub"
    eos_token_id = 0

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        assert kwargs.pop("tokenize") is False and kwargs.pop("add_generation_prompt") is True
        thinking = "" if kwargs.pop("enable_thinking", True) is False else "<think>"
        return "|".join(m["content"] for m in messages) + "|" + thinking

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


def test_client_chats_are_rendered_with_the_template_arguments_for_sampling_and_training() -> None:
    tokenizer = _TemplateTokenizer()
    chat = [{"role": "user", "content": "2+2?"}]
    arguments = grpo(chatTemplateKwargs={"enable_thinking": "false"}).chat_template_arguments()
    assert render_prompt_text(tokenizer, chat) == "2+2?|<think>"
    assert render_prompt_text(tokenizer, chat, arguments) == "2+2?|"
    sampled: list[list[int]] = []

    def sampler(ids: list[int], sampling: Sampling) -> list[Sample]:
        sampled.append(ids)
        return [Sample("4", "stop", (4,))]

    server = PolicyServer(
        0,
        "m",
        tokenizer,
        sampler,
        max_completion_length=8,
        temperature=1.0,
        top_p=1.0,
        host="127.0.0.1",
        chat_template_kwargs=arguments,
    )
    server.start()
    try:
        server.chat({"messages": chat})
    finally:
        server.close()
    # The policy server samples from exactly the ids the rollout function trains on.
    assert sampled == [prompt_ids(tokenizer, chat, arguments)]


def test_the_concepts_table_shows_what_each_preset_sets() -> None:
    doc = (repo_root() / "docs" / "concepts.md").read_text(encoding="utf-8")
    for name, preset in PRESETS.items():
        row = next(line for line in doc.splitlines() if line.startswith(f"| `{name}` |"))
        shown: dict[str, Any] = {}
        for pair in row.split("|")[2].split(","):
            key, _, text = pair.strip().strip("`").partition(": ")
            try:
                shown[key] = json.loads(text)
            except json.JSONDecodeError:
                shown[key] = text
        assert shown == {wire_name(k): v for k, v in preset.knobs.items()}, name
