"""`kubectl grpo` against the real local control plane, invoked through the real kubectl binary with
the plugin on PATH, on a job that trained for real (the demo's path: operator + the harness's local
runner): while it runs, after it succeeded, and after its pods are gone.

What is real here: kubectl's plugin discovery and argument passing, the job lookup, status, events and
pod reads, the SelfSubjectAccessReviews, the reader pod (created, scheduled — beside the running
trainer while one runs — reported Running, deleted), suspend/resume patches and the operator acting on
them, and every byte printed. What is not: nodes are simulated (kwok), so no container runs and
`kubectl exec` into the reader pod cannot work; the tests select the plugin's hostPath transport
(KUBECTL_GRPO_VOLUME_ACCESS=hostpath), which reads the directory behind the claim's PersistentVolume
instead of exec-ing `tail`/`ls`/`tar` in the reader pod.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.kube import REPO, Cluster, helm_binary, kubectl_binary, wait_for
from tests.harness.local_runner import TERMINAL, LocalJobRunner
from tests.harness.operator_process import Operator
from tests.harness.readiness import generation_ready

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

STEPS = 6
METRIC_IMAGE = "ghcr.io/grpo-operator/metric-tiny-demo:0.1.0"
BARS = set("▁▂▃▄▅▆▇█")


def plugin_path(tmp: Path) -> str:
    """PATH with a `kubectl-grpo` executable (what `pip install` puts in the environment's bin) first,
    then the project's kubectl."""
    bin_dir = tmp / "plugin-bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "kubectl-grpo"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m grpo_operator.kubectl_plugin "$@"\n')
    shim.chmod(0o755)
    return os.pathsep.join([str(bin_dir), str(Path(kubectl_binary()).parent), os.environ["PATH"]])


@dataclass
class Plugin:
    kube: Cluster
    namespace: str
    path: str
    kubeconfig: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "PATH": self.path,
            "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO / "trainer_image")]),
            "KUBECONFIG": str(self.kubeconfig or self.kube.kubeconfig),
            "KUBECTL_GRPO_VOLUME_ACCESS": "hostpath",
            **self.env,
        }

    def argv(self, args: tuple[str, ...]) -> list[str]:
        ns = ["-n", self.namespace] if self.kubeconfig is None else []
        return [kubectl_binary(), "grpo", *args, *ns]

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(args), env=self.environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def __call__(self, *args: str, check: int | None = 0) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.argv(args), env=self.environment(), capture_output=True, text=True, timeout=180
        )
        if check is not None:
            assert proc.returncode == check, (
                f"kubectl grpo {' '.join(args)} exited {proc.returncode}, expected {check}:\n"
                f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
            )
        return proc


@dataclass
class Trained:
    namespace: str
    volume: Path
    plugin: Plugin
    during_run: dict[str, Any]


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def claim_dir(kube: Cluster, namespace: str, claim: str) -> Path:
    def bound() -> str | None:
        pvc = kube.get("pvc", claim, namespace) or {}
        return (
            (pvc.get("spec") or {}).get("volumeName")
            if (pvc.get("status") or {}).get("phase") == "Bound"
            else None
        )

    pv = kube.get("pv", wait_for(f"claim {claim} bound", bound, timeout=60))
    assert pv is not None
    return Path(pv["spec"]["hostPath"]["path"])


def no_reader_pods(kube: Cluster, namespace: str) -> bool:
    out = kube.kubectl("get", "pods", "-n", namespace, "-l", "grpo.dev/reader-for", "-o", "name").stdout
    return not out.strip()


