"""Upgrading the operator must not disturb the jobs it already runs: fields added to the spec after the upgrade
baseline (grpo_operator.api.compat.LATER_FIELDS; the baseline is the development commit released_fields.json
names, no release yet) change neither the gang hash nor trainer.json while they
hold their defaults, so no running gang restarts and an older trainer image (pinned in a job's
spec.trainer.image, and strict about unknown keys) still reads its config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from grpo_operator.api import TrainerConfig
from grpo_operator.api.compat import (
    FORMER_DEFAULTS,
    LATER_FIELDS,
    RELEASED_FIELDS_FILE,
    SNAPSHOT_ABOUT,
    spec_fields,
    wire_name,
)
from grpo_operator.api.spec import GRPOJobSpec
from grpo_operator.builders import gang_hash, job_from_object
from grpo_operator.builders.gang import gang_hash_input
from grpo_operator.builders.trainer_configmap import trainer_config_text
from grpo_operator.settings import OperatorSettings
from pydantic_core import to_jsonable_python

from tests.unit.reconcile_world import job_object

LATER_KEYS = {"applyChatTemplate", "scorePath"}


def keys(value: object) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in keys(v)}
    return set()


def test_every_later_field_is_known_here() -> None:
    assert {wire_name(path[-1]) for path, _ in LATER_FIELDS} == LATER_KEYS


def test_defaults_leave_trainer_json_and_the_gang_hash_as_they_were() -> None:
    job = job_from_object(job_object())
    text = trainer_config_text(job, OperatorSettings())
    assert not keys(json.loads(text)) & LATER_KEYS
    dataset = TrainerConfig.model_validate_json(text).dataset
    assert dataset is not None and dataset.apply_chat_template is True  # the new trainer's default
    hashed = gang_hash_input(job)
    assert not keys(hashed) & LATER_KEYS and "inputs" not in hashed
    # Added unset (None): absent from an upgraded job's trainer.json, which an older trainer image reads.
    assert "tracking" not in json.loads(text) and "learningHealth" not in json.loads(text)["grpo"]


def test_platform_learning_health_defaults_fill_what_the_job_leaves_unset() -> None:
    settings = OperatorSettings(learning_health_defaults={"windowSteps": 20, "flatSteps": 60})
    job = job_from_object(job_object(grpo={"learningHealth": {"windowSteps": 8}}))
    health = json.loads(trainer_config_text(job, settings))["grpo"]["learningHealth"]
    assert health == {"windowSteps": 8, "flatSteps": 60}


@pytest.mark.parametrize(
    "spec",
    [
        {"dataset": {"applyChatTemplate": False}},
        {"dataset": {"systemPrompt": "Answer with ####."}},
        {"grpo": {"validation": {"everySteps": 0, "scorePath": "/validate"}}},
        {"inputs": [{"name": "data", "configMap": "prompts"}]},
        {"tracking": {"tensorBoard": {"enabled": True}}},
        {"grpo": {"learningHealth": {"windowSteps": 10}}},
    ],
)
def test_a_field_set_away_from_its_default_reaches_the_trainer_and_restarts_the_gang(
    spec: dict[str, object],
) -> None:
    base = job_from_object(job_object())
    job = job_from_object(job_object(**spec))
    assert gang_hash(job) != gang_hash(base)
    if "inputs" not in spec:
        assert trainer_config_text(job, OperatorSettings()) != trainer_config_text(base, OperatorSettings())


def _snapshot() -> dict[str, Any]:
    return dict(json.loads(Path(RELEASED_FIELDS_FILE).read_text()))


def _released() -> dict[str, object]:
    return dict(_snapshot()["spec"])


def _unsafe_new_fields(fields: dict[tuple[str, ...], object], released: dict[str, object]) -> list[str]:
    later = {path for path, _ in LATER_FIELDS}
    allowed_new: set[tuple[str, ...]] = set()
    unsafe: list[str] = []
    for path in sorted(fields, key=len):
        if ".".join(path) in released:
            continue
        # Below a new field that is safe, the rest of its subtree is absent from old jobs as a whole.
        if fields[path] is None or path in later or any(path[:i] in allowed_new for i in range(1, len(path))):
            allowed_new.add(path)
        else:
            unsafe.append(".".join(path))
    return unsafe


def test_every_field_added_since_the_release_is_none_defaulted_or_handled_for_upgrades() -> None:
    unsafe = _unsafe_new_fields(spec_fields(GRPOJobSpec), _released())
    assert not unsafe, (
        f"spec fields added since the upgrade baseline with a non-None default: {unsafe}. Jobs the operator already "
        "runs get them at their default, which would change the gang hash (restarting every running gang) "
        "and trainer.json (an older trainer image refuses unknown keys): give the field a None default, or "
        "list it in grpo_operator.api.compat.LATER_FIELDS (docs/development.md, 'A new spec field')"
    )


def _without_new_nones(now: object, released: object) -> object:
    """``now`` without the keys that hold None and that ``released`` lacks: a None-defaulted field added
    inside an object-valued default is left out of the gang hash and trainer.json (both drop None)."""
    if isinstance(now, dict) and isinstance(released, dict):
        return {
            k: _without_new_nones(v, released.get(k))
            for k, v in now.items()
            if not (v is None and k not in released)
        }
    return now


def _former_defaults_unset(released: dict[str, object]) -> dict[str, object]:
    """The snapshot with each FORMER_DEFAULTS field as it is now (unset), in its own entry and in the
    defaults of the objects above it (camelCase keys there)."""
    out: dict[str, object] = json.loads(json.dumps(released))
    for path, _ in FORMER_DEFAULTS:
        out[".".join(path)] = None
        for i in range(1, len(path)):
            holder = out.get(".".join(path[:i]))
            for name in path[i:-1]:
                holder = holder.get(wire_name(name)) if isinstance(holder, dict) else None
            if isinstance(holder, dict):
                holder[wire_name(path[-1])] = None
    return out


def test_released_defaults_are_unchanged() -> None:
    released = _former_defaults_unset(_released())
    now = {
        ".".join(path): _without_new_nones(to_jsonable_python(d), released.get(".".join(path)))
        for path, d in spec_fields(GRPOJobSpec).items()
    }
    changed = {k: (v, now[k]) for k, v in released.items() if k in now and now[k] != v}
    assert not changed, (
        f"baseline spec fields whose default changed (baseline, now): {changed}. A running job holds the "
        "baseline default implicitly; changing it changes the gang hash and restarts every running gang"
    )
    assert set(_released()) <= set(now), f"baseline fields removed: {sorted(set(_released()) - set(now))}"


def test_a_removed_default_is_the_baselines_and_unset_now() -> None:
    """A baseline job holds the former default as its own value (the API server stored it), so it keeps its
    images at the upgrade. A new job gets the same trainer image from the operator's shipped settings, and
    the project's vLLM image, which is the former default's vLLM plus the grpo-broadcast plugin."""
    released = _released()
    now = spec_fields(GRPOJobSpec)
    for path, value in FORMER_DEFAULTS:
        assert released[".".join(path)] == value and now[path] is None
    settings = OperatorSettings()
    assert dict(FORMER_DEFAULTS)[("trainer", "image")] == settings.trainer_image
    assert settings.vllm_image == "ghcr.io/grpo-operator/vllm:0.1.0"
    dockerfile = (Path(__file__).resolve().parents[2] / "trainer_image" / "Dockerfile.vllm").read_text()
    assert f"ARG BASE_IMAGE=docker.io/{dict(FORMER_DEFAULTS)[('generation', 'image')]}\n" in dockerfile
    stored = job_from_object(job_object(trainer={"image": settings.trainer_image}))
    unset = job_from_object(job_object())
    assert gang_hash_input(stored)["trainer"]["image"] == settings.trainer_image
    assert "image" not in gang_hash_input(unset)["trainer"]


def test_the_snapshot_says_what_it_is_a_snapshot_of() -> None:
    snapshot = _snapshot()
    assert set(snapshot) == {"about", "release", "spec", "trainerJson"}
    assert snapshot["about"] == SNAPSHOT_ABOUT and snapshot["release"]


def test_every_trainer_json_key_added_since_the_release_stays_out_of_an_upgraded_jobs_file() -> None:
    """An older trainer image (a job's pinned spec.trainer.image) reads the trainer.json a newer operator
    writes, and refuses keys it does not know: a key added since the upgrade baseline must be absent while unused."""
    released = dict(_snapshot()["trainerJson"])
    unsafe = _unsafe_new_fields(spec_fields(TrainerConfig), released)
    assert not unsafe, (
        f"trainer.json keys added since the upgrade baseline with a non-None default: {unsafe}. The operator writes "
        "them into every job's trainer.json, which a baseline trainer image refuses (it does not know them): "
        "give the key a None default, or list it in grpo_operator.api.compat.LATER_FIELDS"
    )
    now = {".".join(path) for path in spec_fields(TrainerConfig)}
    assert set(released) <= now, (
        f"trainer.json keys of the baseline removed: {sorted(set(released) - now)}. A baseline operator "
        "still writes them, and this trainer would refuse its trainer.json: keep them (ignored) until no "
        "supported operator writes them"
    )


def test_an_upgraded_jobs_trainer_json_holds_only_keys_of_the_release() -> None:
    """The file the operator writes now for a job of the baseline (every spec field at its baseline default)
    has no key a baseline trainer image would not know."""
    released = {tuple(k.split(".")) for k in _snapshot()["trainerJson"]}
    text = trainer_config_text(job_from_object(job_object()), OperatorSettings())

    def paths(value: object, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
        if not isinstance(value, dict):
            return set()
        found: set[tuple[str, ...]] = set()
        for key, inner in value.items():
            path = (*prefix, _python_name(key))
            found |= {path} | paths(inner, path)
        return found

    unknown = sorted(".".join(p) for p in paths(json.loads(text)) - released)
    assert not unknown, (
        f"trainer.json of a baseline job holds keys a baseline trainer does not know: {unknown}"
    )


def _python_name(wire: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in wire)


def test_the_check_refuses_a_new_field_with_a_default() -> None:
    # The check itself, on a spec that gained a defaulted field, a None-defaulted one and a later field.
    fields: dict[tuple[str, ...], object] = {
        ("grpo",): "<required>",
        ("grpo", "new_knob"): 3,
        ("grpo", "opt_in"): None,
        ("dataset",): None,
    }
    fields[LATER_FIELDS[0][0]] = LATER_FIELDS[0][1]
    released: dict[str, object] = {"grpo": "<required>", "dataset": None}
    assert _unsafe_new_fields(fields, released) == ["grpo.new_knob"]
    assert _unsafe_new_fields({**fields, ("opt", "inner"): 1, ("opt",): None}, released) == ["grpo.new_knob"]
