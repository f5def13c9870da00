"""The Deployment of a service that runs the tenant's code beside the job (the metric service, the
environment service): one container, no API credentials, CPU placement, the restricted pod security."""

from __future__ import annotations

from typing import Any, Literal

from grpo_operator.builders.common import Job, Manifest, labels, metadata, selector_labels, with_hash
from grpo_operator.builders.scheduling import image_pull_secrets, pod_placement
from grpo_operator.builders.security import secure_pod_spec
from grpo_operator.settings import OperatorSettings


def user_service_deployment(
    job: Job,
    settings: OperatorSettings,
    name: str,
    role: Literal["metric", "environment"],
    container: dict[str, Any],
    replicas: int,
    **pod_fields: Any,
) -> Manifest:
    pod_spec: dict[str, Any] = {
        # User code: no Kubernetes API credentials and no service-link environment.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [container],
        **pod_fields,
        **pod_placement(job, settings, gpu=False),
        **image_pull_secrets(job, settings),
    }
    return with_hash(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": metadata(job, name, role),
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": selector_labels(job, role)},
                "template": {
                    "metadata": {"labels": labels(job, role)},
                    "spec": secure_pod_spec(pod_spec, settings),
                },
            },
        }
    )