@pytest.fixture(scope="module")
def trained(kube: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trained]:
    sys.path.insert(0, str(REPO / "examples" / "tiny"))
    from seed import seed  # examples/tiny/seed.py: the demo's volume preparation

    tmp = tmp_path_factory.mktemp("plugin")
    namespace = kube.new_namespace("plugin")
    plugin = Plugin(kube, namespace, plugin_path(tmp))
    job = yaml.safe_load((REPO / "examples" / "tiny" / "grpojob.yaml").read_text())
    job["spec"]["grpo"]["steps"] = STEPS
    job["spec"]["grpo"]["validation"]["everySteps"] = 3
    job["spec"]["checkpoints"].update(everySteps=3, keepLast=2)
    job["spec"]["tracking"] = {"tensorBoard": {"enabled": True}}
    operator = Operator(kube, namespace, tmp / "operator.log")
    operator.start()
    during: dict[str, Any] = {}
    try:
        kube.apply(job, namespace)
        volume = claim_dir(kube, namespace, "tiny-ckpt")
        seed(volume)
        runner = LocalJobRunner(
            kube,
            namespace,
            "tiny",
            {METRIC_IMAGE: [sys.executable, "examples/tiny/metric.py"]},
            tmp / "run",
            # What the plugin shows of a running job; vLLM's own start-up is not what this tests.
            generation="in-process-transformers",
        )
        runner.workdir.mkdir(parents=True, exist_ok=True)
        # run() of the runner, unrolled so the plugin can read the job while its trainer runs.
        try:
            for _ in range(900):
                phase = runner.job_phase()
                if phase in TERMINAL and not runner.trainers:
                    break
                runner.step()
                metrics = volume / "output" / "metrics.jsonl"
                if not during and runner.trainers:
                    # A step of the tiny model takes tens of milliseconds: watch closely for the second one,
                    # then hold the trainer still while the plugin reads, so "while it runs" and "follow
                    # sees later steps" do not depend on how fast this machine trains.
                    deadline = time.monotonic() + 300
                    while not (metrics.exists() and len(jsonl(metrics)) >= 2):
                        alive = all(p.popen.poll() is None for p in runner.trainers.values())
                        if not alive or time.monotonic() > deadline:
                            break
                        time.sleep(0.01)
                    for proc in runner.trainers.values():
                        proc.popen.send_signal(signal.SIGSTOP)
                    try:
                        for _ in range(60):  # the operator reports Running once every pod runs
                            if runner.job_phase() == "Running":
                                break
                            time.sleep(0.5)
                        trainer = json.loads(
                            kube.kubectl(
                                "get", "pods", "-n", namespace, "-l", "grpo.dev/role=trainer", "-o", "json"
                            ).stdout
                        )["items"][0]
                        during["node"] = trainer["spec"]["nodeName"]
                        # Follows the samples file until the job has finished, then exits by itself.
                        follow = plugin.popen("samples", "tiny", "--follow", "-o", "json", "--interval", "1")
                        assert follow.stdout is not None
                        during["follow_first"] = follow.stdout.readline()
                        during["follow"] = follow
                        rewards = plugin.popen("rewards", "tiny", "--follow", "-o", "json", "--interval", "1")
                        assert rewards.stdout is not None
                        during["rewards_first"] = rewards.stdout.readline()
                        during["rewards_follow"] = rewards
                        during["samples"] = plugin("samples", "tiny", "-o", "json").stdout
                        during["status"] = plugin("status", "tiny").stdout
                        during["events"] = kube.kubectl(
                            "get", "events", "-n", namespace, "--field-selector", "involvedObject.kind=Pod",
                            "-o", "json",
                        ).stdout  # fmt: skip
                    finally:
                        for proc in runner.trainers.values():
                            proc.popen.send_signal(signal.SIGCONT)
                time.sleep(1)
        finally:
            runner.close()
        assert runner.job_phase() == "Succeeded", operator.log_tail()[-3000:]
        if "follow" in during:
            follow = during["follow"]
            follow.wait(timeout=120)
            # Not communicate(): it reads the pipe's descriptor and would skip what readline() buffered.
            out, err = follow.stdout.read(), follow.stderr.read()
            during["follow"] = (follow.returncode, during["follow_first"] + out, err)
        if "rewards_follow" in during:
            rewards = during["rewards_follow"]
            rewards.wait(timeout=120)
            out, err = rewards.stdout.read(), rewards.stderr.read()
            during["rewards_follow"] = (rewards.returncode, during["rewards_first"] + out, err)
        yield Trained(namespace, volume, plugin, during)
    finally:
        operator.stop()
        kube.delete_namespace(namespace)


