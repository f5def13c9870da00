"""(e) trainer rank 0 patches its GRPOJob's status subresource on the real API server: progress,
rewards and checkpoint arrive, and the fields the operator owns are left alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from grpo_metric import MetricServer

from tests.harness.kube import Cluster
from tests.trainer.toy import start_trainer, trainer_config

pytestmark = pytest.mark.trainer

JOB = """
apiVersion: grpo.dev/v1alpha1
kind: GRPOJob
metadata:
  name: toy-status
spec:
  model: {name: tiny/char-model}
  dataset: {train: "file:///workspace/data/train.jsonl"}
  grpo: {groupSize: 8, promptsPerStep: 4, steps: 6}
  metric: {image: registry.example/toy-metric:1}
"""


def test_progress_reaches_the_grpojob_status(
    kube: Cluster, namespace: str, tmp_path: Path, tiny_model: Path, toy_metric: MetricServer
) -> None:
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=JOB)
    config = trainer_config(
        tmp_path,
        tiny_model,
        toy_metric.url,
        steps=6,
        every_steps=3,
        validation_every=3,
        job=(namespace, "toy-status"),
    )
    process = start_trainer(config, tmp_path / "trainer.log", KUBECONFIG=str(kube.kubeconfig))
    assert process.wait(timeout=600) == 0, (tmp_path / "trainer.log").read_text()[-3000:]

    job = json.loads(kube.kubectl("get", "grpojob", "toy-status", "-n", namespace, "-o", "json").stdout)
    status = job["status"]
    assert status["progress"]["step"] == 6
    assert status["progress"]["totalSteps"] == 6
    assert status["progress"]["display"] == "6/6"
    assert status["progress"]["stepDurationSeconds"] >= 0
    rewards = status["rewards"]
    assert 0.0 <= rewards["mean"] <= 1.0
    assert {"std", "formatFailureRatio", "zeroStdGroupRatio", "metricErrorRatio"} <= set(rewards)
    assert rewards["validationStep"] == 6 and "validationMean" in rewards
    assert status["checkpoint"]["lastStep"] == 6
    assert status["checkpoint"]["path"].endswith("step-6")
    assert "phase" not in status and "conditions" not in status
