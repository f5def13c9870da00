"""TEST HARNESS — runs a GRPOJob's metric or environment server and trainer as local processes.

The local cluster's nodes are simulated by kwok: pods get scheduled and reported Running, but no
container ever starts. For the demo and the end-to-end tests, this runner plays the kubelet for one
GRPOJob's pods, and only for them:

- for the job's Running metric pod it starts the metric server, and for a spec.environment job's environment
  pod the environment server (its port in ``PORT``): a local command given per image (``metric_commands``,
  ``environment_commands``), with the container's environment, or the image itself in a container
  (tests/harness/pod_container.py); it waits for /healthz or /health, as the readiness probe would (and
  reports the pod Ready if kwok has not), before it starts the trainer;
- for a client-rollout job's Running rollout gateway pod it starts ``python -m grpo_gateway`` with the
  gateway.json the operator rendered, on ``gateway_port`` (the client's port; free if 0) and free local ports
  for the internal and policy ports, up for ``linger_seconds`` after the job ends (the client terminates);
- for the job's Running trainer pod it starts ``python -m grpo_trainer`` with the pod's environment,
  the trainer config the operator rendered (read from the job's ConfigMap), the job's volume (the
  claim's directory from the local provisioner stands in for ``/workspace``), and a kubeconfig holding
  a token of the job's own ServiceAccount, so status patches go through the same RBAC as in a pod;
- when the trainer exits, it writes the exit into the pod's status (Succeeded, or Failed with the exit
  code and the trainer's termination message), as a kubelet would; when the operator deletes a
  trainer pod (restart, suspend), the process gets SIGTERM, as a container would, and SIGKILL after the
  pod's grace period (at most a minute here). As a kubelet does, the runner keeps a deleted trainer or
  generation pod in the API (a finalizer of its own) until the process has exited, so the operator's
  fencing of gang attempts (the next one starts once the previous one's pods are gone) is what a test sees.
- for each Running generation pod (one per vLLM replica) it starts the real vLLM server, on its replica's
  local port: PyPI's CPU build of vLLM with the container's own args and environment, under the operator's
  supervisor as in the pod (tests/harness/vllm_server.py says what it changes for the CPU, and why; a
  colocate job's trainer runs with vLLM's python instead, vllm_server.colocated_trainer); when it exits,
  the pod's status says so as a kubelet would: Failed for a non-zero exit, Succeeded for exit 0, with the
  supervisor's termination message, or else, for a non-zero exit, the log's tail (FallbackToLogsOnError).
- it reports the generation pod Ready once its vLLM server answers /health, as the kubelet does when the
  pod's readiness probe passes: the local cluster starts generation pods without making them Ready
  (hack/cluster/kwok-stages.yaml), so the operator waits for vLLM's start-up as on a real cluster
  (spec.generation.startupTimeoutSeconds). A job run without vLLM (below) has its generation pod reported
  Ready as soon as it started: there is no server to wait for.

What differs from a real pod, and why: there is no cluster DNS here, so the metric and environment URLs'
host (and the gateway's, vLLM's and the trainer's addresses of each other, its rendezvous among them) is
rewritten to 127.0.0.1 and a local port (a replaced metric or environment pod's server gets its predecessor's
port, as a Service keeps its address); paths under /workspace to the claim's directory, and the pod's
emptyDir home directory (HOME) to a directory of the runner's. Nothing else in the rendered config is
changed, except where a test asks for ``generation="in-process-transformers"``: then no vLLM server is
started and the trainer samples in its own process (``generation.backend: transformers``), for tests about
other things than generation that cannot afford vLLM's start-up. Only 1 node x 1 GPU trainer gangs run here.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from grpo_operator.builders.security import HOME_DIR

from tests.harness import vllm_server
from tests.harness.generation_ports import replica_of, rewrite_generation
from tests.harness.kube import PROCESS_FINALIZER, Cluster
from tests.harness.local_process import (
    Proc,
    container_env,
    container_exit_code,
    input_mounts,
    local_url,
    rewrite_paths,
    serve_locally,
)
from tests.harness.pod_logs import PodLog
from tests.harness.ports import free_port
from tests.harness.readiness import mark_ready, unready

REPO = Path(__file__).resolve().parents[2]
TERMINAL = {"Succeeded", "Failed"}
# A kubelet removes a deleted pod from the API only once its containers have stopped; kwok's pod-delete stage
# removes it at once. The operator starts gang attempt n+1 only once attempt n's pods are gone (an old
# trainer may still write its SIGTERM checkpoint, its retries must not reach the new vLLM server), so the
# runner holds a trainer or generation pod with this finalizer (PROCESS_FINALIZER) until its process exited.
# The most a deleted pod's process gets between SIGTERM and SIGKILL here: the pod's
# terminationGracePeriodSeconds (300 s for trainers) would let one hung process stall a test for minutes.
MAX_GRACE_SECONDS = 60.0
# Per image, the local command that serves it, or a function of (pod, port) that gives one.
Commands = Mapping[str, list[str] | Callable[[dict[str, Any], int], list[str]]]


@dataclass
class LocalJobRunner:
    kube: Cluster
    namespace: str
    job: str
    metric_commands: Commands
    workdir: Path
    python: str = sys.executable
    metric: Proc | None = None
    metric_port: int = 0
    # The same for the environment server of a job with spec.environment (its port also in PORT).
    environment_commands: Commands = field(default_factory=dict)
    environment: Proc | None = None
    environment_port: int = 0
    trainers: dict[str, Proc] = field(default_factory=dict)
    # Trainers whose pod was deleted, between SIGTERM and their exit (their pods are still held).
    stopping: dict[str, Proc] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    gateway: Proc | None = None
    gateway_port: int = 0
    gateway_internal_port: int = 0
    policy_port: int = 0
    linger_seconds: float = 60.0
    # "vllm": the generation pod runs as a real vLLM server; "in-process-transformers": none runs and the
    # trainer generates in its own process (see the module's docstring).
    generation: Literal["vllm", "in-process-transformers"] = "vllm"
    # trainer.json's statusPatchIntervalSeconds when set (10 s as rendered, more than a tiny job's run).
    status_interval_seconds: float | None = None
    # The local stand-ins for the vLLM Services (tests/harness/generation_ports.py): a port per replica,
    # whichever vLLM process of the replica is behind it; vllm_port is replica 0's (<job>-gen).
    vllm_port: int = 0
    replica_ports: dict[str, int] = field(default_factory=dict)
    vllm: dict[str, vllm_server.VLLMProcess] = field(default_factory=dict)
    vllm_replica: dict[str, str] = field(default_factory=dict)  # pod name -> its replica
    vllm_exited: set[str] = field(default_factory=set)
    # Generation pods whose server answered /health (and so finished compiling).
    vllm_ready: set[str] = field(default_factory=set)
    # Seconds from a generation pod's Running to its server's start (a slow image pull or model download).
    vllm_start_delay: float = 0.0
    vllm_running_since: dict[str, float] = field(default_factory=dict)  # pod uid -> first seen Running
    # Called after every pass of run()'s loop: what a test does to the job while it runs (kill a process).
    hooks: list[Callable[[LocalJobRunner], None]] = field(default_factory=list)
    # (time.monotonic(), "started" | "exited", pod name) of each trainer and vLLM process, in order.
    timeline: list[tuple[float, str, str]] = field(default_factory=list)
    # Each process's log, served as its pod's log (`kubectl logs`, `kubectl grpo logs`) by kwok.
    pod_logs: list[PodLog] = field(default_factory=list)

    def serve_log(self, pod: dict[str, Any], log: Path) -> None:
        container = pod["spec"]["containers"][0]["name"]
        served = PodLog(self.kube, self.namespace, pod["metadata"]["name"], container, log)
        if served.start():
            self.pod_logs.append(served)

    def hold(self, pod: dict[str, Any]) -> bool:
        """Keeps ``pod`` in the API until :meth:`release`: a process runs for it (PROCESS_FINALIZER).
        False when the pod was deleted or replaced since it was read: then no process is started."""
        meta = pod["metadata"]
        finalizers = [f for f in meta.get("finalizers") or [] if f != PROCESS_FINALIZER]
        # The uid in the patch is a precondition: a pod recreated under the same name is not touched.
        patch = {"metadata": {"uid": meta["uid"], "finalizers": [*finalizers, PROCESS_FINALIZER]}}
        done = self.kube.kubectl(
            "patch", "pod", meta["name"], "-n", self.namespace, "--type=merge", "-p", json.dumps(patch),
            check=False,
        )  # fmt: skip
        if done.returncode != 0 and self.kube.get("pod", meta["name"], self.namespace) is not None:
            # Refused for another reason than the pod's deletion (which adds no finalizer): say so.
            print(f"[local-runner] could not hold pod {meta['name']}: {done.stderr.strip()}")
        return done.returncode == 0

    def release(self, name: str, uid: str) -> None:
        """Lets the pod go once its process has exited (a no-op for a pod already gone or replaced)."""
        self.timeline.append((time.monotonic(), "exited", name))
        pod = self.kube.get("pod", name, self.namespace)
        if pod is not None and pod["metadata"]["uid"] == uid:
            self.kube.release_pod(pod)

    # --- cluster reads -------------------------------------------------------------------------
    def pods(self, role: str) -> list[dict[str, Any]]:
        out = self.kube.kubectl(
            "get",
            "pods",
            "-n",
            self.namespace,
            "-l",
            f"grpo.dev/job={self.job},grpo.dev/role={role}",
            "-o",
            "json",
        ).stdout
        return list(json.loads(out)["items"])

    def job_phase(self) -> str:
        job = self.kube.get("grpojob", self.job, self.namespace) or {}
        return str(job.get("status", {}).get("phase", ""))

    def workspace(self) -> Path:
        claim = self.kube.get("pvc", f"{self.job}-ckpt", self.namespace)
        if not claim or claim.get("status", {}).get("phase") != "Bound":
            raise RuntimeError(f"claim {self.job}-ckpt is not bound yet")
        pv = self.kube.get("pv", claim["spec"]["volumeName"])
        assert pv is not None
        return Path(pv["spec"]["hostPath"]["path"])

    def service_account_kubeconfig(self) -> Path:
        """A kubeconfig with a token of the job's own ServiceAccount (what a pod would mount)."""
        token = self.kube.kubectl(
            "create", "token", f"{self.job}-trainer", "-n", self.namespace, "--duration=2h"
        ).stdout.strip()
        admin = yaml.safe_load(self.kube.kubeconfig.read_text())
        cluster = admin["clusters"][0]["cluster"]
        path = self.workdir / f"{self.job}-trainer.kubeconfig"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "local", "cluster": cluster}],
                    "users": [{"name": f"{self.job}-trainer", "user": {"token": token}}],
                    "contexts": [
                        {
                            "name": "sa",
                            "context": {
                                "cluster": "local",
                                "user": f"{self.job}-trainer",
                                "namespace": self.namespace,
                            },
                        }
                    ],
                    "current-context": "sa",
                }
            )
        )
        path.chmod(0o600)
        return path

    # --- metric and environment servers -----------------------------------------------------------
    def ensure_metric(self) -> None:
        self.metric, self.metric_port = self.ensure_server(
            "metric", self.metric, self.metric_port, self.metric_commands, "/healthz", "GRPO_METRIC_PORT"
        )

    def ensure_environment(self) -> None:
        self.environment, self.environment_port = self.ensure_server(
            "environment",
            self.environment,
            self.environment_port,
            self.environment_commands,
            "/health",
            "PORT",
        )

    def ensure_server(
        self, role: str, proc: Proc | None, port: int, commands: Commands, health: str, port_env: str
    ) -> tuple[Proc | None, int]:
        """Starts the server of the job's Running ``role`` pod (a Deployment's) on a free port and waits for
        ``health``; stops it when the operator stopped the Deployment. The process and its port."""
        running = [p for p in self.pods(role) if p["status"].get("phase") == "Running"]
        if proc and proc.popen.poll() is None:
            if not running:  # the operator stopped the service
                self.stop(proc)
                return None, port
            return proc, port
        if not running:
            return proc, port
        # A replaced pod keeps its Service's address: the port of the previous server, when there was one.
        pod, port = running[0], port or free_port()
        image = pod["spec"]["containers"][0]["image"]
        command = commands.get(image)
        if not command:
            raise RuntimeError(f"no local command for {role} image {image!r}; pass --{role} IMAGE=COMMAND")
        if callable(command):  # the pod's container itself (tests/harness/pod_container.py)
            command = command(pod, port)
        env = {**os.environ, **self.local_home(container_env(pod)), **self.secret_env(pod)}
        env[port_env] = str(port)
        log, url = self.workdir / f"{role}.log", f"http://127.0.0.1:{port}{health}"
        proc = serve_locally(f"{role} server", pod, command, env, log, url, REPO)
        self.serve_log(pod, log)
        if unready(pod):  # kwok reports these pods Ready itself; a kubelet would once the probe passed
            mark_ready(self.kube, pod)
        return proc, port

    def services(self) -> list[Proc | None]:
        """The servers the job's trainer talks to: the rollout gateway, or those of metric and environment."""
        data = (self.kube.get("configmap", f"{self.job}-config", self.namespace) or {}).get("data") or {}
        if "gateway.json" in data:
            return [self.gateway]
        config = json.loads(data.get("trainer.json") or "{}")
        servers = {"metric": self.metric, "environment": self.environment}
        return [proc for key, proc in servers.items() if key in config]

    # --- rollout gateway (client-rollout jobs) ---------------------------------------------------
    def client_rollouts(self) -> bool:
        cm = self.kube.get("configmap", f"{self.job}-config", self.namespace)
        return bool(cm and "gateway.json" in (cm.get("data") or {}))

    def secret_env(self, pod: dict[str, Any]) -> dict[str, str]:
        """The container's secretKeyRef and configMapKeyRef variables, resolved as the kubelet would."""
        out: dict[str, str] = {}
        for var in pod["spec"]["containers"][0].get("env", []):
            source = var.get("valueFrom") or {}
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                secret = self.kube.get("secret", ref["name"], self.namespace) or {}
                value = (secret.get("data") or {}).get(ref["key"])
                if value is not None:
                    out[var["name"]] = base64.b64decode(value).decode()
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                config = self.kube.get("configmap", ref["name"], self.namespace) or {}
                text = (config.get("data") or {}).get(ref["key"])
                if text is not None:
                    out[var["name"]] = text
        return out

    def ensure_gateway(self) -> None:
        running = [p for p in self.pods("rollouts") if p["status"].get("phase") == "Running"]
        if self.gateway and self.gateway.popen.poll() is None:
            if not running:  # the operator removed the gateway (the job failed)
                self.stop(self.gateway, grace=5)
                self.gateway = None
            return
        if not running:
            return
        pod = running[0]
        cm = self.kube.get("configmap", f"{self.job}-config", self.namespace)
        assert cm is not None
        config = json.loads(cm["data"]["gateway.json"])
        self.gateway_port = self.gateway_port or free_port()
        self.gateway_internal_port = self.gateway_internal_port or free_port()
        self.policy_port = self.policy_port or free_port()
        config.update(
            clientPort=self.gateway_port,
            internalPort=self.gateway_internal_port,
            trainerUrl=f"http://127.0.0.1:{self.policy_port}",
        )
        path = self.workdir / "gateway.json"
        path.write_text(json.dumps(config, indent=2))
        env = {**os.environ, **self.local_home(container_env(pod)), **self.secret_env(pod)}
        env.update(GRPO_GATEWAY_CONFIG=str(path), PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'trainer_image'}")
        log, health = self.workdir / "gateway.log", f"http://127.0.0.1:{self.gateway_port}/healthz"
        command = [self.python, "-m", "grpo_gateway"]
        self.gateway = serve_locally("rollout gateway", pod, command, env, log, health, REPO)
        print(f"[local-runner] rollout gateway on http://127.0.0.1:{self.gateway_port}/v1/; log {log}")

    def local_home(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with the pod's emptyDir HOME replaced by a directory of the runner's (a user's own HOME,
        e.g. under /workspace, is kept)."""
        if env.get("HOME") != HOME_DIR:
            return env
        home = self.workdir / "home"
        home.mkdir(parents=True, exist_ok=True)
        return {**env, "HOME": str(home)}

    # --- vLLM server (the generation pod) ---------------------------------------------------------
    def service_port(self, replica: str = "0") -> int:
        if replica == "0":
            self.vllm_port = self.vllm_port or free_port()
            return self.vllm_port
        return self.replica_ports.setdefault(replica, free_port())

    def ensure_generation(self) -> None:
        """Starts vLLM for each Running generation pod, stops it when the operator deletes the pod, and
        reports the pod Failed (with vLLM's last words) when the server exits."""
        pods = {p["metadata"]["name"]: p for p in self.pods("generation")}
        for name, proc in list(self.vllm.items()):
            pod = pods.get(name)
            if pod is None or pod["metadata"].get("deletionTimestamp") or pod["metadata"]["uid"] != proc.uid:
                proc.stop()
                self.forget_compile_cache(name)
                del self.vllm[name]
                self.vllm_exited.add(name)
                self.release(name, proc.uid)
            elif proc.popen.poll() is not None:
                code = container_exit_code(proc.popen.returncode)
                # Like a kubelet: what the supervisor wrote, else the log's tail for a non-zero exit.
                message = proc.termination_message()
                self.kube.terminate_pod(self.namespace, name, code, message)
                print(f"[local-runner] vLLM of pod {name} exited {code}; log {proc.log}")
                proc.stop()
                self.forget_compile_cache(name)
                del self.vllm[name]
                self.vllm_exited.add(name)
                self.release(name, proc.uid)
        for name, pod in pods.items():
            if name in self.vllm or name in self.vllm_exited or pod["metadata"].get("deletionTimestamp"):
                continue
            if pod["status"].get("phase") != "Running":
                continue
            running_since = self.vllm_running_since.setdefault(pod["metadata"]["uid"], time.monotonic())
            if time.monotonic() - running_since < self.vllm_start_delay:
                continue
            replica = replica_of(pod)
            if any(
                p.popen.poll() is None and self.vllm_replica.get(n) == replica for n, p in self.vllm.items()
            ):
                continue  # the replica's previous server still holds the port; it stops on its pod's deletion
            workspace = self.workspace()
            mounts = input_mounts(self.kube, self.namespace, self.workdir, pod)
            local = rewrite_paths(pod["spec"]["containers"][0], workspace, mounts)
            env = {k: str(rewrite_paths(v, workspace, mounts)) for k, v in container_env(pod).items()}
            env = self.local_home(env)
            env.update(self.secret_env(pod))
            env.setdefault("VLLM_CACHE_ROOT", str(self.vllm_compile_cache))
            log = self.workdir / f"{name}.log"
            if not self.hold(pod):
                continue
            proc = vllm_server.start(local, env, self.service_port(replica), log, uid=pod["metadata"]["uid"])
            self.timeline.append((time.monotonic(), "started", name))
            self.vllm[name], self.vllm_replica[name] = proc, replica
            self.serve_log(pod, log)
            print(f"[local-runner] started vLLM for pod {name} on {proc.base_url}; log {log}")
        self.report_generation_ready(pods)

    @property
    def vllm_compile_cache(self) -> Path:
        """torch.compile's artifacts for this job's vLLM servers: a restarted server of the job starts warm.
        Per job, not shared with other jobs: a server stopped while it compiles leaves half-written files
        there (a truncated .so that the next start fails to load), so such a cache is dropped."""
        return self.workdir / "vllm-compile-cache"

    def forget_compile_cache(self, name: str) -> None:
        """Drops the job's compile cache when server ``name`` stopped before it ever answered /health: it may
        have been stopped mid-compile."""
        if name not in self.vllm_ready and self.vllm_compile_cache.exists():
            shutil.rmtree(self.vllm_compile_cache, ignore_errors=True)
            print(f"[local-runner] vLLM of pod {name} stopped before Ready: its compile cache was dropped")

    def report_generation_ready(self, pods: dict[str, dict[str, Any]]) -> None:
        """Reports each generation pod Ready whose vLLM server answers /health (the pod's readiness probe),
        as a kubelet would; until then the operator counts the pod's start-up against
        spec.generation.startupTimeoutSeconds."""
        for name, proc in self.vllm.items():
            pod = pods.get(name)
            if pod is None or pod["metadata"]["uid"] != proc.uid or not unready(pod):
                continue
            if proc.popen.poll() is None and proc.healthy() and mark_ready(self.kube, pod):
                self.vllm_ready.add(name)
                print(f"[local-runner] vLLM of pod {name} answers /health: pod reported Ready")

    # --- trainer -------------------------------------------------------------------------------
    def trainer_config(self, workspace: Path, mounts: dict[str, Path] | None = None) -> Path:
        cm = self.kube.get("configmap", f"{self.job}-config", self.namespace)
        assert cm is not None, f"ConfigMap {self.job}-config missing"
        config = rewrite_paths(json.loads(cm["data"]["trainer.json"]), workspace, mounts)
        if "metric" in config:
            config["metric"]["url"] = local_url(config["metric"]["url"], self.metric_port)
        if "environment" in config:
            config["environment"]["url"] = local_url(config["environment"]["url"], self.environment_port)
        if "rollouts" in config:
            config["rollouts"]["gatewayUrl"] = f"http://127.0.0.1:{self.gateway_internal_port}"
            config["rollouts"]["policyPort"] = self.policy_port
        if self.generation == "in-process-transformers":
            config["generation"]["backend"] = "transformers"
        elif config["generation"].get("backend") != "vllm-colocate":  # colocate: no server to point at
            rewrite_generation(config["generation"], self.service_port)
        config["metricsPort"] = free_port()
        if self.status_interval_seconds is not None:
            config["statusPatchIntervalSeconds"] = self.status_interval_seconds
        path = self.workdir / "trainer.json"
        path.write_text(json.dumps(config, indent=2))
        return path

    def trainer_env(self, pod: dict[str, Any]) -> dict[str, str]:
        """The trainer process's environment as the kubelet would give the pod's container: its plain and
        fieldRef variables with local paths, and its secretKeyRef ones (HF_TOKEN, rank 0's gateway token)
        resolved from their Secrets."""
        env = container_env(pod)
        if int(env.get("WORLD_SIZE", "1")) != 1:
            raise RuntimeError("the local runner runs single-process trainer gangs only (1 node x 1 GPU)")
        workspace = self.workspace()
        mounts = input_mounts(self.kube, self.namespace, self.workdir, pod)
        env = {k: str(rewrite_paths(v, workspace, mounts)) for k, v in self.local_home(env).items()}
        env.update(self.secret_env(pod))
        env.update(
            GRPO_CONFIG=str(self.trainer_config(workspace, mounts)),
            KUBECONFIG=str(self.service_account_kubeconfig()),
            PYTHONUNBUFFERED="1",
        )
        env.pop("KUBERNETES_SERVICE_HOST", None)
        # A pod's own network namespace: two local trainers must not meet on its port (vLLM colocated forms a group).
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        return env

    def start_trainer(self, pod: dict[str, Any]) -> None:
        env = self.trainer_env(pod)
        python, env = vllm_server.colocated_trainer(self.python, env, self.vllm_compile_cache)
        name = pod["metadata"]["name"]
        if not self.hold(pod):
            return
        log = self.workdir / f"{name}.log"
        handle = log.open("ab")
        popen = subprocess.Popen(
            [python, "-m", "grpo_trainer"],
            env={**os.environ, **env},
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        self.trainers[name] = Proc(name, pod["metadata"]["uid"], popen, log, handle)
        self.timeline.append((time.monotonic(), "started", name))
        self.serve_log(pod, log)
        print(
            f"[local-runner] started trainer for pod {name} (RESUME_FROM={env.get('RESUME_FROM') or '-'}); log {log}"
        )

    def report_exit(self, proc: Proc) -> None:
        code = container_exit_code(proc.popen.returncode)
        tail = proc.log.read_text(errors="replace").strip().splitlines()[-1:] if proc.log.exists() else []
        message = tail[0][-1000:] if tail and code else ""
        pod = self.kube.get("pod", proc.pod, self.namespace)
        if not pod or pod["metadata"]["uid"] != proc.uid:
            return
        self.kube.terminate_pod(self.namespace, proc.pod, code, message)
        # A failed trainer's last log line in the test's output: a CI failure names its cause without the log.
        outcome = f"Failed: {message}" if code else "Succeeded"
        print(f"[local-runner] trainer pod {proc.pod} exited {code} -> pod {outcome}")

    def step(self) -> None:
        client = self.client_rollouts()
        if client:
            self.ensure_gateway()
        else:
            self.ensure_metric()
            self.ensure_environment()
        if self.generation == "vllm":
            self.ensure_generation()
        else:
            # No vLLM to wait for: the generation pod is Ready once started, as if vLLM were up at once.
            for generation_pod in self.pods("generation"):
                if unready(generation_pod):
                    mark_ready(self.kube, generation_pod)
        current = {p["metadata"]["name"]: p for p in self.pods("trainer")}
        for name, proc in list(self.trainers.items()):
            pod = current.get(name)
            if proc.finished():
                self.report_exit(proc)
                del self.trainers[name]
                self.finished.add(name)
                self.release(name, proc.uid)
            elif pod is None or pod["metadata"].get("deletionTimestamp"):
                # The operator deleted it: SIGTERM, as a container would get, and SIGKILL after the grace
                # period; the pod stays (terminating) until the process has exited.
                grace = (pod or {}).get("spec", {}).get("terminationGracePeriodSeconds", 30)
                proc.popen.send_signal(signal.SIGTERM)
                proc.kill_at = time.monotonic() + min(float(grace), MAX_GRACE_SECONDS)
                del self.trainers[name]
                self.finished.add(name)
                self.stopping[name] = proc
        for name, proc in list(self.stopping.items()):
            if proc.finished():
                del self.stopping[name]
                self.release(name, proc.uid)
            elif proc.kill_at is not None and time.monotonic() >= proc.kill_at:
                proc.popen.kill()
        if not all(service and service.popen.poll() is None for service in self.services()):
            return
        for name, pod in current.items():
            if name in self.trainers or name in self.finished or pod["metadata"].get("deletionTimestamp"):
                continue
            if pod["status"].get("phase") == "Running" and container_env(pod).get("RANK", "0") == "0":
                self.start_trainer(pod)

    def stop(self, proc: Proc, grace: float = 60) -> None:
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGTERM)
            try:
                proc.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()
        proc.handle.close()

    def close(self) -> None:
        # Copies: a test may close the runner while its run() thread, given up on, still adds processes.
        for proc in [*self.trainers.values(), *self.stopping.values()]:
            self.stop(proc)
            self.release(proc.pod, proc.uid)
        for name, server in list(self.vllm.items()):
            server.stop()
            self.forget_compile_cache(name)
            self.release(name, server.uid)
        for served in list(self.pod_logs):
            served.stop()
        for service in (self.metric, self.environment, self.gateway):
            if service:
                self.stop(service, grace=5)

    def run(self, timeout: float) -> str:
        self.workdir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        try:
            ended: float | None = None
            while time.monotonic() < deadline:
                phase = self.job_phase()
                if phase in TERMINAL and not self.trainers:
                    # A client-rollout job's gateway keeps answering its client a while (terminate).
                    if self.gateway is None or self.gateway.popen.poll() is not None:
                        return phase
                    ended = ended or time.monotonic()
                    if time.monotonic() - ended >= self.linger_seconds:
                        return phase
                self.step()
                for hook in self.hooks:
                    hook(self)
                time.sleep(1)
            raise TimeoutError(f"job {self.namespace}/{self.job} did not finish within {timeout:.0f}s")
        finally:
            self.close()
