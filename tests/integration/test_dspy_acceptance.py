"""Acceptance of client-rollout GRPOJobs with the real clients: DSPy 3.4.1's own ``GRPO`` optimizer and
arbor-ai 0.2.17's ``ArborProvider`` (tests/integration/dspy_grpo_client.py, run as its own process like a
user's notebook) train a tiny chat model through a GRPOJob on the local cluster, with the operator running
and the local runner playing the kubelet for the rollout gateway, the vLLM server (PyPI's CPU build of
vLLM, which the policy server samples DSPy's completions from) and the trainer.

The run shows what a DSPy user gets: the reward rises over the DSPy-driven steps, checkpoints are
published, a trainer killed with SIGKILL mid-run is restarted by the operator and resumes from its
checkpoint while DSPy's ``compile()`` carries on (the gateway holds its completion requests), the job ends
Succeeded at step S, and ``kubectl get grpo`` shows step/S and the reward while it runs."""

from __future__ import annotations

import importlib.util
import json
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.harness.kube import REPO, Cluster, wait_for
from tests.harness.local_runner import LocalJobRunner
from tests.harness.operator_process import Operator
from tests.harness.ports import free_port
from tests.integration.test_e2e_training import claim_dir

pytest.importorskip("dspy", reason="the dspy extra is not installed")
if importlib.util.find_spec("arbor") is None:
    pytest.skip("arbor-ai is not installed (pip install --no-deps arbor-ai==0.2.17)", allow_module_level=True)
pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.vllm]

G, B, S = 8, 4, 20
EVERY = 5
KILL_AFTER_STEP = 8  # the trainer is killed once this step is in metrics.jsonl: steps 6.. are replayed
MODEL = "/workspace/models/tiny"
# The tiny model's characters only: each turn on its own line, then "=" opens the answer.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}={% endif %}"
)


def dspy_job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "grpo.dev/v1alpha1",
        "kind": "GRPOJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": MODEL, "dtype": "float32"},
            "grpo": {
                "groupSize": G,
                "promptsPerStep": B,
                "steps": S,
                "learningRate": 0.02,
                "maxPromptLength": 16,
                "maxCompletionLength": 8,
                "failureScore": 0.0,
                "formatFailureScore": -1.0,
            },
            # The policy server samples through the job's vLLM server (real, the CPU build), which gets the
            # trained weights through the volume after every step.
            "generation": {"gpus": 1, "weightSync": "Volume"},
            "trainer": {"nodes": 1, "gpusPerNode": 1, "perDeviceBatchSize": G},
            "checkpoints": {
                "everySteps": EVERY,
                "keepLast": 2,
                "retention": "Delete",
                "volume": {"size": "5Gi", "accessMode": "ReadWriteMany"},
            },
            "rollouts": {"source": "Client", "client": {"allowFrom": [{"podLabels": {"app": "dspy"}}]}},
        },
    }


