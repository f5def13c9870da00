"""End to end, as `make demo` does it: a GRPOJob applied to the real API server, the operator running,
and the job's metric server, vLLM server (PyPI's CPU build, run with the pod's own args) and trainer run
locally by the test harness's runner (simulated nodes run no containers). The job must train a tiny model
for real through vLLM, with the weights synced to vLLM after every step, and finish Succeeded, with the
checkpoint, the status and the trainer's own log telling the same story."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

from tests.harness.kube import REPO, Cluster, wait_for
from tests.harness.local_runner import LocalJobRunner
from tests.harness.operator_process import Operator

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.vllm]

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


def run_tiny_job(
    kube: Cluster,
    namespace: str,
    job: dict[str, Any],
    tmp_path: Path,
    generation: Literal["vllm", "in-process-transformers"] = "vllm",
    hooks: list[Callable[[LocalJobRunner], None]] | None = None,
    vllm_port: int = 0,
) -> tuple[str, Path]:
    """Applies the tiny demo's ``job`` with the operator running, seeds its claim as the demo does
    (examples/tiny/seed.py) and runs its pods locally until the job ends (``hooks`` run after every pass of
    the runner; ``vllm_port``: the runner's local port for the job's vLLM Service, free if 0); returns the
    job's final phase and the directory that backs the job's claim."""
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
            generation=generation,
            hooks=hooks or [],
            vllm_port=vllm_port,
        )
        phase = runner.run(timeout=1200)
    finally:
        operator.stop()
    return phase, volume


def train_to_succeeded(
    kube: Cluster,
    namespace: str,
    job: dict[str, Any],
    tmp_path: Path,
    generation: Literal["vllm", "in-process-transformers"] = "vllm",
    hooks: list[Callable[[LocalJobRunner], None]] | None = None,
    vllm_port: int = 0,
) -> Path:
    """:func:`run_tiny_job`, asserting that the job Succeeded; returns the directory that backs its claim."""
    phase, volume = run_tiny_job(kube, namespace, job, tmp_path, generation, hooks, vllm_port)
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in (tmp_path / "run").glob("*.log"))
    assert phase == "Succeeded", f"job ended {phase}; runner logs:\n{logs}"
    return volume


# vLLM is killed once this step is trained: after the checkpoint of step 4, so steps 5-6 are replayed.
KILL_VLLM_AFTER_STEP = 6


class VLLMKiller:
    """A runner hook: SIGKILLs the vLLM server (all its processes) once KILL_VLLM_AFTER_STEP is trained."""

    def __init__(self) -> None:
        self.metrics: Path | None = None
        self.killed_after: int | None = None
        self.killed_at = 0.0
        self.runner: LocalJobRunner | None = None

    def __call__(self, runner: LocalJobRunner) -> None:
        self.runner = runner
        if self.killed_after is not None or not runner.vllm:
            return
        if self.metrics is None:
            try:
                self.metrics = runner.workspace() / "output" / "metrics.jsonl"
            except RuntimeError:
                return
        lines = self.metrics.read_text().splitlines() if self.metrics.exists() else []
        step = json.loads(lines[-1])["step"] if lines else 0
        if step >= KILL_VLLM_AFTER_STEP:
            for proc in runner.vllm.values():
                os.killpg(proc.popen.pid, signal.SIGKILL)
            self.killed_after = step
            self.killed_at = time.monotonic()


def test_a_job_trains_through_vllm_to_succeeded_through_a_vllm_crash(
    kube: Cluster, namespace: str, tmp_path: Path
) -> None:
    killer = VLLMKiller()
    volume = train_to_succeeded(kube, namespace, tiny_job(), tmp_path, hooks=[killer])
    assert killer.killed_after is not None and killer.killed_after < STEPS

    # Fencing: the second attempt's processes started only once both of the first attempt's had exited,
    # so the old trainer's retries could not reach (and reload stale weights into) the new vLLM server.
    assert killer.runner is not None
    timeline = {(event, pod): at for at, event, pod in killer.runner.timeline}
    first_gone = max(timeline[("exited", "tiny-trainer-1-0")], timeline[("exited", "tiny-gen-1-0")])
    assert first_gone < timeline[("started", "tiny-gen-2-0")], killer.runner.timeline
    assert first_gone < timeline[("started", "tiny-trainer-2-0")], killer.runner.timeline
    # The old trainer, backing off from the dead server, gave up at SIGTERM instead of retrying for a
    # minute: the restart was not held up by it.
    trainer_gone = timeline[("exited", "tiny-trainer-1-0")] - killer.killed_at
    assert trainer_gone < 30, f"the first attempt's trainer exited {trainer_gone:.0f}s after vLLM died"

    job = kube.get("grpojob", "tiny", namespace)
    assert job is not None
    status = job["status"]
    assert status["phase"] == "Succeeded"
    assert status["progress"]["step"] == STEPS
    assert status["rollouts"] == STEPS * 4 * 8

    # The crash was the documented restart: counted, named after the vLLM pod, resumed from step 4.
    assert status["restarts"] == 1
    uid = job["metadata"]["uid"]
    listed = kube.kubectl(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.uid={uid}", "-o", "json"
    )
    events = json.loads(listed.stdout)["items"]
    restarting = [e["message"] for e in events if e["reason"] == "Restarting"]
    assert restarting and "generation pod tiny-gen-1-0 failed: exit code 137" in restarting[0], restarting
    # The pod's termination message is vLLM's log tail (terminationMessagePolicy FallbackToLogsOnError):
    # the event quotes vLLM's own last words.
    assert "HTTP/1.1" in restarting[0], restarting
    resumed = [e["message"] for e in events if e["reason"] == "ResumedFromCheckpoint"]
    assert resumed and "step-4" in resumed[0], resumed

    # The final checkpoint exists and the atomic manifest names it.
    manifest = json.loads((volume / "checkpoints" / "latest.json").read_text())
    assert manifest["step"] == STEPS
    assert Path(manifest["path"]).is_dir()
    assert status["checkpoint"]["lastStep"] == STEPS
    assert status["checkpoint"]["path"] == manifest["path"]

    # The status the trainer patched agrees with its own per-step log (replayed steps logged once).
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

    # Generation went through vLLM, which served the trained weights after every step's sync: before each
    # step's generation and before each validation (everySteps 4), in both attempts. The first sync of the
    # second attempt pushes the weights of the checkpoint it resumed from (step 4) into the new server,
    # which started with the base model: from then on it serves the trained weights again.
    syncs = [json.loads(line) for line in (volume / "output" / "weight_syncs.jsonl").read_text().splitlines()]
    steps = [s["step"] for s in syncs]
    restart_at = next(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])
    # The first attempt synced before each step up to the kill (the sync before step 7 may have happened).
    assert steps[:restart_at] == list(range(restart_at)) and restart_at >= KILL_VLLM_AFTER_STEP, steps
    assert steps[restart_at:] == list(range(4, STEPS + 1)), steps
    assert all(s["transport"] == "volume" and s["in_sync"] and s["logprob_diff"] < 0.05 for s in syncs), syncs
    served = status["servedModel"]
    assert served["inSync"] is True and served["weightSync"] == "volume"
    assert served["checkedStep"] == STEPS and served["logprobDiff"] < 0.05
    condition = next(c for c in status["conditions"] if c["type"] == "ServedModelInSync")
    assert condition["status"] == "True" and condition["reason"] == "LogprobsMatch"
    for attempt, syncs_served in ((1, restart_at), (2, len(steps) - restart_at)):
        vllm_log = (tmp_path / "run" / f"tiny-gen-{attempt}-0.log").read_text(errors="replace")
        assert "vllm.entrypoints.openai.api_server --model" in vllm_log
        assert vllm_log.count('"POST /v1/completions HTTP/1.1" 200') >= 2
        reloads = vllm_log.count('"POST /collective_rpc HTTP/1.1" 200')
        if attempt == 1:
            # The SIGKILL takes the pod's supervisor with vLLM (the whole process group, as a container kill
            # does): the last lines vLLM wrote to its pipe that the supervisor had not copied yet are lost,
            # so the killed server's log may miss its last reloads. It may show one more than the trainer
            # recorded: a sync is recorded after the served-model probe that follows its reload, and the kill
            # can fall between the two.
            assert syncs_served - 3 <= reloads <= syncs_served + 1, (reloads, syncs_served)
        else:
            # Exact: the first attempt's trainer had exited before this server started (the fencing above),
            # so every reload it served came from the second attempt's trainer.
            assert reloads == syncs_served, (reloads, syncs_served)
