"""Data in, end to end: the training prompts come from a ConfigMap named in spec.inputs, not from the job's
volume. The operator mounts it at /inputs/data in the trainer pod; the test harness's runner stands in for
the kubelet (it writes the ConfigMap's keys where the mount would be) and runs the trainer, which must
train on exactly those prompts to Succeeded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness.kube import Cluster
from tests.integration.test_e2e_training import tiny_job, train_to_succeeded

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

STEPS = 3
# Prompts that exist nowhere else: examples/tiny/seed.py writes "q<digit><letter>:" to the volume.
PROMPTS = [f"cm{i % 7}{chr(110 + i % 9)}:" for i in range(32)]


def test_a_job_trains_on_the_dataset_of_its_configmap_input(
    kube: Cluster, namespace: str, tmp_path: Path
) -> None:
    rows = "".join(json.dumps({"prompt": p, "answer": "a"}) + "\n" for p in PROMPTS)
    kube.kubectl("create", "configmap", "prompts", "-n", namespace, "--from-literal=train.jsonl=" + rows)
    job = tiny_job()
    job["spec"]["grpo"]["steps"] = STEPS
    job["spec"]["checkpoints"]["everySteps"] = STEPS
    job["spec"]["grpo"]["validation"]["everySteps"] = 0
    del job["spec"]["dataset"]["validation"]
    job["spec"]["inputs"] = [{"name": "data", "configMap": "prompts"}]
    job["spec"]["dataset"]["train"] = "file:///inputs/data/train.jsonl"
    # What the trainer reads is the point here; generation through vLLM is test_e2e_training.py's.
    volume = train_to_succeeded(kube, namespace, job, tmp_path, generation="in-process-transformers")

    trainer = kube.get("pod", "tiny-trainer-1-0", namespace)
    assert trainer is not None
    mount = next(
        m for m in trainer["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == "/inputs/data"
    )
    assert mount["readOnly"] is True
    samples = [json.loads(line) for line in (volume / "output" / "samples.jsonl").read_text().splitlines()]
    trained_on = {s["prompt"] for s in samples if s["split"] == "train"}
    assert trained_on and trained_on <= set(PROMPTS), trained_on
