"""Rewards without building an image, end to end: a GRPOJob whose metric is the stock metric image, computing
built-in rewards (spec.metric.rewards) or the user's own function from a ConfigMap (spec.metric.function).
The metric pod runs the stock image's server (``python -m grpo_metric.builtin``) with the pod's own
environment, the ConfigMap key resolved as a kubelet does; the trainer trains on its answers to Succeeded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from grpo_operator.api.builtin_rewards import FUNCTION_SOURCE_ENV, STOCK_METRIC_IMAGE

from tests.harness.kube import REPO, Cluster
from tests.harness.local_runner import LocalJobRunner
from tests.integration.test_e2e_training import run_tiny_job, tiny_job

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

STEPS = 3
STOCK = {STOCK_METRIC_IMAGE: [sys.executable, "-m", "grpo_metric.builtin"]}


def short_job(metric: dict[str, object]) -> dict[str, object]:
    job = tiny_job()
    job["spec"]["grpo"]["steps"] = STEPS
    job["spec"]["checkpoints"]["everySteps"] = STEPS
    job["spec"]["grpo"]["validation"]["everySteps"] = 0
    del job["spec"]["dataset"]["validation"]
    job["spec"]["metric"] = metric
    return job


def train(
    kube: Cluster,
    namespace: str,
    job: dict[str, object],
    tmp_path: Path,
    seen: list[dict[str, Any]] | None = None,
) -> list[dict[str, object]]:
    """Runs ``job`` to Succeeded; the metric pods the runner saw go into ``seen``."""

    def watch_metric(runner: LocalJobRunner) -> None:
        if seen is not None and not seen:
            seen.extend(runner.pods("metric"))

    # What the metric answers is the point here; generation through vLLM is test_e2e_training.py's.
    phase, volume = run_tiny_job(
        kube,
        namespace,
        job,
        tmp_path,
        generation="in-process-transformers",
        hooks=[watch_metric],
        metric_commands=STOCK,
    )
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in (tmp_path / "run").glob("*.log"))
    assert phase == "Succeeded", f"job ended {phase}; runner logs:\n{logs}"
    (tmp_path / "samples.jsonl").write_bytes((volume / "output" / "samples.jsonl").read_bytes())
    return [json.loads(line) for line in (volume / "output" / "metrics.jsonl").read_text().splitlines()]


def test_built_in_rewards_are_weighted_components_of_the_reward(
    kube: Cluster, namespace: str, tmp_path: Path
) -> None:
    job = short_job(
        {
            "image": STOCK_METRIC_IMAGE,
            "rewards": [
                {"type": "regex", "name": "has_a", "pattern": "a"},
                {"type": "length", "maxTokens": 4},
                {"type": "exactMatch"},
            ],
            "rewardWeights": {"has_a": 1.0, "length": 0.5},
        }
    )
    rows = train(kube, namespace, job, tmp_path)
    assert len(rows) == STEPS
    # Each sample carries its own parts, which `kubectl grpo samples` shows beside it.
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert samples and all(set(s["components"]) == {"has_a", "length", "exact_match"} for s in samples)
    for row in rows:
        components = row["reward_components"]
        assert isinstance(components, dict) and set(components) == {"has_a", "length", "exact_match"}
        assert 0.0 <= components["has_a"] <= 1.0 and -1.0 <= components["length"] <= 0.0
        # The reward is the weighted sum of the means; exact_match is reported but weighs nothing.
        expected = components["has_a"] + 0.5 * components["length"]
        assert row["reward_mean"] == pytest.approx(expected, abs=1e-6)
    status = kube.get("grpojob", "tiny", namespace)
    assert status is not None
    assert set(status["status"]["rewards"]["components"]) == {"has_a", "length", "exact_match"}


def test_the_users_function_from_a_configmap_is_the_reward(
    kube: Cluster, namespace: str, tmp_path: Path
) -> None:
    # The demo's own metric, as source in a ConfigMap instead of an image.
    source = (REPO / "examples" / "tiny" / "metric.py").read_text()
    kube.kubectl("create", "configmap", "tiny-reward", "-n", namespace, f"--from-literal=reward.py={source}")
    job = short_job(
        {
            "image": STOCK_METRIC_IMAGE,
            "function": {"configMap": "tiny-reward", "key": "reward.py", "name": "target_fraction"},
        }
    )
    seen: list[dict[str, Any]] = []
    rows = train(kube, namespace, job, tmp_path, seen)
    assert len(rows) == STEPS
    # target_fraction: the share of the completion that is the target character, a plain reward in [0, 1].
    assert all(0.0 <= float(str(r["reward_mean"])) <= 1.0 and "reward_components" not in r for r in rows)
    assert any(float(str(r["reward_mean"])) > 0.0 for r in rows)
    # The source reached the metric pod from the ConfigMap key, not through the operator.
    env = {e["name"]: e for e in seen[0]["spec"]["containers"][0]["env"]}
    assert env[FUNCTION_SOURCE_ENV]["valueFrom"]["configMapKeyRef"] == {
        "name": "tiny-reward",
        "key": "reward.py",
    }
