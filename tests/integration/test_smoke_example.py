"""examples/smoke on the real local API server: its manifests pass server-side validation, and
smoke.sh runs to "smoke: PASSED" against the local simulated cluster.

The simulated nodes run no containers, so the test plays the kubelet. The harness's local runner runs
the job's metric server and trainer as local processes (generation in-process instead of vLLM, so the
weight sync to vLLM is the one part not exercised here). kwok completes Job pods by itself a few
seconds after they start, so the seed Job's pod does no work here: the test runs the same
examples/smoke/seed.py against the claim's directory as soon as the claim is bound, and starts the
local runner only once it has, so no trainer starts on an empty volume. Everything the script does
(suspend, seed Job, resume, deleting the trainer pod after the first checkpoint, checking the resume
point, status) goes through the real API server and operator. The trainer's /metrics is skipped
(SMOKE_SKIP_METRICS=1): the API server cannot proxy to a simulated pod."""

from __future__ import annotations

import os
import re
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


class ClaimSeeder:
    """Runs examples/smoke/seed.py against the smoke claim's directory once the claim is bound."""

    def __init__(self, kube: Cluster, namespace: str, log: Path) -> None:
        self.kube, self.namespace, self.log = kube, namespace, log
        self.seeded = threading.Event()
        self.stop = threading.Event()
        self.exit_code: int | None = None

    def claim_dir(self) -> Path | None:
        pvc = self.kube.get("pvc", "smoke-ckpt", self.namespace) or {}
        if pvc.get("status", {}).get("phase") != "Bound":
            return None
        pv = self.kube.get("pv", pvc["spec"]["volumeName"]) or {}
        return Path(pv["spec"]["hostPath"]["path"])

    def loop(self) -> None:
        while not self.stop.wait(0.5):
            volume = self.claim_dir()
            if volume is None:
                continue
            with self.log.open("ab") as handle:
                self.exit_code = subprocess.run(
                    [sys.executable, str(SMOKE / "seed.py"), str(volume)],
                    cwd=REPO,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    check=False,
                ).returncode
            self.seeded.set()
            return


@pytest.mark.trainer
@pytest.mark.slow
def test_smoke_script_passes_on_the_local_cluster(kube: Cluster, namespace: str, tmp_path: Path) -> None:
    operator = Operator(kube, namespace, tmp_path / "operator.log")
    operator.start()
    seeder = ClaimSeeder(kube, namespace, tmp_path / "seed.log")
    seed_thread = threading.Thread(target=seeder.loop, daemon=True)
    runner = LocalJobRunner(
        kube,
        namespace,
        "smoke",
        {METRIC_IMAGE: [sys.executable, "examples/tiny/metric.py"]},
        tmp_path / "run",
        # The smoke job's checks are the operator's and the trainer's; generation through real vLLM is
        # tests/integration/test_e2e_training.py's, and a second server start would cost minutes.
        generation="in-process-transformers",
    )
    outcome: dict[str, Any] = {}

    def run_job() -> None:
        try:
            if not seeder.seeded.wait(timeout=600):
                raise TimeoutError("the claim smoke-ckpt was never bound and seeded")
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
    (tmp_path / "smoke.out").write_text(proc.stdout + "\n--- stderr\n" + proc.stderr)
    logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in (tmp_path / "run").glob("*.log"))
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}\nrunner logs:\n{logs}"
    assert "smoke: PASSED" in proc.stdout
    assert outcome.get("phase") == "Succeeded", outcome
    # The script deleted the first trainer pod and the job resumed from a checkpoint in a new attempt.
    first = re.search(r"checkpoint of step (\d+) at \S+ \(trainer attempt 1\)", proc.stdout)
    resumed = re.search(r"attempt 2 resumes from: \S+/checkpoints/step-(\d+)", proc.stdout)
    assert first and resumed and int(resumed.group(1)) >= int(first.group(1)), proc.stdout
    job = kube.get("grpojob", "smoke", namespace)
    assert job is not None and job["status"]["trainerAttempt"] == 2
    assert seeder.exit_code == 0, (tmp_path / "seed.log").read_text()
