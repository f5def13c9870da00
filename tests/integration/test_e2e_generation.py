"""End to end through real vLLM (PyPI's CPU build, run by the test harness's local runner with the pod's own
args): what the operator makes of the vLLM pod's start-up, and the operator's vLLM and weight-sync ports.

The local cluster starts a generation pod without making it Ready (hack/cluster/kwok-stages.yaml); the
runner reports it Ready once its vLLM server answers /health, as the kubelet does when the pod's readiness
probe passes. So the operator's start-up clock (spec.generation.startupTimeoutSeconds, from the pod's start
to Ready) runs against vLLM's real start-up here: 74-126 s on the project's 2-core machine, more beside other
tests (docs/development.md, "vLLM on the CPU")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.kube import Cluster, kubectl_binary
from tests.harness.local_process import free_port
from tests.harness.local_runner import LocalJobRunner
from tests.integration.test_e2e_training import run_tiny_job, tiny_job, train_to_succeeded

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.vllm]

# The API's minimum (api/workloads.py): below vLLM's start-up on a 2-core machine, so that it runs out.
STARTUP_TIMEOUT = 60


class StatusWatch:
    """Every (phase, reason, message) the job's status goes through, as `kubectl get grpo -w` shows them: a
    watch of its own, because the runner's passes can block for a minute (stopping a process that ignores
    SIGTERM) while the job moves on."""

    def __init__(self, kube: Cluster, namespace: str, job: str) -> None:
        self.proc = subprocess.Popen(
            [
                kubectl_binary(), "--kubeconfig", str(kube.kubeconfig), "get", "grpojobs", "-n", namespace,
                "--field-selector", f"metadata.name={job}", "--watch", "--output-watch-events=false",
                "-o", 'jsonpath={.status.phase} {.status.reason} {.status.message}{"\\n"}',
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip

    def stop(self) -> list[tuple[str, str, str]]:
        """The statuses seen, each change once."""
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=30)
        seen: list[tuple[str, str, str]] = []
        for line in out.splitlines():
            # Phases and reasons are single words; the message is the rest of the line.
            phase, reason, message = [*line.split(" ", 2), "", ""][:3]
            if phase and (not seen or seen[-1] != (phase, reason, message)):
                seen.append((phase, reason, message))
        return seen


def job_events(kube: Cluster, namespace: str, job: dict[str, Any]) -> list[dict[str, Any]]:
    listed = kube.kubectl(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.uid={job['metadata']['uid']}",
        "-o", "json",
    )  # fmt: skip
    return list(json.loads(listed.stdout)["items"])


def test_a_vllm_slower_than_its_startup_timeout_restarts_the_gang_and_fails_the_job_when_restarts_run_out(
    kube: Cluster, namespace: str, tmp_path: Path
) -> None:
    """vLLM's real start-up (over a minute here) against startupTimeoutSeconds 60: each attempt's vLLM pod is
    replaced before it is Ready. With backoffLimit 1 the first timeout is a counted restart
    (GenerationStartupTimeout) and the second ends the job: what a user sees is the wait, the restart naming
    the vLLM pod, and the failure telling them to raise the timeout. Ending the job rather than raising the
    timeout costs two minutes of vLLM start-ups instead of a whole start and the training; a job that gets
    Running once its vLLM answers is test_non_default_vllm_and_weight_sync_ports_train_through_real_vllm's."""
    job = tiny_job()
    job["spec"]["generation"]["startupTimeoutSeconds"] = STARTUP_TIMEOUT
    job["spec"].setdefault("runPolicy", {})["backoffLimit"] = 1
    watch = StatusWatch(kube, namespace, "tiny")
    try:
        phase, _ = run_tiny_job(kube, namespace, job, tmp_path)
    finally:
        seen = watch.stop()
    assert phase == "Failed", seen

    # While vLLM started, the job said what it waited for, and for which pod.
    waiting = [m for _, reason, m in seen if reason == "WaitingForGeneration"]
    assert waiting and "waiting for vLLM pod tiny-gen-1-0 to become Ready" in waiting[0], seen
    assert "Running" not in [p for p, _, _ in seen], (
        f"a vLLM pod was Ready within {STARTUP_TIMEOUT}s: this test needs a machine where vLLM starts slower"
    )
    # Its start-up ran out: a counted restart, named after the vLLM pod, and the next attempt started.
    restarting = [m for p, reason, m in seen if (p, reason) == ("Restarting", "GenerationStartupTimeout")]
    assert restarting, seen
    timeout_words = f"did not become Ready within spec.generation.startupTimeoutSeconds ({STARTUP_TIMEOUT}s)"
    assert f"vLLM pod tiny-gen-1-0 {timeout_words}" in restarting[0], restarting
    assert "restart 1/1" in restarting[0], restarting

    final = kube.get("grpojob", "tiny", namespace)
    assert final is not None
    status = final["status"]
    assert status["restarts"] == 1 and status["trainerAttempt"] == 2
    assert status["reason"] == "BackoffLimitExceeded"
    assert f"vLLM pod tiny-gen-2-0 {timeout_words}" in status["message"], status["message"]
    assert "raise startupTimeoutSeconds" in status["message"]
    events = job_events(kube, namespace, final)
    restarted = [e["message"] for e in events if e["reason"] == "Restarting"]
    assert len(restarted) == 1 and f"vLLM pod tiny-gen-1-0 {timeout_words}" in restarted[0], restarted
    failed = [e["message"] for e in events if e["reason"] == "Failed"]
    assert failed and "tiny-gen-2-0" in failed[0], failed

    # It was the real vLLM that was too slow: both attempts started the server (the runner reports a pod
    # Ready only once its server answers /health).
    for attempt in (1, 2):
        log = (tmp_path / "run" / f"tiny-gen-{attempt}-0.log").read_text(errors="replace")
        assert "vllm.entrypoints.openai.api_server --model" in log, log[-2000:]