def test_while_the_job_runs_the_plugin_reads_its_volume_beside_the_trainer(
    kube: Cluster, trained: Trained
) -> None:
    during = trained.during_run
    assert during, "the job finished before the plugin could read it while running"
    samples = json.loads(during["samples"])
    assert samples and all({"prompt", "completion", "reward"} <= s.keys() for s in samples)
    assert "Phase           Running" in during["status"]
    # The reader pod was scheduled onto the trainer's node (a ReadWriteOnce claim mounts on one node).
    scheduled = [
        e for e in json.loads(during["events"])["items"]
        if "-reader-" in e["involvedObject"]["name"] and e["reason"] == "Scheduled"
    ]  # fmt: skip
    assert not scheduled or all(during["node"] in e["message"] for e in scheduled)
    assert no_reader_pods(kube, trained.namespace)


def test_samples_follow_prints_each_new_step_and_stops_when_the_job_has_finished(trained: Trained) -> None:
    code, out, err = trained.during_run["follow"]
    assert code == 0, err
    followed = [json.loads(line) for line in out.splitlines()]
    first = followed[0]["step"]
    train = [s for s in jsonl(trained.volume / "output" / "samples.jsonl") if s["split"] == "train"]
    # The newest step when it started, then every later step's samples once, in order.
    assert followed == [s for s in train if s["step"] >= first]
    assert followed[-1]["step"] == STEPS and first < STEPS


def test_rewards_follow_prints_every_step_once_and_stops_when_the_job_has_finished(trained: Trained) -> None:
    code, out, err = trained.during_run["rewards_follow"]
    assert code == 0, err
    followed = [json.loads(line) for line in out.splitlines()]
    # The steps written before it started, then each later one as it came: every step once, in order.
    assert followed == jsonl(trained.volume / "output" / "metrics.jsonl")
    assert [r["step"] for r in followed] == list(range(1, STEPS + 1))


def test_status_shows_phase_step_trends_checkpoint_and_conditions(trained: Trained) -> None:
    rows = jsonl(trained.volume / "output" / "metrics.jsonl")
    out = trained.plugin("status", "tiny").stdout
    lines = out.splitlines()
    assert lines[0] == f"GRPOJob {trained.namespace}/tiny"
    assert "Phase           Succeeded (Completed)" in out
    assert f"Step            {STEPS}/{STEPS}" in out
    reward = next(line for line in lines if line.startswith("Reward"))
    assert f"{rows[-1]['reward_mean']:.4f}" in reward
    spark = reward.split()[2]
    assert len(spark) == STEPS and set(spark) <= BARS, reward
    assert next(line for line in lines if line.startswith("Format failures")).split()[2].endswith("%")
    validation = next(line for line in lines if line.startswith("Validation"))
    assert (
        f"{[r for r in rows if r.get('validation_mean') is not None][-1]['validation_mean']:.4f}"
        in validation
    )
    # The path the trainer reported (here the local runner's stand-in for /workspace) and its age.
    assert re.search(
        rf"^Checkpoint      step {STEPS}  \S*/checkpoints/step-{STEPS}  \(\d+[ms]\S* ago\)$", out, re.M
    ), out
    assert "Restarts        0" in out
    assert any(line.split()[:2] == ["Succeeded", "True"] for line in lines if line.startswith("  "))

    data = json.loads(trained.plugin("status", "tiny", "-o", "json").stdout)
    assert data["status"]["phase"] == "Succeeded"
    assert data["trend"]["reward"] == pytest.approx([r["reward_mean"] for r in rows])
    assert yaml.safe_load(trained.plugin("status", "tiny", "-o", "yaml").stdout)["trend"] == data["trend"]


