"""What the platform puts on every job's GPU pods from the operator settings: the trainer and vLLM images of
jobs that leave them unset (never written into the stored spec), and node-affinity requirements (a driver
version) merged into each required term of a job's own node affinity."""

from __future__ import annotations

from typing import Any

import pytest
from grpo_operator.builders import gang_pods, metric_workload
from grpo_operator.builders.rollouts import gateway_deployment
from grpo_operator.builders.scheduling import with_required_node_expressions
from grpo_operator.settings import OperatorSettings, SettingsError

from tests.unit.test_builders import make_job
from tests.unit.test_builders_rollouts import client_job

MIRROR = OperatorSettings(
    trainer_image="mirror.example.com/grpo/trainer:0.1.0",
    vllm_image="mirror.example.com/vllm/vllm-openai:v0.31.0",
)
DRIVER = {"key": "nvidia.com/cuda.driver-version.major", "operator": "Gt", "values": ["579"]}
AFFINE = OperatorSettings(gpu_node_affinity=(DRIVER,), gpu_node_selector={"nvidia.com/gpu.present": "true"})


def _images(pods: list[dict[str, Any]]) -> dict[str, str]:
    return {p["metadata"]["labels"]["grpo.dev/role"]: p["spec"]["containers"][0]["image"] for p in pods}


def test_unset_images_are_the_platforms_and_the_stored_spec_keeps_them_unset() -> None:
    job = make_job()
    assert _images(gang_pods(job, MIRROR, 1, "")) == {
        "trainer": MIRROR.trainer_image,
        "generation": MIRROR.vllm_image,
    }
    spec = job.spec.to_dict()
    assert "image" not in spec["trainer"] and "image" not in spec.get("generation", {})
    gateway = gateway_deployment(client_job(), MIRROR)
    assert gateway["spec"]["template"]["spec"]["containers"][0]["image"] == MIRROR.trainer_image
    # The shipped settings: the trainer image the CRD used to default to, and the project's vLLM image
    # (vLLM's own image of the release the CRD used to default to, plus the grpo-broadcast plugin).
    assert _images(gang_pods(job, OperatorSettings(), 1, "")) == {
        "trainer": "ghcr.io/grpo-operator/trainer:0.1.0",
        "generation": "ghcr.io/grpo-operator/vllm:0.1.0",
    }


def test_a_jobs_own_images_win_over_the_platforms() -> None:
    job = make_job(
        trainer={"image": "team.example.com/trainer:2"}, generation={"image": "team.example.com/vllm:2"}
    )
    assert _images(gang_pods(job, MIRROR, 1, "")) == {
        "trainer": "team.example.com/trainer:2",
        "generation": "team.example.com/vllm:2",
    }


def _required_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = pod["spec"]["affinity"]["nodeAffinity"]
    return list(affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"])


def test_every_gpu_pod_requires_the_platforms_expressions_and_the_metric_pod_does_not() -> None:
    job = make_job()
    for pod in gang_pods(job, AFFINE, 1, ""):
        assert _required_terms(pod) == [{"matchExpressions": [DRIVER]}]
        assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    metric = next(m for m in metric_workload(job, AFFINE) if m["kind"] == "Deployment")
    assert "affinity" not in metric["spec"]["template"]["spec"]


def test_the_expressions_join_every_term_of_the_jobs_own_node_affinity() -> None:
    pool = {"key": "pool", "operator": "In", "values": ["a"]}
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}
    preferred = [{"weight": 1, "preference": {"matchExpressions": [zone]}}]
    own = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [pool]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": preferred,
        },
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
    }
    job = make_job(scheduling={"affinity": own})
    trainer = next(
        p for p in gang_pods(job, AFFINE, 1, "") if p["metadata"]["labels"]["grpo.dev/role"] == "trainer"
    )
    terms = _required_terms(trainer)
    # Terms are ORed by the API server: each must carry the driver requirement, or it would admit any node.
    assert terms[0]["matchExpressions"] == [pool, DRIVER]
    assert terms[1]["matchExpressions"] == [DRIVER] and terms[1]["matchFields"][0]["values"] == ["n1"]
    assert (
        trainer["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        == preferred
    )
    # The job's metric pod keeps the job's own affinity only.
    metric = next(m for m in metric_workload(job, AFFINE) if m["kind"] == "Deployment")
    metric_terms = metric["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert DRIVER not in metric_terms[0]["matchExpressions"]


def test_merging_leaves_the_input_alone_and_adds_an_expression_once() -> None:
    own = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [DRIVER]}]
            }
        }
    }
    merged = with_required_node_expressions(own, [DRIVER])
    assert merged == own and merged is not own
    assert with_required_node_expressions({}, [DRIVER]) == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [DRIVER]}]
            }
        }
    }


def test_the_setting_parses_from_the_environment_as_helm_renders_it() -> None:
    settings = OperatorSettings.from_env(
        {
            "GRPO_OPERATOR_GPU_NODE_AFFINITY": '[{"key": "nvidia.com/cuda.driver-version.major", "operator": "Gt", "values": ["579"]}]'
        }
    )
    assert settings.gpu_node_affinity == (DRIVER,)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"key": "k", "operator": "Gte", "values": ["1"]}, "has operator 'Gte'"),
        ({"key": "k", "operator": "Gt", "values": ["579", "580"]}, "which takes one integer"),
        ({"key": "k", "operator": "Gt", "values": ["R580"]}, "which takes one integer"),
        ({"key": "k", "operator": "In"}, "has no values for operator In"),
        ({"key": "k", "operator": "Exists", "values": ["x"]}, "which takes none"),
        ({"operator": "Exists"}, "has no key"),
        ({"key": "k", "operator": "Exists", "value": "x"}, "has unknown keys ['value']"),
        ("nvidia.com/cuda.driver-version.major>579", "is str, not an object"),
    ],
)
def test_a_requirement_the_api_server_would_refuse_stops_the_operator_at_start(
    entry: Any, problem: str
) -> None:
    with pytest.raises(SettingsError, match=r"gpu_node_affinity\[0\] .*jobDefaults.gpuNodeAffinity") as error:
        OperatorSettings(gpu_node_affinity=(entry,))
    assert problem in str(error.value) and "NodeSelectorRequirement" in str(error.value)


@pytest.mark.parametrize("image", ["", "registry.example.com/trainer:1 --privileged"])
def test_an_image_setting_that_is_no_image_reference_is_refused(image: str) -> None:
    with pytest.raises(SettingsError, match=r"trainer_image .*jobDefaults.images.trainer"):
        OperatorSettings(trainer_image=image)
