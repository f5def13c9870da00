"""Pure builders: (job, operator settings) -> Kubernetes manifests as dicts. No I/O, no clock.

Every child is owned by its GRPOJob (except a retained checkpoint PVC), carries the labels
app.kubernetes.io/name, app.kubernetes.io/part-of=grpo-operator, grpo.dev/job and grpo.dev/role, and
has a name derived from the job name alone, so re-running a build gives the same objects.
"""

from grpo_operator.builders.children import (
    generated_secrets,
    infrastructure,
    job_from_object,
    metric_workload,
)
from grpo_operator.builders.common import Job, Manifest
from grpo_operator.builders.gang import gang_hash, gang_pods, generation_pod, trainer_pod

__all__ = [
    "Job",
    "Manifest",
    "gang_hash",
    "gang_pods",
    "generated_secrets",
    "generation_pod",
    "infrastructure",
    "job_from_object",
    "metric_workload",
    "trainer_pod",
]