def test_samples_prints_prompts_completions_and_rewards(trained: Trained) -> None:
    samples = jsonl(trained.volume / "output" / "samples.jsonl")
    last = [s for s in samples if s["split"] == "train" and s["step"] == STEPS]
    out = trained.plugin("samples", "tiny").stdout
    assert f"── step {STEPS} · train ──" in out
    assert out.count("PROMPT") == len({s["prompt"] for s in last})
    for s in last:
        assert f"  │ {s['prompt']}" in out
        assert f"reward {s['reward']:+.4f}" in out

    best = json.loads(trained.plugin("samples", "tiny", "--best", "--limit", "1", "-o", "json").stdout)
    # The best group of the newest five steps, whole: one step, one prompt, best completion first.
    assert len({(s["step"], s["prompt"]) for s in best}) == 1 and best[0]["step"] > STEPS - 5
    group = [s for s in samples if (s["step"], s["prompt"]) == (best[0]["step"], best[0]["prompt"])]
    assert sorted(s["reward"] for s in best) == sorted(s["reward"] for s in group)
    assert [s["reward"] for s in best] == sorted((s["reward"] for s in best), reverse=True)
    worst = json.loads(trained.plugin("samples", "tiny", "--worst", "--step", "2", "-o", "json").stdout)
    assert {s["step"] for s in worst} == {2} and [s["reward"] for s in worst] == sorted(
        s["reward"] for s in worst
    )
    val = json.loads(trained.plugin("samples", "tiny", "--split", "validation", "-o", "json").stdout)
    assert val and {s["split"] for s in val} == {"validation"} and {s["step"] for s in val} == {STEPS}

    missing = trained.plugin("samples", "tiny", "--step", "99", check=3)
    assert "no train samples at step 99" in missing.stderr and "Succeeded" in missing.stderr


def test_rewards_table_and_png(trained: Trained, tmp_path: Path) -> None:
    rows = jsonl(trained.volume / "output" / "metrics.jsonl")
    png = tmp_path / "reward.png"
    proc = trained.plugin("rewards", "tiny", "--plot", str(png))
    table = proc.stdout.splitlines()
    assert table[0].split() == [
        "STEP",
        "REWARD",
        "STD",
        "FORMAT-FAIL",
        "NO-SIGNAL",
        "TRUNCATED",
        "VALIDATION",
    ]
    body = table[1 : 1 + STEPS]
    assert [line.split()[0] for line in body] == [str(s) for s in range(1, STEPS + 1)]
    assert [line.split()[1] for line in body] == [f"{r['reward_mean']:.4f}" for r in rows]
    # The share of completions cut off at maxCompletionLength, as the trainer recorded it.
    assert [line.split()[5] for line in body] == [f"{100 * r['truncated_ratio']:.1f}%" for r in rows]
    with_validation = [line.split()[0] for line in body if len(line.split()) == 7]
    assert with_validation == ["3", str(STEPS)]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"written to {png}" in proc.stderr
    assert json.loads(trained.plugin("rewards", "tiny", "-o", "json").stdout) == rows


