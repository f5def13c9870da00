"""End to end, as `make demo` does it: a GRPOJob applied to the real API server, the operator running,
and the job's metric server, vLLM server (PyPI's CPU build, run with the pod's own args) and trainer run
locally by the test harness's runner (simulated nodes run no containers). The job must train a tiny model
for real through vLLM, with the weights synced to vLLM after every step, and finish Succeeded, with the
checkpoint, the status and the trainer's own log telling the same story."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

from tests.harness.kube import REPO, Cluster, wait_for
from tests.harness.kubelet_kill import kill_like_a_kubelet
from tests.harness.local_runner import LocalJobRunner
from tests.harness.operator_process import Operator
from tests.harness.ports import free_port
from tests.harness.status_watch import StatusWatch

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
    vllm_start_delay: float = 0.0,
    metric_commands: dict[str, list[str]] | None = None,
    environment_commands: dict[str, Any] | None = None,
    status_interval_seconds: float | None = None,
) -> tuple[str, Path]:
    """Applies the tiny demo's ``job`` with the operator running, seeds its claim as the demo does
    (examples/tiny/seed.py) and runs its pods locally until the job ends (``hooks`` run after every pass of
    the runner; ``vllm_port``: the runner's local port for the job's vLLM Service, free if 0;
    ``vllm_start_delay``: LocalJobRunner's; ``metric_commands``: local commands of other metric images;
    ``environment_commands``: those of environment images, for spec.environment jobs;
    ``status_interval_seconds``: LocalJobRunner's);
    returns the job's final phase and the directory that backs
    the job's claim."""
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
            {METRIC_IMAGE: [sys.executable, "examples/tiny/metric.py"], **(metric_commands or {})},
            tmp_path / "run",
            generation=generation,
            hooks=hooks or [],
            vllm_port=vllm_port,
            vllm_start_delay=vllm_start_delay,
            environment_commands=environment_commands or {},
            status_interval_seconds=status_interval_seconds,
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


def job_events(kube: Cluster, namespace: str, job: dict[str, Any]) -> list[dict[str, Any]]:
    """The Events posted about ``job`` (by its uid: not a namesake's)."""
    uid = job["metadata"]["uid"]
    listed = kube.kubectl(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.uid={uid}", "-o", "json"
    )
    items: list[dict[str, Any]] = json.loads(listed.stdout)["items"]
    return items


# vLLM is killed once this step is trained; the trainer goes on with the replacement.
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


class Rendered:
    """A runner hook: the rendered pods and trainer.json of the first attempt, before the finished job's are
    removed, and `kubectl grpo logs --role generation` once vLLM has served a completion."""

    def __init__(self, kube: Cluster, namespace: str, tmp_path: Path) -> None:
        self.kube, self.namespace, self.tmp_path = kube, namespace, tmp_path
        self.seen: dict[str, Any] = {}

    def __call__(self, runner: LocalJobRunner) -> None:
        seen = self.seen
        for role in ("generation", "trainer"):
            pods = runner.pods(role) if role not in seen else []
            if pods:
                seen[role] = pods[0]
        if "trainer" in seen and "trainer.json" not in seen:
            config = self.kube.get("configmap", "tiny-config", self.namespace)
            assert config is not None
            seen["trainer.json"] = json.loads(config["data"]["trainer.json"])
        served = self.tmp_path / "run" / "tiny-gen-1-0.log"
        if (
            "logs" not in seen
            and served.exists()
            and "POST /v1/completions" in served.read_text(errors="replace")
        ):
            seen["logs"] = subprocess.run(
                [sys.executable, "-m", "grpo_operator.kubectl_plugin", "logs", "tiny", "-n", self.namespace,
                 "--role", "generation", "--tail", "400"],
                env=self.kube.env(), capture_output=True, text=True, timeout=60,
            )  # fmt: skip


def test_a_job_on_non_default_ports_trains_through_vllm_to_succeeded_through_a_vllm_crash(
    kube: Cluster, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vLLM server dies mid-run: the operator replaces its pod alone (GenerationReplaced, not counted),
    the trainer process keeps running, waits for the new server, pushes its current weights into it before
    it generates again, and the job finishes as if nothing had happened, except for the event.

    The same job runs with the operator's vllm_port and weight_sync_port settings (GRPO_OPERATOR_VLLM_PORT,
    GRPO_OPERATOR_WEIGHT_SYNC_PORT) away from their defaults: the pods, the Services and trainer.json carry
    them, and both vLLM servers serve on that port. There is no cluster DNS or Service proxy here, so the
    runner stands in for the vLLM Service with a local port: the test gives it the port the Service
    publishes, so vLLM listens on the rendered port and the trainer, pointed at the Service's port, reaches
    it there (only the host is rewritten, to 127.0.0.1). The tiny job syncs its weights through the volume
    (no NCCL on a CPU), so the weight-sync port is checked where it is rendered, not used by this run."""
    vllm_port, weight_sync_port = free_port(), free_port()
    assert len({vllm_port, weight_sync_port, 8000, 51216, 29500, 9090}) == 6, "the defaults; pick again"
    monkeypatch.setenv("GRPO_OPERATOR_VLLM_PORT", str(vllm_port))
    monkeypatch.setenv("GRPO_OPERATOR_WEIGHT_SYNC_PORT", str(weight_sync_port))
    killer = VLLMKiller()
    rendered = Rendered(kube, namespace, tmp_path)
    watch = StatusWatch(kube, namespace, "tiny")
    try:
        volume = train_to_succeeded(
            kube, namespace, tiny_job(), tmp_path, hooks=[rendered, killer], vllm_port=vllm_port
        )
    finally:
        seen = watch.stop()
    assert killer.killed_after is not None and killer.killed_after < STEPS
    check_ports(kube, namespace, rendered.seen, vllm_port, weight_sync_port)
    # The job was Running only once vLLM answered: first it waited for the vLLM pod to become Ready.
    reasons = [reason for _, reason, _ in seen]
    assert "WaitingForGeneration" in reasons, seen
    assert reasons.index("WaitingForGeneration") < reasons.index("AllPodsRunning"), seen

    # One trainer process from the first step to the last; the second vLLM pod of attempt 1 started once the
    # first had exited.
    assert killer.runner is not None
    starts = [pod for _, event, pod in killer.runner.timeline if event == "started"]
    assert starts.count("tiny-trainer-1-0") == 1 and not any(p.startswith("tiny-trainer-2") for p in starts)
    timeline = {(event, pod): at for at, event, pod in killer.runner.timeline}
    assert timeline[("exited", "tiny-gen-1-0")] < timeline[("started", "tiny-gen-1-1")], (
        killer.runner.timeline
    )

    job = kube.get("grpojob", "tiny", namespace)
    assert job is not None
    status = job["status"]
    assert status["phase"] == "Succeeded"
    assert status["progress"]["step"] == STEPS
    assert status["rollouts"] == STEPS * 4 * 8
    assert status.get("restarts", 0) == 0 and status["trainerAttempt"] == 1

    # The replacement is an event naming the failed pod in vLLM's own words (its log tail: the termination
    # message falls back to the log) and the new pod; there was no gang restart and no resume.
    events = job_events(kube, namespace, job)
    replaced = [e["message"] for e in events if e["reason"] == "GenerationReplaced"]
    assert len(replaced) == 1, replaced
    assert "generation pod tiny-gen-1-0 failed: exit code 137" in replaced[0], replaced
    # The tail is vLLM's own log: which line is last (an access line, engine stats with vLLM's process
    # prefix) depends on timing.
    tail = replaced[0].split("exit code 137; ", 1)[1].split("; replaced by", 1)[0]
    assert "(APIServer pid=" in tail or "HTTP/1.1" in tail, replaced
    assert "replaced by vLLM pod tiny-gen-1-1" in replaced[0], replaced
    assert "not counted against backoffLimit" in replaced[0], replaced
    assert not [e for e in events if e["reason"] in ("Restarting", "ResumedFromCheckpoint")]

    # The final checkpoint exists and the atomic manifest names it.
    manifest = json.loads((volume / "checkpoints" / "latest.json").read_text())
    assert manifest["step"] == STEPS
    assert Path(manifest["path"]).is_dir()
    assert status["checkpoint"]["lastStep"] == STEPS
    assert status["checkpoint"]["path"] == manifest["path"]

    # Every step trained once, none replayed, and the status agrees with the trainer's own log.
    rows = [json.loads(line) for line in (volume / "output" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert status["rewards"]["mean"] == pytest.approx(rows[-1]["reward_mean"], abs=1e-3)
    assert status["rewards"]["formatFailureRatio"] == pytest.approx(
        rows[-1]["format_failure_ratio"], abs=1e-3
    )

    # Generation went through vLLM, which served the trained weights after every sync: before each step's
    # generation and before each validation (everySteps 4). Once the first server died, the trainer pushed
    # its current weights into the replacement (one sync marked after_replacement, at the step it was at)
    # before generating again: the probe found the trained weights served there too, and on every later sync.
    syncs = [json.loads(line) for line in (volume / "output" / "weight_syncs.jsonl").read_text().splitlines()]
    recovered = [i for i, s in enumerate(syncs) if s.get("after_replacement")]
    assert len(recovered) == 1, syncs
    at = recovered[0]
    # The hook kills at the first runner pass that sees KILL_VLLM_AFTER_STEP trained; under load the trainer
    # may be a step further by then (killed_after is the step it saw).
    assert syncs[at]["step"] in (killer.killed_after, killer.killed_after + 1), syncs
    regular = [s["step"] for i, s in enumerate(syncs) if i != at]
    assert regular == list(range(STEPS + 1)), syncs
    assert all(s["transport"] == "volume" and s["in_sync"] and s["logprob_diff"] < 0.05 for s in syncs), syncs
    served = status["servedModel"]
    assert served["inSync"] is True and served["weightSync"] == "volume"
    assert served["checkedStep"] == STEPS and served["logprobDiff"] < 0.05
    condition = next(c for c in status["conditions"] if c["type"] == "ServedModelInSync")
    assert condition["status"] == "True" and condition["reason"] == "LogprobsMatch"

    samples = [json.loads(line) for line in (volume / "output" / "samples.jsonl").read_text().splitlines()]
    assert samples and {"step", "prompt", "completion", "reward"} <= samples[0].keys()

    # It learned: the reward rose clearly from the first steps to the last.
    first = sum(r["reward_mean"] for r in rows[:3]) / 3
    last = sum(r["reward_mean"] for r in rows[-3:]) / 3
    if not (first < 0.3 and last > first + 0.4):
        # What a reader of a failed CI run needs, since the run's files are gone with it: the curve, the
        # newest logged completions and the trainer's warnings.
        curve = [(r["step"], round(r["reward_mean"], 3), round(r["format_failure_ratio"], 3)) for r in rows]
        newest = max(s["step"] for s in samples)
        completions = [(s["completion"], s["reward"]) for s in samples if s["step"] == newest][:8]
        trainer_log = (tmp_path / "run" / "tiny-trainer-1-0.log").read_text(errors="replace")
        warnings = [line[:300] for line in trainer_log.splitlines() if " WARNING " in line][:10]
        pytest.fail(
            f"reward did not rise: first {first:.3f}, last {last:.3f}; (step, reward, format failures): "
            f"{curve}; step {newest}'s completions: {completions}; trainer warnings: {warnings}"
        )
    # No false alarm on a run that learns: the learning-health diagnosis was Healthy (then, once the groups
    # tie at the top, Solved) at every step, the condition says so, and no NotLearning warning was posted.
    health = [r["learning_health"] for r in rows]
    assert set(health) <= {"Healthy", "Solved"}, health
    learning = next(c for c in status["conditions"] if c["type"] == "LearningHealthy")
    assert learning["status"] == "True" and learning["reason"] == health[-1], learning
    assert status["learning"]["reason"] == health[-1] and status["learning"]["checkedStep"] == STEPS
    assert not [e for e in events if e["reason"] == "NotLearning"], events

    # The replacement served only the trainer's weights: every reload it logged came from a sync the trainer
    # recorded after the first server died, the push into it included (when the server died during a sync,
    # that push was the sync's reload, and the sync's own record follows it without a reload of its own).
    first_log = (tmp_path / "run" / "tiny-gen-1-0.log").read_text(errors="replace")
    second_log = (tmp_path / "run" / "tiny-gen-1-1.log").read_text(errors="replace")
    for vllm_log in (first_log, second_log):
        assert "vllm.entrypoints.openai.api_server --model" in vllm_log
        assert f"--port {vllm_port}" in vllm_log
        assert vllm_log.count('"POST /v1/completions HTTP/1.1" 200') >= 2
    reloads = second_log.count('"POST /collective_rpc HTTP/1.1" 200')
    assert len(syncs) - at - 1 <= reloads <= len(syncs) - at, (reloads, len(syncs), at)


def check_ports(
    kube: Cluster, namespace: str, rendered: dict[str, Any], vllm_port: int, weight_sync_port: int
) -> None:
    """The operator's ports where the job's pods, Services and trainer.json carry them, and both vLLM servers
    served on the vLLM port."""
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


# Replica 1 is killed once this step is trained; replica 0 serves on alone.
KILL_REPLICA_AFTER_STEP = 3


class ReplicaKiller:
    """A runner hook: SIGKILLs replica 1's vLLM server once KILL_REPLICA_AFTER_STEP is trained."""

    def __init__(self) -> None:
        self.killed_after: int | None = None
        self.runner: LocalJobRunner | None = None

    def __call__(self, runner: LocalJobRunner) -> None:
        self.runner = runner
        if self.killed_after is not None:
            return
        try:
            metrics = runner.workspace() / "output" / "metrics.jsonl"
        except RuntimeError:
            return
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        step = json.loads(lines[-1])["step"] if lines else 0
        if step >= KILL_REPLICA_AFTER_STEP and "tiny-gen-r1-1-0" in runner.vllm:
            os.killpg(runner.vllm["tiny-gen-r1-1-0"].popen.pid, signal.SIGKILL)
            self.killed_after = step


def test_two_vllm_replicas_share_a_job_and_one_killed_mid_run_costs_no_restart(
    kube: Cluster, namespace: str, tmp_path: Path
) -> None:
    """spec.generation.replicas: 2 with weightSync left unset, so Broadcast: trainer rank 0 and both vLLM
    servers' workers form one gloo group (the project's vLLM plugin). Both vLLM pods sample and hold the
    trained weights after every sync; when replica 1's server is SIGKILLed mid-run the operator replaces
    that pod alone (GenerationReplaced, not counted), the one trainer process goes on with replica 0 (the
    group formed again without it), and the job Succeeds."""
    job = tiny_job()
    job["spec"]["generation"]["replicas"] = 2
    del job["spec"]["generation"]["weightSync"]
    killer = ReplicaKiller()
    volume = train_to_succeeded(kube, namespace, job, tmp_path, hooks=[killer])
    assert killer.killed_after is not None and killer.killed_after < STEPS
    assert killer.runner is not None

    # Two Services, one per replica, each selecting its replica's pods.
    for name, replica in (("tiny-gen", "0"), ("tiny-gen-r1", "1")):
        service = kube.get("service", name, namespace)
        assert service is not None
        assert service["spec"]["selector"]["grpo.dev/generation-replica"] == replica

    # One trainer process all along; replica 1's replacement started once the killed server had exited;
    # replica 0 was never replaced.
    starts = [pod for _, event, pod in killer.runner.timeline if event == "started"]
    assert starts.count("tiny-trainer-1-0") == 1 and not any(p.startswith("tiny-trainer-2") for p in starts)
    assert "tiny-gen-r1-1-1" in starts and "tiny-gen-1-1" not in starts, starts
    job_now = kube.get("grpojob", "tiny", namespace)
    assert job_now is not None
    status = job_now["status"]
    assert status["progress"]["step"] == STEPS
    assert status.get("restarts", 0) == 0 and status["trainerAttempt"] == 1
    events = job_events(kube, namespace, job_now)
    replaced = [e["message"] for e in events if e["reason"] == "GenerationReplaced"]
    assert len(replaced) == 1 and "vLLM replica 1" in replaced[0], replaced
    assert "replaced by vLLM pod tiny-gen-r1-1-1" in replaced[0], replaced
    assert not [e for e in events if e["reason"] in ("Restarting", "ResumedFromCheckpoint")]

    # Before the kill both replicas served the trained weights after every sync and both sampled; after it,
    # replica 0 alone, and every step was trained once.
    syncs = [json.loads(line) for line in (volume / "output" / "weight_syncs.jsonl").read_text().splitlines()]
    serving = [s["replicas"]["serving"] for s in syncs]
    left = serving.index([0])
    both, alone = syncs[:left], syncs[left:]
    assert both and all(s == [0, 1] for s in serving[:left]), serving
    assert all(n > 0 for n in both[-1]["replicas"]["requests"]), both[-1]
    for sync in both:
        assert max(sync["replicas"]["logprob_diff"].values()) < 0.05, sync
    # Replica 1 stayed out, unless its replacement got Ready before the last step: then it rejoined once,
    # at a sync, with the current weights.
    back = next((i for i, s in enumerate(alone) if s["replicas"]["serving"] == [0, 1]), len(alone))
    assert all(s["replicas"]["serving"] == [0] for s in alone[:back]), serving
    assert all(s["replicas"]["serving"] == [0, 1] for s in alone[back:]), serving
    if back < len(alone):
        assert alone[back]["replicas"]["rejoined"] == [1], alone[back]
    served = status["servedModel"]
    assert served["replicas"] == 2 and served["replicasServing"] == len(serving[-1]), served
    assert all(s["in_sync"] for s in syncs), syncs
    rows = [json.loads(line) for line in (volume / "output" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for pod in ("tiny-gen-1-0", "tiny-gen-r1-1-0"):
        served = (tmp_path / "run" / f"{pod}.log").read_text(errors="replace")
        assert served.count('"POST /v1/completions HTTP/1.1" 200') >= 2, pod
        # The weights arrived by broadcast (the update routes), never through the volume's reload.
        assert served.count('"POST /finish_weight_update HTTP/1.1" 200') >= 2, pod
        assert '"POST /collective_rpc HTTP/1.1"' not in served, pod
    assert all(s["transport"] == "broadcast" for s in syncs), syncs
    # The vLLM pods mount the job's ReadWriteMany volume, so each replica's log of the attempt is kept there
    # (the killed server's with its replacement's), past the pods' deletion.
    for index in (0, 1):
        kept = (volume / "output" / "logs" / "attempt-1" / f"vllm-{index}.log").read_text(errors="replace")
        assert kept.count('"POST /v1/completions HTTP/1.1" 200') >= 2, index


def test_a_colocated_job_trains_with_vllm_inside_the_trainer_to_succeeded(
    kube: Cluster, namespace: str, tmp_path: Path
) -> None:
    """spec.generation.mode: Colocate. The operator creates no vLLM pod, Service or NetworkPolicy; the one
    trainer process starts vLLM's engine itself (the runner gives it a python with vLLM, as the trainer image
    has), samples every step through it, hands it the trained weights in memory after every step, and the
    job Succeeds with the engine serving the trained weights."""
    job = tiny_job()
    job["spec"]["generation"] = {"mode": "Colocate", "maxModelLen": 64}
    # Without a vLLM pod on another node, the model on the job's volume needs no ReadWriteMany claim.
    job["spec"]["checkpoints"]["volume"]["accessMode"] = "ReadWriteOnce"
    rendered = Rendered(kube, namespace, tmp_path)
    volume = train_to_succeeded(kube, namespace, job, tmp_path, hooks=[rendered])
    assert "generation" not in rendered.seen, "a colocated job created a vLLM pod"
    assert rendered.seen["trainer.json"]["generation"]["backend"] == "vllm-colocate"
    for kind, name in (("service", "tiny-gen"), ("networkpolicy", "tiny-gen")):
        assert kube.get(kind, name, namespace) is None, f"{kind} {name} exists"

    job_now = kube.get("grpojob", "tiny", namespace)
    assert job_now is not None
    status = job_now["status"]
    assert status["progress"]["step"] == STEPS
    assert status.get("restarts", 0) == 0 and status["trainerAttempt"] == 1
    served = status["servedModel"]
    assert served["weightSync"] == "colocate" and served["inSync"] is True, served
    events = job_events(kube, namespace, job_now)
    (created,) = [e["message"] for e in events if e["reason"] == "Created"]
    assert "no vLLM pod (generation colocated in the trainer processes)" in created

    # The weights reached the engine before the first step (the model as loaded) and after every step, and
    # each time it served them.
    syncs = [json.loads(line) for line in (volume / "output" / "weight_syncs.jsonl").read_text().splitlines()]
    assert [s["step"] for s in syncs] == list(range(STEPS + 1)), syncs
    assert all(s["transport"] == "colocate" and s["in_sync"] for s in syncs), syncs
    rows = [json.loads(line) for line in (volume / "output" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    log = (tmp_path / "run" / "tiny-trainer-1-0.log").read_text(errors="replace")
    # vLLM's engine ran inside the trainer process, with trainer.json's context length.
    assert "colocated vLLM engine started in" in log and "max_model_len 64, memory share 0.3" in log, log[
        -3000:
    ]


class TrainerKiller:
    """A runner hook: SIGKILLs the trainer (exit 137, as a kubelet reports an OOM kill) once the checkpoint of
    step 4 is published, and notes when."""

    def __init__(self, kube: Cluster, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.killed_at: float | None = None
        self.runner: LocalJobRunner | None = None

    def __call__(self, runner: LocalJobRunner) -> None:
        self.runner = runner
        if self.killed_at is not None or "tiny-trainer-1-0" not in runner.trainers:
            return
        status = (self.kube.get("grpojob", "tiny", self.namespace) or {}).get("status") or {}
        if (status.get("checkpoint") or {}).get("lastStep", 0) >= 4:
            kill_like_a_kubelet(self.kube, runner, "tiny-trainer-1-0")
            self.killed_at = time.monotonic()


def test_a_killed_trainer_is_replaced_beside_the_running_vllm_server(
    kube: Cluster, namespace: str, tmp_path: Path
) -> None:
    """The demo job (weightSync: Volume) with a real vLLM server: the trainer is SIGKILLed after the
    checkpoint of step 4, the operator restarts the trainers alone (counted), the new trainer resumes from
    that checkpoint beside the same vLLM server, pushes its weights into it before its first step, and the
    job Succeeds with the server in sync after every sync. At the numerics users get (model.dtype bfloat16
    over fp32 masters, lr 1e-6): the restarted trainers' steps move the weights. Prints the time saved: the
    vLLM start-up the restart did not pay."""
    job = tiny_job()
    job["spec"]["model"]["dtype"] = "bfloat16"
    job["spec"]["grpo"]["learningRate"] = 1e-6
    killer = TrainerKiller(kube, namespace)
    volume = train_to_succeeded(kube, namespace, job, tmp_path, hooks=[killer])
    assert killer.killed_at is not None and killer.runner is not None
    timeline = killer.runner.timeline
    starts = [pod for _, event, pod in timeline if event == "started"]
    assert starts.count("tiny-gen-1-0") == 1 and not any(p.startswith("tiny-gen-2") for p in starts), starts
    assert "tiny-trainer-2-0" in starts, starts
    status = (kube.get("grpojob", "tiny", namespace) or {})["status"]
    assert (status["restarts"], status["trainerAttempt"], status["generationAttempt"]) == (1, 2, 1)
    assert status["progress"]["step"] == STEPS and status["servedModel"]["inSync"] is True
    events = job_events(kube, namespace, kube.get("grpojob", "tiny", namespace) or {})
    (restart,) = [e["message"] for e in events if e["reason"] == "Restarting"]
    assert "beside the running vLLM pods of attempt 1" in restart, restart

    # The new trainer pushed its weights (step 4's) into the kept server before its first step, and every
    # sync of both attempts left the server serving the trained weights.
    syncs = [json.loads(line) for line in (volume / "output" / "weight_syncs.jsonl").read_text().splitlines()]
    assert all(s["in_sync"] for s in syncs), syncs
    steps = [s["step"] for s in syncs]
    # The checkpoint it resumed from: step 4's, or a later one published before the kill reached it.
    found = re.search(r"checkpoints/step-(\d+)", restart)
    assert found is not None, restart
    resumed = int(found.group(1))
    assert resumed >= 4 and resumed in steps and steps[-1] == STEPS, (resumed, steps)
    # The last two checkpoints (keepLast 2), both written after the restart's resume point or the second
    # by the restarted trainers: at lr 1e-6 their steps moved the fp32 masters (the embedding apart: only
    # the rows of sampled tokens get a gradient).
    from safetensors.torch import load_file

    def weights(step: int) -> dict[str, Any]:
        files = sorted((volume / "checkpoints" / f"step-{step}").glob("*.safetensors"))
        return {k: v for f in files for k, v in load_file(str(f)).items()}

    before, last = weights(STEPS - 4), weights(STEPS)
    body = [k for k in last if k != "model.embed_tokens.weight"]
    moved = sum(int((last[k] != before[k]).sum()) for k in body) / sum(last[k].numel() for k in body)
    assert moved >= 0.99, (
        f"only {moved:.2%} of the non-embedding weights moved over steps {STEPS - 3}-{STEPS}"
    )

    # Time, printed (not asserted): the first gang from the vLLM pod's start to its first step, against the
    # restart from the kill to the new trainer's first step; the difference is the vLLM start-up (model load,
    # here a tiny model on the CPU) the restart did not repeat.
    to_wall = time.time() - time.monotonic()
    started = {pod: t + to_wall for t, event, pod in timeline if event == "started"}
    rows = [json.loads(line) for line in (volume / "output" / "metrics.jsonl").read_text().splitlines()]
    stamps = [(r["step"], datetime.fromisoformat(r["time"]).timestamp()) for r in rows]
    killed = killer.killed_at + to_wall
    first_gang = stamps[0][1] - started["tiny-gen-1-0"]
    restarted = next(t for _, t in stamps if t > killed) - killed
    print(
        f"first gang: vLLM pod started -> step 1 in {first_gang:.1f}s; trainer-only restart: kill -> first "
        f"step of attempt 2 in {restarted:.1f}s; saved {first_gang - restarted:.1f}s"
    )