def test_non_default_vllm_and_weight_sync_ports_train_through_real_vllm(
    kube: Cluster, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's vllm_port and weight_sync_port settings (GRPO_OPERATOR_VLLM_PORT,
    GRPO_OPERATOR_WEIGHT_SYNC_PORT) away from their defaults: the pods, the Services and trainer.json carry
    them, and the job trains to Succeeded through real vLLM serving on that port.

    What the local run can show, and what it cannot: there is no cluster DNS or Service proxy here, so the
    runner stands in for the vLLM Service with a local port; the test gives it the port the Service
    publishes, so vLLM listens on the rendered port and the trainer, pointed at the Service's port, reaches
    it there (only the host is rewritten, to 127.0.0.1). The tiny job syncs its weights through the volume
    (no NCCL on a CPU), so the weight-sync port is checked where it is rendered, not used by this run."""
    vllm_port, weight_sync_port = free_port(), free_port()
    assert len({vllm_port, weight_sync_port, 8000, 51216, 29500, 9090}) == 6, "the defaults; pick again"
    monkeypatch.setenv("GRPO_OPERATOR_VLLM_PORT", str(vllm_port))
    monkeypatch.setenv("GRPO_OPERATOR_WEIGHT_SYNC_PORT", str(weight_sync_port))
    job = tiny_job()
    job["spec"]["grpo"]["steps"] = 2
    job["spec"]["grpo"]["validation"]["everySteps"] = 2
    job["spec"]["checkpoints"]["everySteps"] = 2
    rendered: dict[str, Any] = {}

    def record(runner: LocalJobRunner) -> None:
        """The rendered pods and trainer.json of the first attempt, before the finished job's are removed."""
        if "generation" not in rendered:
            pods = runner.pods("generation")
            if pods:
                rendered["generation"] = pods[0]
        if "trainer" not in rendered:
            pods = runner.pods("trainer")
            if pods:
                rendered["trainer"] = pods[0]
                config = kube.get("configmap", "tiny-config", namespace)
                assert config is not None
                rendered["trainer.json"] = json.loads(config["data"]["trainer.json"])
        # Once vLLM has served a completion, its pod's log as the user reads it: through the API server.
        served = tmp_path / "run" / "tiny-gen-1-0.log"
        if (
            "logs" not in rendered
            and served.exists()
            and "POST /v1/completions" in served.read_text(errors="replace")
        ):
            rendered["logs"] = subprocess.run(
                [sys.executable, "-m", "grpo_operator.kubectl_plugin", "logs", "tiny", "-n", namespace,
                 "--role", "generation", "--tail", "400"],
                env=kube.env(), capture_output=True, text=True, timeout=60,
            )  # fmt: skip

    watch = StatusWatch(kube, namespace, "tiny")
    try:
        volume = train_to_succeeded(kube, namespace, job, tmp_path, hooks=[record], vllm_port=vllm_port)
    finally:
        seen = watch.stop()

    final = kube.get("grpojob", "tiny", namespace)
    assert final is not None
    assert final["status"]["progress"]["step"] == 2 and final["status"]["restarts"] == 0
    # The job was Running only once vLLM answered: first it waited for the vLLM pod to become Ready.
    reasons = [reason for _, reason, _ in seen]
    assert "WaitingForGeneration" in reasons, seen
    assert reasons.index("WaitingForGeneration") < reasons.index("AllPodsRunning"), seen

    # The vLLM pod listens on the operator's port; its Service publishes it.
    vllm = rendered["generation"]["spec"]["containers"][0]
    args = vllm["args"]
    assert args[args.index("--port") + 1] == str(vllm_port)
    assert vllm["ports"] == [{"name": "http", "containerPort": vllm_port, "protocol": "TCP"}]
    service = kube.get("service", "tiny-gen", namespace)
    assert service is not None
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(vllm_port, "http")]
    # The trainer is pointed at the Service's port and binds the weight-sync port, which its Service
    # publishes for vLLM's workers (NCCL weight sync).
    generation = rendered["trainer.json"]["generation"]
    assert (generation["serverPort"], generation["weightSyncPort"]) == (vllm_port, weight_sync_port)
    assert generation["serverHost"].startswith(f"tiny-gen.{namespace}.svc")
    trainer_ports = {
        p["name"]: p["containerPort"] for p in rendered["trainer"]["spec"]["containers"][0]["ports"]
    }
    assert trainer_ports["weight-sync"] == weight_sync_port
    trainer_service = kube.get("service", "tiny-trainer", namespace)
    assert trainer_service is not None
    published = {p["name"]: p["port"] for p in trainer_service["spec"]["ports"]}
    assert published["weight-sync"] == weight_sync_port

    # `kubectl grpo logs --role generation` shows the vLLM pod's own log, as on a real cluster.
    logs = rendered["logs"]
    assert logs.returncode == 0, logs.stderr
    assert "# pod tiny-gen-1-0, container vllm" in logs.stderr
    assert '"POST /v1/completions HTTP/1.1" 200' in logs.stdout, logs.stdout[-2000:]

    # vLLM served the rollouts and took the weights on that port.
    log = (tmp_path / "run" / "tiny-gen-1-0.log").read_text(errors="replace")
    assert f"--port {vllm_port}" in log
    assert log.count('"POST /v1/completions HTTP/1.1" 200') >= 2
    syncs = [json.loads(line) for line in (volume / "output" / "weight_syncs.jsonl").read_text().splitlines()]
    assert syncs and all(s["in_sync"] for s in syncs), syncs