def test_checkpoints_and_export(trained: Trained, tmp_path: Path) -> None:
    out = trained.plugin("checkpoints", "tiny").stdout.splitlines()
    assert out[0].split() == ["STEP", "LATEST", "PATH"]
    assert [line.split() for line in out[1:3]] == [
        ["3", "/workspace/checkpoints/step-3"],
        [str(STEPS), "*", f"/workspace/checkpoints/step-{STEPS}"],
    ]
    assert out[3] == "Final model: /workspace/output/model"
    listing = json.loads(trained.plugin("checkpoints", "tiny", "-o", "json").stdout)
    assert listing["latest"]["step"] == STEPS and listing["finalModel"] == "/workspace/output/model"

    model = tmp_path / "model"
    proc = trained.plugin("export", "tiny", "--to", str(model))
    assert "exported /workspace/output/model" in proc.stdout and str(model) in proc.stdout
    source = trained.volume / "output" / "model"
    assert sorted(p.name for p in model.iterdir()) == sorted(p.name for p in source.iterdir())
    assert (model / "config.json").read_bytes() == (source / "config.json").read_bytes()

    step3 = tmp_path / "step-3"
    trained.plugin("export", "tiny", "--step", "3", "--to", str(step3))
    assert (step3 / "grpo_state.json").exists()
    gone = trained.plugin("export", "tiny", "--step", "1", "--to", str(tmp_path / "x"), check=3)
    assert "no checkpoint at step 1" in gone.stderr and f"[3, {STEPS}]" in gone.stderr
    busy = trained.plugin("export", "tiny", "--to", str(model), check=1)
    assert "not an empty directory" in busy.stderr

    # spec.tracking.tensorBoard: the trainer's event files, through the operator's trainer.json.
    board = tmp_path / "tensorboard"
    proc = trained.plugin("export", "tiny", "--tensorboard", "--to", str(board))
    assert "exported /workspace/output/tensorboard" in proc.stdout
    assert f"tensorboard --logdir {board}" in proc.stdout
    assert [p.name for p in board.iterdir() if p.name.startswith("events.out.tfevents.")]


def test_status_watch_of_a_finished_job_reports_once_with_its_trend(trained: Trained) -> None:
    watched = trained.plugin("status", "tiny", "--watch", "--interval", "1").stdout
    assert watched.count("(every 1s until the job finishes; Ctrl-C stops)") == 1
    assert "Phase           Succeeded" in watched
    reward = next(line for line in watched.splitlines() if line.startswith("Reward"))
    assert set(reward.split()[2]) <= BARS, reward  # the trend, read through the watch's one reader pod


def test_a_trainer_attempts_log_is_kept_on_the_volume(trained: Trained) -> None:
    kept = trained.plugin("logs", "tiny", "--attempt", "1")
    assert "(trainer rank 0, attempt 1; kept on the job's volume)" in kept.stderr
    assert "validation at step" in kept.stdout and "TensorBoard: writing event files" in kept.stdout
    tail = trained.plugin("logs", "tiny", "--attempt", "1", "--tail", "3").stdout.splitlines()
    assert tail == kept.stdout.splitlines()[-3:]
    missing = trained.plugin("logs", "tiny", "--attempt", "7", check=3)
    assert "no log of trainer rank 0 in attempt 7" in missing.stderr and "attempt-1" in missing.stderr
    # This job generates inside the trainer: there is no vLLM log, and the plugin says so.
    vllm = trained.plugin("logs", "tiny", "--attempt", "1", "--role", "generation", check=3)
    assert "no log of vLLM replica 0 in attempt 1" in vllm.stderr


def test_after_the_pods_are_gone(kube: Cluster, trained: Trained) -> None:
    kube.kubectl("delete", "pods", "-n", trained.namespace, "-l", "grpo.dev/job=tiny", "--wait=true")
    status = trained.plugin("status", "tiny").stdout
    assert "Phase           Succeeded" in status and "Reward" in status
    assert set(next(line for line in status.splitlines() if line.startswith("Reward")).split()[2]) <= BARS
    samples = json.loads(trained.plugin("samples", "tiny", "-o", "json").stdout)
    assert samples and {s["step"] for s in samples} == {STEPS}
    logs = trained.plugin("logs", "tiny", check=3)
    assert "no trainer pod (rank 0) of job tiny exists now" in logs.stderr
    assert "kubectl grpo rewards tiny" in logs.stderr
    done = trained.plugin("suspend", "tiny", check=1)
    assert "has Succeeded: there is nothing to suspend" in done.stderr
    assert no_reader_pods(kube, trained.namespace)


