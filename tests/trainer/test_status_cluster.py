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


CLIENT_JOB = """
apiVersion: grpo.dev/v1alpha1
kind: GRPOJob
metadata:
  name: client-status
spec:
  model: {name: tiny/char-model}
  dataset: {train: "file:///workspace/data/train.jsonl"}
  grpo: {groupSize: 4, promptsPerStep: 2, steps: 3}
  metric: {image: registry.example/toy-metric:1}
"""


def test_waiting_for_the_client_shows_in_the_status(
    kube: Cluster, namespace: str, tmp_path: Path, chat_model: Path
) -> None:
    """A client-rollout trainer blocked on the client says so (progress.waitingForClientSince), so the stall
    detector can tell waiting from hanging; the field goes away once the groups arrive."""
    import time

    from tests.trainer.client_toy import client_config, static_group
    from tests.trainer.gateway_double import GatewayDouble

    kube.kubectl("apply", "-n", namespace, "-f", "-", input=CLIENT_JOB)

    def progress() -> dict[str, object]:
        job = json.loads(
            kube.kubectl("get", "grpojob", "client-status", "-n", namespace, "-o", "json").stdout
        )
        return dict(job.get("status", {}).get("progress", {}))

    def wait_for(predicate: object, what: str) -> dict[str, object]:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            seen = progress()
            if predicate(seen):  # type: ignore[operator]
                return seen
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}; progress: {progress()}")

    with GatewayDouble() as gateway:
        config, _ = client_config(
            tmp_path, chat_model, gateway.url, steps=3, group_size=4, prompts_per_step=2
        )
        text = json.loads(config.read_text())
        text["job"] = {"namespace": namespace, "name": "client-status"}
        config.write_text(json.dumps(text))
        process = start_trainer(
            config, tmp_path / "trainer.log", KUBECONFIG=str(kube.kubeconfig), GRPO_GATEWAY_WAIT_SECONDS="1"
        )
        waiting = wait_for(lambda p: "waitingForClientSince" in p, "waitingForClientSince")
        assert str(waiting["waitingForClientSince"]).endswith("Z")
        for step in range(1, 4):
            for b in range(2):
                gateway.submit(static_group(f"q{step}{b}:", [0.1, 0.2, 0.3 + b, 0.4]))
        assert process.wait(timeout=300) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    done = wait_for(lambda p: p.get("step") == 3, "step 3")
    assert "waitingForClientSince" not in done