def seed_chat_model(volume: Path) -> None:
    """The tiny model on the job's volume, with a chat template in its vocabulary (the policy server and
    the trainer render DSPy's messages with it)."""
    from grpo_trainer.tiny import build
    from transformers import AutoTokenizer

    path = build(volume / "models" / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def log_times(log: Path, needle: str) -> list[datetime]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if needle in line:
            out.append(datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f"))
    return out


class Watcher(threading.Thread):
    """Samples `kubectl get grpo` every 2 s while the job runs, notes when metrics.jsonl last changed, and
    kills the trainer process with SIGKILL once step KILL_AFTER_STEP is trained."""

    def __init__(self, kube: Cluster, namespace: str, name: str, runner: LocalJobRunner, volume: Path):
        super().__init__(daemon=True)
        self.kube, self.namespace, self.name, self.runner, self.volume = kube, namespace, name, runner, volume
        self.samples: list[str] = []
        self.killed: tuple[float, int, int] | None = None  # (monotonic time, trained step, checkpoint step)
        self.killed_wall = 0.0
        self.rows = 0  # metrics.jsonl's rows, and when their number last changed
        self.progressed = time.monotonic()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(2):
            out = self.kube.kubectl("get", "grpo", self.name, "-n", self.namespace, check=False).stdout
            self.samples.append(out)
            rows = read_rows(self.volume / "output" / "metrics.jsonl")
            if len(rows) != self.rows:
                self.rows, self.progressed = len(rows), time.monotonic()
            # Not right after a checkpoint step, so that some steps are replayed.
            if (
                self.killed is None
                and rows
                and rows[-1]["step"] >= KILL_AFTER_STEP
                and rows[-1]["step"] % EVERY
            ):
                for proc in list(self.runner.trainers.values()):
                    proc.popen.send_signal(signal.SIGKILL)
                    self.killed_wall = time.time()
                    latest = json.loads((self.volume / "checkpoints" / "latest.json").read_text())
                    self.killed = (time.monotonic(), rows[-1]["step"], int(latest["step"]))
                    print(f"[acceptance] SIGKILL trainer {proc.pod} after step {rows[-1]['step']}")


# The client is given as long as it makes progress: it is stopped once no step has been trained for
# STALL_SECONDS (more than a vLLM restart takes on a loaded 2-core machine, ~5 min) or after RUN_SECONDS in
# all. A slow machine then still passes, and a hang fails in minutes with every process's log rather than
# pytest-timeout's thread dump (the pytest timeout is above both).
STALL_SECONDS = 600
RUN_SECONDS = 2400


def run_client(base: str, log: Path, watcher: Watcher) -> tuple[int | None, str]:
    """Runs DSPy's compile() to its end, or until ``watcher`` sees no progress for STALL_SECONDS; (exit code
    or None when stopped, why it was stopped)."""
    with log.open("wb") as handle:
        client = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.dspy_grpo_client", base, MODEL, str(G), str(B), str(S)],
            cwd=REPO,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
        started = time.monotonic()
        try:
            while client.poll() is None:
                time.sleep(2)
                now = time.monotonic()
                if now - watcher.progressed > STALL_SECONDS:
                    return None, f"no step trained for {STALL_SECONDS}s (last: {watcher.rows} metrics rows)"
                if now - started > RUN_SECONDS:
                    return None, f"compile() still running after {RUN_SECONDS}s ({watcher.rows} metrics rows)"
            return client.returncode, ""
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()


@pytest.mark.timeout(RUN_SECONDS + 600)
def test_dspy_grpo_trains_a_job_through_a_trainer_sigkill(
    kube: Cluster, namespace: str, tmp_path: Path
) -> None:
    name = "dspy"
    operator = Operator(kube, namespace, tmp_path / "operator.log")
    operator.start()
    runner = LocalJobRunner(kube, namespace, name, {}, tmp_path / "run", gateway_port=free_port())
    runner.linger_seconds = 20
    outcome: dict[str, Any] = {}
    try:
        started = time.monotonic()
        kube.apply(dspy_job(name), namespace)
        volume = claim_dir(kube, namespace, f"{name}-ckpt")
        seed_chat_model(volume)
        runner_thread = threading.Thread(
            target=lambda: outcome.update(phase=runner.run(timeout=RUN_SECONDS + 200)), daemon=True
        )
        runner_thread.start()
        watcher = Watcher(kube, namespace, name, runner, volume)
        watcher.start()

        base = f"http://127.0.0.1:{runner.gateway_port}/v1/"
        wait_for("the rollout gateway", lambda: runner.gateway is not None, timeout=120)
        client_log = tmp_path / "dspy.log"
        returncode, stopped = run_client(base, client_log, watcher)
        compiled_at = time.monotonic()
        runner_thread.join(120)
        watcher.done.set()
        watcher.join(10)
        logs = "\n".join(
            f"--- {p.name}\n" + p.read_text(errors="replace")[-3000:]
            for p in [client_log, *sorted((tmp_path / "run").glob("*.log"))]
        )
        assert not stopped, f"DSPy's compile() was stopped: {stopped}\n{logs}"
        assert returncode == 0, f"DSPy's compile() failed:\n{logs}"
        assert '"compiled": true' in client_log.read_text(), logs
        assert outcome.get("phase") == "Succeeded", f"job ended {outcome.get('phase')}:\n{logs}"
    finally:
        runner.close()
        operator.stop()

    job = kube.get("grpojob", name, namespace)
    assert job is not None
    status = job["status"]
    assert status["phase"] == "Succeeded" and status["progress"]["step"] == S

    # The SIGKILL: the operator restarted the trainers once and the trainer resumed from its checkpoint.
    assert watcher.killed is not None, "the trainer was never killed"
    killed_at, killed_step, checkpoint_step = watcher.killed
    assert status.get("restarts") == 1, status
    trainer_logs = sorted((tmp_path / "run").glob(f"{name}-trainer-*.log"))
    assert len(trainer_logs) == 2, trainer_logs

    # The operator saw what a kubelet reports for a killed container.
    events = json.loads(kube.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
    assert any("exit code 137" in (e.get("message") or e.get("note") or "") for e in events), [
        e.get("message") for e in events
    ]

    # The resumed trainer trained the steps after its checkpoint again, on the groups the gateway kept for
    # them (replay), and metrics.jsonl holds each step once (the resumed attempt's rows).
    gateway_log = tmp_path / "run" / "gateway.log"
    gateway_text = gateway_log.read_text(errors="replace")
    replayed = [
        s
        for s in range(1, S + 1)
        if f"step {s} for attempt 1:" in gateway_text and f"step {s} for attempt 2:" in gateway_text
    ]
    # From the checkpoint through the last step trained before the kill (and the step in flight, if the
    # trainer had taken its groups already).
    assert replayed[:1] == [checkpoint_step + 1] and killed_step in replayed, (replayed, watcher.killed)
    assert replayed == list(range(replayed[0], replayed[-1] + 1)), replayed
    rows = read_rows(volume / "output" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, S + 1))
    by_step = {r["step"]: r["reward_mean"] for r in rows}
    assert all(r["rollouts"] == G * B and r["groups"] == B for r in rows)

    # It learned from DSPy's rewards.
    first = sum(by_step[s] for s in (1, 2, 3)) / 3
    last = sum(by_step[s] for s in (S - 2, S - 1, S)) / 3
    print(f"[acceptance] reward first-3 mean {first:.3f}, last-3 mean {last:.3f}")
    assert last > first + 0.2, f"reward did not rise: first {first:.3f}, last {last:.3f} ({by_step})"

    # DSPy's completions came from vLLM, which served the trained weights after every step's sync, in both
    # gangs (the restarted one's first sync pushes the weights of the checkpoint it resumed from).
    syncs = read_rows(volume / "output" / "weight_syncs.jsonl")
    assert len(syncs) >= S and all(s["in_sync"] and s["logprob_diff"] < 0.05 for s in syncs), syncs
    assert any(s["step"] == checkpoint_step for s in syncs[1:]), syncs
    # The trainers alone were restarted (weightSync: Volume): one vLLM server, kept, served both gangs.
    assert status["generationAttempt"] == 1 and status["trainerAttempt"] == 2, status
    assert not (tmp_path / "run" / f"{name}-gen-2-0.log").exists(), "the vLLM pod was restarted"
    vllm_log = (tmp_path / "run" / f"{name}-gen-1-0.log").read_text(errors="replace")
    assert vllm_log.count('"POST /v1/completions HTTP/1.1" 200') >= 2, vllm_log[-2000:]

    # Checkpoints published: the manifest names the final one, and the status agrees.
    manifest = json.loads((volume / "checkpoints" / "latest.json").read_text())
    assert manifest["step"] == S and Path(manifest["path"]).is_dir()
    assert status["checkpoint"]["lastStep"] == S

    # What the gateway did meanwhile: it held DSPy's completion requests until the trainer was back.
    killed_wall = datetime.fromtimestamp(watcher.killed_wall)
    held = [t for t in log_times(gateway_log, "holding /v1/chat/completions") if t >= killed_wall]
    answered = [t for t in log_times(gateway_log, "answered after") if t >= killed_wall]
    # Held, not refused: no completion request got the gateway's 503 (DSPy's LM would have retried it,
    # but none was needed). Whether requests were in flight at the kill depends on its timing.
    assert "did not answer within" not in gateway_text, gateway_text[-3000:]
    held_for = (max(answered) - min(held)).total_seconds() if held and answered else 0.0
    print(
        f"[acceptance] SIGKILL after step {killed_step} (checkpoint step-{checkpoint_step}); "
        f"replayed steps {replayed}; gateway held {len(held)} completion requests for up to {held_for:.1f}s; "
        f"compile() ended {compiled_at - killed_at:.0f}s after the kill; run {compiled_at - started:.0f}s"
    )

    # kubectl get grpo showed step/S and the reward while the job ran.
    mid_run = [
        m
        for sample in watcher.samples
        if (m := re.search(rf"\b(\d+)/{S}\s+(-?\d+(?:\.\d+)?)\b", sample)) and 1 <= int(m.group(1)) < S
    ]
    assert mid_run, "\n".join(watcher.samples[-5:])
    running = [s for s in watcher.samples if re.search(rf"Running\s+[1-9]\d*/{S}\s", s)]
    print("[acceptance] kubectl get grpo during the run:\n" + running[0] + running[-1])
