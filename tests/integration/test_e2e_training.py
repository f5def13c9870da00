"""End to end, as `make demo` does it: a GRPOJob applied to the real API server, the operator running,
and the job's metric server and trainer run locally by the test harness's runner (simulated nodes run
no containers). The job must train a tiny model for real and finish Succeeded, with the checkpoint,
the status and the trainer's own log telling the same story."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.kube import REPO, Cluster, wait_for
from tests.harness.local_runner import LocalJobRunner
from tests.harness.operator_process import Operator

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

STEPS = 12
METRIC_IMAGE = "ghcr.io/grpo-operator/metric-tiny-demo:0.1.0"


def tiny_job() -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load((REPO / "examples" / "tiny" / "grpojob.yaml").read_text())
    job["spec"]["grpo"]["steps"] = STEPS
    job["spec"]["grpo"]["validation"]["everySteps"] = 4
    job["spec"]["checkpoints"]["everySteps"] = 4
    return job


def claim_dir(kube: Cluster, namespace: str, claim: str) -> Path:
    def bound() -> str | None:
        pvc = kube.get("pvc", claim, namespace) or {}
        return (
            pvc.get("spec", {}).get("volumeName") if pvc.get("status", {}).get("phase") == "Bound" else None
        )

    volume = wait_for(f"claim {claim} bound", bound, timeout=60)
    pv = kube.get("pv", volume)
    assert pv is not None
    return Path(pv["spec"]["hostPath"]["path"])


def train_to_succeeded(kube: Cluster, namespace: str, job: dict[str, Any], tmp_path: Path) -> Path:
    """Applies the tiny demo's ``job`` with the operator running, seeds its claim as the demo does
    (examples/tiny/seed.py) and runs its pods locally until the job ends; asserts it Succeeded and
    returns the directory that backs the job's claim."""
    sys.path.insert(0, str(REPO / "examples" / "tiny"))
    from seed import seed  # the tiny model and the demo's prompts on the job's volume

    operator = Operator(kube, namespace, tmp_path / "operator.log")
    operator.start()
    try:
        kube.apply(job, namespace)
        volume = claim_dir(kube, namespace, "tiny-ckpt")
        seed(volume)
        runner = LocalJobRunner(
            kube,
            namespace,
            "tiny",
            {METRIC_IMAGE: [sys.executable, "examples/tiny/metric.py"]},
            tmp_path / "run",
        )
        phase = runner.run(timeout=900)
        logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in (tmp_path / "run").glob("*.log"))
        assert phase == "Succeeded", f"job ended {phase}; runner logs:\n{logs}"
    finally:
        operator.stop()
    return volume


def test_a_job_trains_through_the_operator_to_succeeded(
    kube: Cluster, namespace: str, tmp_path: Path
) -> None:
    volume = train_to_succeeded(kube, namespace, tiny_job(), tmp_path)

    job = kube.get("grpojob", "tiny", namespace)
    assert job is not None
    status = job["status"]
    assert status["phase"] == "Succeeded"
    assert status["progress"]["step"] == STEPS
    assert status["rollouts"] == STEPS * 4 * 8

    # The final checkpoint exists and the atomic manifest names it.
    manifest = json.loads((volume / "checkpoints" / "latest.json").read_text())
    assert manifest["step"] == STEPS
    assert Path(manifest["path"]).is_dir()
    assert status["checkpoint"]["lastStep"] == STEPS
    assert status["checkpoint"]["path"] == manifest["path"]

    # The status the trainer patched agrees with its own per-step log.
    rows = [json.loads(line) for line in (volume / "output" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert status["rewards"]["mean"] == pytest.approx(rows[-1]["reward_mean"], abs=1e-3)
    assert status["rewards"]["formatFailureRatio"] == pytest.approx(
        rows[-1]["format_failure_ratio"], abs=1e-3
    )

    # It learned: the reward rose clearly from the first steps to the last.
    first = sum(r["reward_mean"] for r in rows[:3]) / 3
    last = sum(r["reward_mean"] for r in rows[-3:]) / 3
    assert first < 0.3 and last > first + 0.4, f"reward did not rise: first {first:.3f}, last {last:.3f}"

    samples = [json.loads(line) for line in (volume / "output" / "samples.jsonl").read_text().splitlines()]
    assert samples and {"step", "prompt", "completion", "reward"} <= samples[0].keys()
