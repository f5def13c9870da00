"""Pull secrets reach every pod of a job: trainer pods run under the job's own ServiceAccount, so the
namespace default ServiceAccount's secrets never would."""

from __future__ import annotations

from typing import Any

from grpo_operator.builders import gang_hash, gang_pods, metric_workload
from grpo_operator.settings import OperatorSettings

from tests.unit.test_builders import make_job


def pod_specs(job: Any, settings: OperatorSettings) -> dict[str, dict[str, Any]]:
    specs = {p["metadata"]["name"]: p["spec"] for p in gang_pods(job, settings, 1, "")}
    deployment = next(m for m in metric_workload(job, settings) if m["kind"] == "Deployment")
    specs["metric"] = deployment["spec"]["template"]["spec"]
    return specs


def test_no_pull_secrets_means_no_key_at_all() -> None:
    for name, spec in pod_specs(make_job(), OperatorSettings()).items():
        assert "imagePullSecrets" not in spec, name


def test_operator_defaults_then_the_jobs_own_reach_trainer_vllm_and_metric_pods_once_each() -> None:
    settings = OperatorSettings(image_pull_secrets=("regcred", "mirror"))
    job = make_job(imagePullSecrets=[{"name": "team-a-registry"}, {"name": "regcred"}])
    specs = pod_specs(job, settings)
    assert set(specs) == {"math-gen-1-0", "math-trainer-1-0", "metric"}
    for name, spec in specs.items():
        assert spec["imagePullSecrets"] == [
            {"name": "regcred"},
            {"name": "mirror"},
            {"name": "team-a-registry"},
        ], name
    # The trainer is the pod that does not run under the default ServiceAccount.
    assert specs["math-trainer-1-0"]["serviceAccountName"] == "math-trainer"


def test_pull_secrets_from_the_environment() -> None:
    settings = OperatorSettings.from_env({"GRPO_OPERATOR_IMAGE_PULL_SECRETS": "regcred, mirror"})
    assert settings.image_pull_secrets == ("regcred", "mirror")


def test_changing_pull_secrets_does_not_restart_a_running_gang() -> None:
    """Images of running pods are already pulled; the next gang attempt uses the new secrets."""
    before = make_job()
    after = make_job(imagePullSecrets=[{"name": "regcred"}])
    assert gang_hash(before) == gang_hash(after)
