"""examples/smoke on the real local API server: its manifests pass server-side validation, and
smoke.sh runs to "smoke: PASSED" against the local simulated cluster.

The simulated nodes run no containers, so the test plays the kubelet: the harness's local runner runs
the job's metric server and trainer as local processes (generation in-process instead of vLLM, so the
weight sync is the one part not exercised here), and a small loop below runs the seed Job's pod by
executing examples/smoke/seed.py against the claim's directory. Everything the script does itself
(suspend, seed Job, resume, deleting the trainer pod after the first checkpoint, checking the resume
point, status) goes through the real API server and operator. The trainer's /metrics is skipped
(SMOKE_SKIP_METRICS=1): the API server cannot proxy to a simulated pod."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.harness.kube import REPO, Cluster, kubectl_binary
from tests.harness.local_runner import LocalJobRunner
from tests.harness.operator_process import Operator

SMOKE = REPO / "examples" / "smoke"
METRIC_IMAGE = "ghcr.io/grpo-operator/metric-tiny-demo:0.1.0"


@pytest.mark.parametrize("manifest", ["grpojob.yaml", "seed-job.yaml"])
def test_smoke_manifests_are_accepted_by_the_api_server(kube: Cluster, namespace: str, manifest: str) -> None:
    proc = kube.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", str(SMOKE / manifest), check=False
    )
    assert proc.returncode == 0, proc.stderr


class SeedPodRunner:
    """Runs the seed Job's pod: examples/smoke/seed.py against the claim's directory, then reports the
    container's exit into the pod's status, as a kubelet would."""

    def __init__(self, kube: Cluster, namespace: str, log: Path) -> None:
        self.kube, self.namespace, self.log = kube, namespace, log
        self.done: set[str] = set()
        self.stop = threading.Event()

    def claim_dir(self) -> Path | None:
        pvc = self.kube.get("pvc", "smoke-ckpt", self.namespace) or {}
        if pvc.get("status", {}).get("phase") != "Bound":
            return None
        pv = self.kube.get("pv", pvc["spec"]["volumeName"]) or {}
        return Path(pv["spec"]["hostPath"]["path"])

    def seed_pods(self) -> list[dict[str, Any]]:
        out = self.kube.kubectl(
            "get", "pods", "-n", self.namespace, "-l", "grpo-smoke/role=seed", "-o", "yaml"
        )
        import yaml

        return list((yaml.safe_load(out.stdout) or {}).get("items", []))

    def loop(self) -> None:
        while not self.stop.wait(1):
            for pod in self.seed_pods():
                name = pod["metadata"]["name"]
                if name in self.done or pod["status"].get("phase") != "Running":
                    continue
                volume = self.claim_dir()
                if volume is None:
                    continue
                with self.log.open("ab") as handle:
                    code = subprocess.run(
                        [sys.executable, str(SMOKE / "seed.py"), str(volume)],
                        cwd=REPO,
                        stdout=handle,
                        stderr=subprocess.STDOUT,
                        check=False,
                    ).returncode
                self.kube.terminate_pod(self.namespace, name, code)
                self.done.add(name)


@pytest.mark.trainer
@pytest.mark.slow
def test_smoke_script_passes_on_the_local_cluster(kube: Cluster, namespace: str, tmp_path: Path) -> None:
    operator = Operator(kube, namespace, tmp_path / "operator.log")
    operator.start()
    seeder = SeedPodRunner(kube, namespace, tmp_path / "seed.log")
    seed_thread = threading.Thread(target=seeder.loop, daemon=True)
    runner = LocalJobRunner(
        kube,
        namespace,
        "smoke",
        {METRIC_IMAGE: [sys.executable, "examples/tiny/metric.py"]},
        tmp_path / "run",
    )
    outcome: dict[str, Any] = {}

    def run_job() -> None:
        try:
            outcome["phase"] = runner.run(timeout=1500)
        except Exception as exc:  # reported by the assertion below
            outcome["error"] = exc

    runner_thread = threading.Thread(target=run_job, daemon=True)
    env = {
        **kube.env(),
        "PATH": f"{Path(kubectl_binary()).parent}{os.pathsep}{os.environ['PATH']}",
        "SMOKE_NAMESPACE": namespace,
        "SMOKE_SKIP_METRICS": "1",
        "SMOKE_KEEP": "1",
        "SMOKE_TIMEOUT": "600",
    }
    try:
        seed_thread.start()
        runner_thread.start()
        proc = subprocess.run(
            ["bash", str(SMOKE / "smoke.sh")], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800
        )
        runner_thread.join(timeout=120)
    finally:
        seeder.stop.set()
        operator.stop()
    logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in (tmp_path / "run").glob("*.log"))
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}\nrunner logs:\n{logs}"
    assert "smoke: PASSED" in proc.stdout
    assert outcome.get("phase") == "Succeeded", outcome
    # The script deleted the first trainer pod and the job resumed from a checkpoint in a new attempt.
    assert "attempt 2 resumes from: /workspace/checkpoints/step-" in proc.stdout
    job = kube.get("grpojob", "smoke", namespace)
    assert job is not None and job["status"]["trainerAttempt"] == 2
    assert seeder.done, "the seed Job's pod never ran"
