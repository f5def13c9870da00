"""The trainer's API credential reaches only the process that uses it: rank 0, which patches the job's
status. Every other pod of the gang runs without a ServiceAccount token, so a compromised rank 1..N
(tenant code: the trainer image) has nothing to call the API server with."""

from __future__ import annotations

from grpo_operator.builders import job_from_object
from grpo_operator.builders.gang import gang_pods
from grpo_operator.settings import OperatorSettings


def test_only_trainer_rank_zero_mounts_the_service_account_token() -> None:
    job = job_from_object(
        {
            "apiVersion": "grpo.dev/v1alpha1",
            "kind": "GRPOJob",
            "metadata": {"name": "math", "namespace": "ns", "uid": "uid-1", "generation": 1},
            "spec": {
                "model": {"name": "Qwen/Qwen2.5-1.5B-Instruct"},
                "dataset": {"train": "hf://openai/gsm8k:main#train"},
                "grpo": {"groupSize": 8, "promptsPerStep": 3, "steps": 10},
                "metric": {"image": "registry.example.com/metric:1"},
                "trainer": {"nodes": 3, "gpusPerNode": 1},
                "checkpoints": {"volume": {"accessMode": "ReadWriteMany"}},
            },
        }
    )
    mounts = {
        pod["metadata"]["name"]: pod["spec"]["automountServiceAccountToken"]
        for pod in gang_pods(job, OperatorSettings(), 1, "")
    }
    assert mounts == {
        "math-gen-1-0": False,
        "math-trainer-1-0": True,
        "math-trainer-1-1": False,
        "math-trainer-1-2": False,
    }
