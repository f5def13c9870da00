"""End to end through real vLLM (PyPI's CPU build, run by the test harness's local runner with the pod's own
args): what the operator makes of the vLLM pod's start-up (the operator's vLLM and weight-sync ports are
tested in test_e2e_training.py, beside the crash of a vLLM server, by one job that does both).

The local cluster starts a generation pod without making it Ready (hack/cluster/kwok-stages.yaml); the
runner reports it Ready once its vLLM server answers /health, as the kubelet does when the pod's readiness
probe passes. So the operator's start-up clock (spec.generation.startupTimeoutSeconds, from the pod's start
to Ready) runs against vLLM's real start-up here: 52-120 s on the project's 2-core machine, more beside other
tests (docs/development.md, "vLLM on the CPU")."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.kube import REPO, Cluster
from tests.harness.local_runner import LocalJobRunner
from tests.harness.status_watch import StatusWatch
from tests.integration.test_e2e_training import run_tiny_job, tiny_job
from tests.trainer.toy import read_jsonl

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.vllm]

# The API's minimum (api/workloads.py).
STARTUP_TIMEOUT = 60
# Half the timeout passes before each vLLM server starts (see the test's docstring).
VLLM_START_DELAY = STARTUP_TIMEOUT / 2


def job_events(kube: Cluster, namespace: str, job: dict[str, Any]) -> list[dict[str, Any]]:
    listed = kube.kubectl(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.uid={job['metadata']['uid']}",
        "-o", "json",
    )  # fmt: skip
    return list(json.loads(listed.stdout)["items"])


def test_a_vllm_slower_than_its_startup_timeout_restarts_the_gang_and_fails_the_job_when_restarts_run_out(
    kube: Cluster, namespace: str, tmp_path: Path
) -> None:
    """vLLM's real start-up against startupTimeoutSeconds 60: each attempt's vLLM pod is replaced before it is
    Ready. Each server starts VLLM_START_DELAY s after its pod runs, as after a slow image pull or model
    download, so the start-up runs out however fast the machine: vLLM itself takes 42 s or more to answer
    /health here (52-78 s alone, more beside other tests). With backoffLimit 1 the first timeout is a
    counted restart (GenerationStartupTimeout) and the second ends the job: what a user sees is the wait, the restart naming
    the vLLM pod, and the failure telling them to raise the timeout. Ending the job rather than raising the
    timeout costs two minutes of vLLM start-ups instead of a whole start and the training; a job that gets
    Running once its vLLM answers is test_e2e_training.py's (the job on non-default ports through a crash)."""
    job = tiny_job()
    job["spec"]["generation"]["startupTimeoutSeconds"] = STARTUP_TIMEOUT
    job["spec"].setdefault("runPolicy", {})["backoffLimit"] = 1
    watch = StatusWatch(kube, namespace, "tiny")
    try:
        phase, _ = run_tiny_job(kube, namespace, job, tmp_path, vllm_start_delay=VLLM_START_DELAY)
    finally:
        seen = watch.stop()
    assert phase == "Failed", seen

    # While vLLM started, the job said what it waited for, and for which pod.
    waiting = [m for _, reason, m in seen if reason == "WaitingForGeneration"]
    assert waiting and "waiting for vLLM pod tiny-gen-1-0 to become Ready" in waiting[0], seen
    assert "Running" not in [p for p, _, _ in seen], (
        f"a vLLM pod was Ready within {STARTUP_TIMEOUT}s although its server started {VLLM_START_DELAY:g}s late"
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


# The calculator of examples/environments/calculator, run as its image runs it (uvicorn on the pod's port).
CALCULATOR_IMAGE = "ghcr.io/grpo-operator/calculator-env:0.1.0"
CALCULATOR_DIR = REPO / "examples" / "environments" / "calculator"


def calculator_command(pod: dict[str, Any], port: int) -> list[str]:
    return [
        sys.executable, "-m", "uvicorn", "calculator_env:app", "--app-dir", str(CALCULATOR_DIR),
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip


def test_an_environment_job_trains_on_calculator_episodes_through_vllm_to_succeeded_with_the_reward_rising(
    kube: Cluster, namespace: str, tmp_path: Path
) -> None:
    """spec.environment end to end: the operator runs the example calculator as the environment pod, the
    trainer plays each prompt's G episodes of up to 3 turns through the job's real vLLM server against it,
    and the tiny model learns from the calculator's rewards (its format credit: the tiny model is far from
    computing anything) until the job Succeeds. Midway the environment's pod dies (its process killed, the
    pod deleted): the Deployment replaces it and the trainers ride it out without a restart, losing at most
    the episodes in flight."""
    job = tiny_job()
    spec = job["spec"]
    del spec["metric"]
    spec["grpo"]["validation"]["everySteps"] = 0
    # Room for 3 turns of 8 tokens and 2 calculator messages of at most 12 tokens, with the template's glue.
    spec["grpo"]["maxCompletionLength"] = 64
    spec["environment"] = {
        "image": CALCULATOR_IMAGE,
        "maxTurns": 3,
        "maxTurnTokens": 8,
        "maxObservationTokens": 12,
        "observationField": "text",
        "concurrency": 8,
        "timeoutSeconds": 30,
    }
    replaced: list[str] = []

    def replace_environment_pod_once(runner: LocalJobRunner) -> None:
        status = (kube.get("grpojob", "tiny", namespace) or {}).get("status") or {}
        if replaced or runner.environment is None or (status.get("progress") or {}).get("step", 0) < 4:
            return
        pod = runner.pods("environment")[0]["metadata"]["name"]
        runner.environment.popen.kill()  # the container dies with its pod
        kube.kubectl("delete", "pod", pod, "-n", namespace, "--wait=false")
        replaced.append(pod)

    phase, volume = run_tiny_job(
        kube,
        namespace,
        job,
        tmp_path,
        hooks=[replace_environment_pod_once],
        environment_commands={CALCULATOR_IMAGE: calculator_command},
    )
    logs = "".join(p.read_text(errors="replace")[-3000:] for p in sorted((tmp_path / "run").glob("*.log")))
    assert phase == "Succeeded", logs

    rows = read_jsonl(volume / "output" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) == spec["grpo"][
        "steps"
    ], rows
    # B x G episodes a step, several turns each; the pod's replacement cost at most the episodes in flight
    # (one step's), without a gang restart.
    assert replaced, "the environment pod was never replaced"
    assert all(r["episodes"] == 32 for r in rows), rows
    assert sum(r["environment_errors"] for r in rows) <= 32, [r["environment_errors"] for r in rows]
    clean = [r for r in rows if r["environment_errors"] == 0]
    assert len(clean) >= len(rows) - 1, rows
    assert all(r["environment_steps"] >= 32 and r["episode_turns_mean"] > 1.0 for r in clean), clean
    rewards = [r["reward_mean"] for r in rows]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.05, rewards
    episodes = read_jsonl(volume / "output" / "episodes.jsonl")
    # Every episode the environment carried acted (those in flight when its pod died failed, some at reset).
    carried = [e for e in episodes if e["outcome"] != "environment_error"]
    assert carried and all(e["turns"][0]["action"] is not None for e in carried), episodes
    # What `kubectl grpo status` shows of them: the last step's episodes, in the job's status.
    final = kube.get("grpojob", "tiny", namespace)
    assert final is not None
    assert final["status"].get("restarts", 0) == 0 and final["status"].get("trainerAttempt", 1) == 1, final
    assert final["status"]["episodes"]["count"] == 32, final["status"]
    assert final["status"]["episodes"]["environmentErrorRatio"] == 0, final["status"]