def test_missing_job_and_help(trained: Trained) -> None:
    proc = trained.plugin("status", "nope", check=3)
    assert f'GRPOJob "nope" not found in namespace "{trained.namespace}"' in proc.stderr
    assert f"kubectl get grpo -n {trained.namespace}" in proc.stderr
    help_ = trained.plugin("--help").stdout
    assert "kubectl grpo samples qwen-gsm8k --worst" in help_ and "Exit codes" in help_
    assert trained.plugin("samples", "tiny", "--best", "--worst", check=2).stderr


# -- suspend / resume and permissions on a job that is not trained ---------------------------------


def sa_kubeconfig(kube: Cluster, namespace: str, sa: str, path: Path) -> Path:
    token = kube.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(kube.kubeconfig.read_text())
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": admin["clusters"][0]["cluster"]}],
                "users": [{"name": sa, "user": {"token": token}}],
                "contexts": [
                    {"name": sa, "context": {"cluster": "local", "user": sa, "namespace": namespace}}
                ],
                "current-context": sa,
            }
        )
    )
    return path


@pytest.fixture
def user_roles(kube: Cluster) -> Iterator[None]:
    """The chart's user roles (aggregated into the built-in edit and view roles), as a Helm install
    creates them."""
    rendered = subprocess.run(
        [helm_binary(), "template", "plugin-test", str(REPO / "helm" / "grpo-operator"),
         "--show-only", "templates/user-rbac.yaml"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    kube.kubectl("apply", "-f", "-", input=rendered)
    try:
        yield
    finally:
        kube.kubectl("delete", "-f", "-", "--ignore-not-found", input=rendered, check=False)


def test_edit_role_suffices_and_view_role_is_told_what_is_missing(
    kube: Cluster, namespace: str, tmp_path: Path, user_roles: None
) -> None:
    job = yaml.safe_load((REPO / "examples" / "tiny" / "grpojob.yaml").read_text())
    operator = Operator(kube, namespace, tmp_path / "operator.log")
    operator.start()
    try:
        kube.apply(job, namespace)
        claim_dir(kube, namespace, "tiny-ckpt")

        def phase() -> str:
            return str(((kube.get("grpojob", "tiny", namespace) or {}).get("status") or {}).get("phase"))

        # No vLLM runs: the generation pod is Ready once started (tests/harness/readiness.py).
        with generation_ready(kube, namespace):
            wait_for("the job to run", lambda: phase() == "Running", timeout=120)
        for sa, role in (("alice", "edit"), ("victor", "view")):
            kube.kubectl("create", "serviceaccount", sa, "-n", namespace)
            kube.kubectl(
                "create",
                "rolebinding",
                sa,
                f"--clusterrole={role}",
                f"--serviceaccount={namespace}:{sa}",
                "-n",
                namespace,
            )
        path = plugin_path(tmp_path)
        # The namespace comes from the kubeconfig's context, as for kubectl.
        alice = Plugin(kube, namespace, path, sa_kubeconfig(kube, namespace, "alice", tmp_path / "alice"))
        victor = Plugin(kube, namespace, path, sa_kubeconfig(kube, namespace, "victor", tmp_path / "victor"))

        # view: reads the status, but is told exactly what the volume and suspend need.
        status = victor("status", "tiny").stdout
        assert "Phase           Running" in status
        assert "(no trend: you may not create pods, delete pods, create pods/exec)" in status
        denied = victor("samples", "tiny", check=4)
        assert "forbidden: you are not allowed, in namespace" in denied.stderr
        for line in (
            "create pods  (to start a reader pod",
            "create pods/exec  (to read files",
            "delete pods",
        ):
            assert line in denied.stderr
        assert "RoleBinding" in denied.stderr
        assert "patch grpojobs.grpo.dev  (to set spec.suspend)" in victor("suspend", "tiny", check=4).stderr

        # edit (with the chart's aggregated GRPOJob rules): the plugin's checks pass. The development
        # cluster's hostPath transport also reads the PersistentVolume, a cluster-scoped object the edit
        # role cannot read; that one extra grant is for the test transport only.
        kube.kubectl(
            "create", "clusterrole", f"{namespace}-pv-read", "--verb=get", "--resource=persistentvolumes"
        )
        kube.kubectl(
            "create",
            "clusterrolebinding",
            f"{namespace}-pv-read",
            f"--clusterrole={namespace}-pv-read",
            f"--serviceaccount={namespace}:alice",
        )
        try:
            listing = alice("checkpoints", "tiny").stdout
            assert "No checkpoints published yet." in listing and "Final model: not written yet" in listing
        finally:
            kube.kubectl("delete", "clusterrolebinding,clusterrole", f"{namespace}-pv-read", check=False)
        # logs: trainer rank 0 of the current attempt is chosen (simulated nodes have no kubelet to
        # serve its log, so the API server's error is passed on with exit 1).
        logs = alice("logs", "tiny", check=None)
        assert "# pod tiny-trainer-1-0, container trainer" in logs.stderr
        assert logs.returncode == 0 or "reading the log of pod tiny-trainer-1-0" in logs.stderr, logs.stderr
        denied_logs = victor("logs", "tiny", "--role", "metric", check=None)
        assert "# pod tiny-metric-" in denied_logs.stderr
        assert "already not suspended" in alice("resume", "tiny").stdout
        assert "grpojob.grpo.dev/tiny suspended" in alice("suspend", "tiny").stdout
        wait_for("the operator to suspend the job", lambda: phase() == "Suspended", timeout=60)
        assert "Phase           Suspended" in alice("status", "tiny", "--no-trend").stdout
        assert "grpojob.grpo.dev/tiny resumed" in alice("resume", "tiny").stdout
        assert kube.get("grpojob", "tiny", namespace)["spec"]["suspend"] is False  # type: ignore[index]
        wait_for("the job to leave Suspended", lambda: phase() != "Suspended", timeout=60)
        assert no_reader_pods(kube, namespace)
    finally:
        operator.stop()


def test_config_shows_the_resolved_spec_and_trainer_json_and_compare_the_differences(
    kube: Cluster, trained: Trained, tmp_path: Path
) -> None:
    config = yaml.safe_load(trained.plugin("config", "tiny", "-o", "yaml").stdout)
    # Left unset in the manifest, filled in as training uses it; trainer.json as the operator wrote it.
    assert config["spec"]["grpo"]["lossType"] == "dapo" and config["spec"]["grpo"]["learningRate"] == 0.02
    assert config["trainerJson"]["grpo"]["groupSize"] == 8
    text = trained.plugin("config", "tiny").stdout
    assert "# trainer.json (ConfigMap tiny-config): what the trainer reads" in text

    other = yaml.safe_load((REPO / "examples" / "tiny" / "grpojob.yaml").read_text())
    other["metadata"]["name"] = "tiny-lr"
    other["spec"]["grpo"]["learningRate"] = 0.05
    other["spec"]["suspend"] = True  # compared, never run
    kube.apply(other, trained.namespace)
    shown = trained.plugin("compare", "tiny", "tiny-lr", "--no-curves").stdout
    assert "spec.grpo.learningRate: 0.02 | 0.05" in shown and "spec.suspend: false | true" in shown
    # The curves, read from the job's volume; a job against itself differs in nothing.
    png = tmp_path / "both.png"
    report = json.loads(trained.plugin("compare", "tiny", "tiny", "-o", "json", "--plot", str(png)).stdout)
    assert report["settings"] == [] and len(report["curves"]["tiny"]) == STEPS
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
