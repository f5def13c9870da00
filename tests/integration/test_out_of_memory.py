"""CUDA out of memory on the real control plane: one trainer rank exits 6; the job fails at once with reason
OutOfMemory, names the rank that ran out and what to try, spends none of its restarts and stops the other
pods. (That the OOM rank is reported over a peer's NCCL error when both have failed is pinned by
tests/unit/test_reconcile.py, where both terminations can be observed at the same moment.)"""

from __future__ import annotations

import pytest

from tests.harness.kube import Cluster
from tests.harness.operator_process import Operator
from tests.integration.operator_helpers import run_job, terminate_pod, wait_phase

pytestmark = pytest.mark.slow

OOM = (
    "the trainer ran out of GPU memory (CUDA out of memory: Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.06 GiB is free); a restart needs the same memory, so the job is not "
    "retried. Try a smaller spec.trainer.perDeviceBatchSize (now 4), LoRA (spec.grpo.lora.enabled: true) "
    "instead of full fine-tuning, more trainer GPUs (now 4; spec.trainer.gpusPerNode or nodes), or a smaller model."
)


def test_cuda_out_of_memory_fails_the_job_at_once_with_what_to_try(
    kube: Cluster, namespace: str, operator: Operator
) -> None:
    run_job(kube, namespace, "math", runPolicy={"backoffLimit": 3})
    terminate_pod(kube, namespace, "math-trainer-1-1", 6, OOM)
    s = wait_phase(kube, namespace, "math", "Failed")
    assert s["reason"] == "OutOfMemory", s
    assert s.get("restarts", 0) == 0
    assert "math-trainer-1-1" in s["message"] and "does not fit in GPU memory" in s["message"]
    assert "perDeviceBatchSize" in s["message"]
