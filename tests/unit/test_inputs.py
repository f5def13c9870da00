"""spec.inputs: a user's ConfigMap or claim reaches the trainer and vLLM pods, read-only, at /inputs/<name>,
without breaking the restricted Pod Security Standard; the metric pod gets none of it."""

from __future__ import annotations

import pytest
from grpo_operator.api import GRPOJobSpec
from grpo_operator.settings import OperatorSettings
from pydantic import ValidationError

from tests.unit.reconcile_world import job_object
from tests.unit.test_pod_security import pod_specs, restricted_violations

INPUTS = [
    {"name": "data", "configMap": "gsm8k-sample"},
    {"name": "model", "claim": "team-models", "subPath": "qwen2.5-0.5b-sft"},
]


def test_inputs_are_mounted_read_only_in_trainer_and_vllm_pods_only() -> None:
    job = job_object(
        inputs=INPUTS,
        model={"name": "/inputs/model"},
        dataset={"train": "file:///inputs/data/train.jsonl"},
    )
    specs = pod_specs(job, OperatorSettings())
    for name, spec in specs.items():
        mounts = {m["mountPath"]: m for c in spec["containers"] for m in c.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in spec["volumes"]}
        if "-metric" in name:
            assert not any(p.startswith("/inputs") for p in mounts), name
            continue
        data, model = mounts["/inputs/data"], mounts["/inputs/model"]
        assert data["readOnly"] is True and model["readOnly"] is True, name
        assert model["subPath"] == "qwen2.5-0.5b-sft" and "subPath" not in data
        assert volumes[data["name"]] == {"name": data["name"], "configMap": {"name": "gsm8k-sample"}}
        assert volumes[model["name"]]["persistentVolumeClaim"] == {
            "claimName": "team-models",
            "readOnly": True,
        }
        assert restricted_violations(spec) == [], name


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([{"name": "data"}], "exactly one of configMap"),
        ([{"name": "data", "configMap": "a", "claim": "b"}], "exactly one of configMap"),
        ([{"name": "data", "configMap": "a", "subPath": "x"}], "use it with claim only"),
        ([{"name": "data", "claim": "a", "subPath": "x/../../etc"}], "must stay inside the claim"),
        ([{"name": "data", "configMap": "a"}, {"name": "data", "claim": "b"}], "must be unique"),
    ],
)
def test_unusable_inputs_are_refused_with_the_fix(inputs: list[dict[str, str]], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        GRPOJobSpec.model_validate({**job_object()["spec"], "inputs": inputs})
