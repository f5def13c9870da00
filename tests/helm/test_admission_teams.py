"""Two teams with different limits beside the global ones, on the real API server (issue 48, item 1): the
chart renders the platform-limits policy once for the namespaces of no team and once per team, and a
tenant's `kubectl apply` is judged by its namespace's team, with the message naming the team's Helm value.
The operator's settings, read from the same rendered Deployment, give the same verdict and the same words
for each namespace (OperatorSettings.for_namespace), and its jobs' pods get the team's images and placement.

The walk-through a platform engineer follows (docs/platform.md, "Teams"): team research may use 32 GPUs
from its own registry and must queue on its LocalQueue; team product may use 2 and may not mount existing
claims; every other namespace keeps the global 8 GPUs and queues team-a/team-b.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from grpo_operator.builders import gang_pods, job_from_object
from grpo_operator.reconcile.platform_policy import platform_violations
from grpo_operator.settings import OperatorSettings

from tests.harness.kube import Cluster
from tests.helm.admission import DEFAULT_IMAGES, apply_job, grpojob, policies_in_force
from tests.helm.chart import run, template_args

pytestmark = pytest.mark.slow

RESEARCH_IMAGES = {
    "trainer": "registry.example.com/research/trainer:0.1.0",
    "generation": "registry.example.com/research/vllm:v0.31.0",
}


def teams(research: str, product: str) -> dict[str, Any]:
    return {
        "teams": [
            {
                "name": "research",
                "namespaces": [research],
                "maxGpusPerJob": 32,
                "queue": {"allowed": ["research"], "required": True},
                "images": RESEARCH_IMAGES,
                "gpuNodeSelector": {"pool": "research"},
            },
            {
                "name": "product",
                "namespaces": [product],
                "maxGpusPerJob": 2,
                "existingClaims": {"allowed": False},
            },
        ]
    }


@dataclass(frozen=True)
class Install:
    shared: str
    research: str
    product: str
    fullname: str
    settings: OperatorSettings


@pytest.fixture(scope="module")
def install(kube: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    shared, research, product = (kube.new_namespace(n) for n in ("shared", "research", "product"))
    values = tmp_path_factory.mktemp("teams") / "teams.yaml"
    values.write_text(yaml.safe_dump(teams(research, product)))
    big = grpojob(
        "probe", trainer={"nodes": 1, "gpusPerNode": 4, "image": "registry.example.com/grpo/trainer:0.1"}
    )
    with policies_in_force(
        kube,
        [shared, research, product],
        lambda: "teams.product.maxGpusPerJob" in apply_job(kube, big, product, dry_run=True).stderr,
        [values],
    ) as installed:
        yield Install(shared, research, product, installed.fullname, installed.settings)


def operator_verdict(install: Install, job: dict[str, Any], namespace: str) -> list[str]:
    local = {**job, "metadata": {"name": job["metadata"]["name"], "namespace": namespace, "uid": "u"}}
    return platform_violations(job_from_object(local).spec, install.settings.for_namespace(namespace))


def test_each_namespace_is_judged_by_its_teams_limits_at_apply_and_by_the_operator(
    kube: Cluster, install: Install
) -> None:
    nine = grpojob(
        "nine", trainer={"nodes": 1, "gpusPerNode": 8, "image": "registry.example.com/grpo/trainer:0.1"}
    )
    research_job = {**nine, "spec": {**nine["spec"], "scheduling": {"queueName": "research"}}}

    # Global namespace: 9 GPUs (1 vLLM, 8 trainer) are over platformPolicy.maxGpusPerJob (8).
    refused = apply_job(kube, nine, install.shared, dry_run=True)
    assert refused.returncode != 0 and "platform limit platformPolicy.maxGpusPerJob: 8" in refused.stderr
    assert f"'{install.fullname}-platform-limits'" in refused.stderr
    (said,) = operator_verdict(install, nine, install.shared)
    assert said in refused.stderr

    # Research: 32 allowed, but its queue is its own and required.
    accepted = apply_job(kube, research_job, install.research, dry_run=True)
    assert accepted.returncode == 0, accepted.stderr
    assert operator_verdict(install, research_job, install.research) == []
    wrong_queue = apply_job(kube, nine, install.research, dry_run=True)
    assert "platform limit teams.research.queue.allowed: research" in wrong_queue.stderr, wrong_queue.stderr
    assert f"'{install.fullname}-platform-limits-team-research'" in wrong_queue.stderr
    assert operator_verdict(install, nine, install.research)[0] in wrong_queue.stderr

    # Product: 2 GPUs, no existing claims; queues and images as everywhere else.
    small = grpojob("small")  # 1 vLLM GPU + 1 trainer GPU
    assert apply_job(kube, small, install.product, dry_run=True).returncode == 0
    claim = grpojob("claim", checkpoints={"volume": {"existingClaim": "shared-models"}})
    refused = apply_job(kube, claim, install.product, dry_run=True)
    assert "platform limit teams.product.existingClaims.allowed: false" in refused.stderr, refused.stderr
    assert apply_job(kube, claim, install.shared, dry_run=True).returncode == 0, "allowed outside the team"
    assert operator_verdict(install, claim, install.product)[0] in refused.stderr


def test_the_team_s_jobs_run_its_images_on_its_nodes(install: Install) -> None:
    job = grpojob("mine")
    del job["spec"]["trainer"]["image"], job["spec"]["generation"]["image"]
    for namespace, images, pool in (
        (install.research, RESEARCH_IMAGES, "research"),
        (install.product, {"trainer": DEFAULT_IMAGES["jobDefaults.images.trainer"],
                           "generation": DEFAULT_IMAGES["jobDefaults.images.generation"]}, None),
    ):  # fmt: skip
        local = {**job, "metadata": {"name": "mine", "namespace": namespace, "uid": "u"}}
        pods = gang_pods(job_from_object(local), install.settings.for_namespace(namespace), 1, "", {})
        by_role = {p["metadata"]["labels"]["grpo.dev/role"]: p for p in pods}
        for role, container in (("trainer", 0), ("generation", 0)):
            spec = by_role[role]["spec"]
            assert spec["containers"][container]["image"] == images[role]
            assert spec.get("nodeSelector", {}).get("pool") == pool


def test_a_namespace_in_two_teams_or_a_team_image_outside_its_registry_is_refused(tmp_path: Path) -> None:
    clash = teams("a", "b")
    clash["teams"][1]["namespaces"] = ["a"]
    path = tmp_path / "clash.yaml"
    path.write_text(yaml.safe_dump(clash))
    env = yaml.safe_load(run([*template_args([path]), "--show-only", "templates/deployment.yaml"]).stdout)
    variables = {
        e["name"]: e["value"] for e in env["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e
    }
    with pytest.raises(ValueError, match="namespace a is in team research and in team product"):
        OperatorSettings.from_env(variables)
    outside = teams("a", "b")
    outside["teams"][0]["allowedImagePrefixes"] = ["registry.example.com/other/"]
    path.write_text(yaml.safe_dump(outside))
    proc = run([*template_args([path])], check=False)
    assert proc.returncode != 0
    assert (
        "teams.research.images.trainer" in proc.stderr
        and "teams.research.allowedImagePrefixes" in proc.stderr
    )
