"""Access to the Kubernetes cluster the tests run against (test harness).

``Cluster.connect()`` uses ``KUBECONFIG`` when it points at a cluster that answers, and otherwise
starts the local control plane (hack/cluster.sh: real kube-apiserver, etcd, controller-manager and
scheduler, kwok for simulated GPU nodes) and stops it again at the end of the session.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client, config

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"
T = TypeVar("T")


def _versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (HACK / "versions.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            # lines look like K8S_VERSION="${K8S_VERSION:-v1.36.3}"
            default = value.strip('"').split(":-", 1)[-1].rstrip("}")
            out[key.strip()] = os.environ.get(key.strip(), default)
    return out


def testbins_dir() -> Path:
    return Path(os.environ.get("GRPO_TESTBINS", Path.home() / ".cache" / "grpo-testbins"))


# The finalizer with which the local runner keeps a deleted pod in the API while its process runs, as a
# kubelet does (tests/harness/local_runner.py).
PROCESS_FINALIZER = "grpo.test/local-process"


def kubectl_binary() -> str:
    built = testbins_dir() / f"k8s-{_versions()['K8S_VERSION']}" / "kubectl"
    if built.exists():
        return str(built)
    found = shutil.which("kubectl")
    if not found:
        raise RuntimeError("no kubectl: run `bash hack/testbins.sh k8s` to build the project's kubectl")
    return found


def helm_binary() -> str:
    built = testbins_dir() / f"helm-{_versions()['HELM_VERSION']}" / "helm"
    if not built.exists():
        raise RuntimeError("no helm: run `bash hack/testbins.sh helm`")
    return str(built)


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.5) -> T:
    """Polls ``fn`` until it returns something truthy; fails with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last value: {last!r})")


def default_cluster_name() -> str:
    """``grpo-test``, or one cluster per pytest-xdist worker (``grpo-test-gw0``, ...): tests on different
    workers then never compete for the simulated GPUs (one test fills all 16 on purpose) or see each
    other's cluster-wide objects (chart releases, admission policies, Kueue and its nodes)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return f"grpo-test-{worker}" if worker else "grpo-test"


@dataclass
class Cluster:
    kubeconfig: Path
    started_here: bool = False
    name: str = ""
    _api: client.ApiClient | None = field(default=None, repr=False)

    @classmethod
    def connect(cls) -> Cluster:
        env_cfg = os.environ.get("KUBECONFIG")
        if env_cfg and Path(env_cfg).exists() and _answers(Path(env_cfg)):
            return cls(kubeconfig=Path(env_cfg))
        name = os.environ.get("GRPO_TEST_CLUSTER_NAME") or default_cluster_name()
        env = {**os.environ, "GRPO_CLUSTER_NAME": name}
        # Several pytest sessions (developers, CI, a demo) may share the test cluster: starting is
        # serialised by a lock, and each session registers itself so that the last one out stops it.
        with _cluster_lock(name):
            proc = subprocess.run(
                ["bash", str(HACK / "cluster.sh"), "up"],
                env=env,
                capture_output=True,
                text=True,
                timeout=3600,
            )
            if proc.returncode != 0:
                raise RuntimeError(
                    f"could not start the local cluster (hack/cluster.sh up exited {proc.returncode}):\n"
                    f"{proc.stderr[-4000:]}"
                )
            _users_dir(name).mkdir(parents=True, exist_ok=True)
            (_users_dir(name) / str(os.getpid())).touch()
        kubeconfig = next(
            line.split("=", 1)[1]
            for line in proc.stdout.splitlines()
            if line.startswith("export KUBECONFIG=")
        )
        return cls(kubeconfig=Path(kubeconfig), started_here=True, name=name)

    def close(self) -> None:
        if not self.started_here:
            return
        with _cluster_lock(self.name):
            users = _users_dir(self.name)
            (users / str(os.getpid())).unlink(missing_ok=True)
            alive = [p for p in users.glob("*") if _pid_alive(int(p.name))] if users.is_dir() else []
            if alive or os.environ.get("GRPO_KEEP_CLUSTER"):
                return
            env = {**os.environ, "GRPO_CLUSTER_NAME": self.name}
            subprocess.run(
                ["bash", str(HACK / "cluster.sh"), "down"], env=env, capture_output=True, timeout=120
            )
            shutil.rmtree(users, ignore_errors=True)

    def env(self) -> dict[str, str]:
        """Environment for subprocesses that should talk to this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [kubectl_binary(), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def apply(self, manifest: dict[str, Any] | list[dict[str, Any]], namespace: str | None = None) -> None:
        docs = manifest if isinstance(manifest, list) else [manifest]
        args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
        # JSON, not YAML: PyYAML writes a string such as the spec-hash "110298022740e240" unquoted, which
        # kubectl's YAML reader takes for a number ("cannot unmarshal number into ... annotations").
        self.kubectl(*args, input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        args = ["get", kind, name, "-o", "json"] + (["-n", namespace] if namespace else [])
        proc = self.kubectl(*args, check=False)
        if proc.returncode != 0:
            if "NotFound" in proc.stderr:
                return None
            raise AssertionError(f"kubectl get {kind} {name} failed: {proc.stderr}")
        return yaml.safe_load(proc.stdout)  # type: ignore[no-any-return]

    def terminate_pod(
        self, namespace: str, name: str, exit_code: int, message: str = "", reason: str | None = None
    ) -> None:
        """Reports a pod's container as exited, as a kubelet would (restartPolicy Never): Succeeded for
        exit 0, otherwise Failed with the exit code, reason and termination message."""
        pod = self.get("pod", name, namespace)
        assert pod is not None, f"pod {namespace}/{name} is gone"
        status = exited_status(pod, exit_code, message, reason)
        self.kubectl(
            "patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}),
        )  # fmt: skip

    def api_client(self) -> client.ApiClient:
        if self._api is None:
            self._api = config.new_client_from_config(config_file=str(self.kubeconfig))
        return self._api

    def new_namespace(self, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.kubectl("create", "namespace", name)
        # The ServiceAccount admission plugin needs the namespace's default ServiceAccount, which the
        # controller-manager creates asynchronously; pods created before it exists are refused. On a cluster
        # just started beside another one on two busy cores, the controller-manager took over 30 s once.
        wait_for(
            f"default ServiceAccount in {name}",
            lambda: self.get("serviceaccount", "default", name),
            timeout=120,
        )
        return name

    def release_pod(self, pod: dict[str, Any]) -> None:
        """Removes the local runner's PROCESS_FINALIZER from ``pod`` (as read): only that pod (its uid is a
        precondition of the patch), and nothing when it carries none."""
        meta = pod["metadata"]
        finalizers = meta.get("finalizers") or []
        if PROCESS_FINALIZER not in finalizers:
            return
        kept = [f for f in finalizers if f != PROCESS_FINALIZER] or None
        patch = {"metadata": {"uid": meta["uid"], "finalizers": kept}}
        self.kubectl(
            "patch", "pod", meta["name"], "-n", meta["namespace"], "--type=merge", "-p", json.dumps(patch),
            check=False,
        )  # fmt: skip

    def delete_namespace(self, *names: str) -> None:
        """Deletes namespaces without waiting. A pod the local runner still holds (its process outlived a
        test that failed) is let go first, or the namespace would stay Terminating on the cached cluster."""
        for name in names:
            listed = self.kubectl("get", "pods", "-n", name, "-o", "json", check=False)
            for pod in json.loads(listed.stdout)["items"] if listed.returncode == 0 else []:
                self.release_pod(pod)
        self.kubectl("delete", "namespace", *names, "--wait=false", check=False)

    def apply_crds(self) -> None:
        crd_dir = REPO / "crds"
        files = sorted(crd_dir.glob("*.yaml")) if crd_dir.is_dir() else []
        for f in files:
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f))
        if files:
            self.wait_established("crd", "--all")

    def wait_established(self, *crds: str, timeout: float = 60) -> None:
        """`kubectl wait --for=condition=Established`, retried: for a CRD created a moment ago that has no
        status.conditions yet, kubectl fails at once ("accessor error: <nil>") instead of waiting."""
        deadline = time.monotonic() + timeout
        while True:
            proc = self.kubectl("wait", "--for=condition=Established", *crds, "--timeout=30s", check=False)
            if proc.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"CRDs {' '.join(crds)} not Established in {timeout:.0f} s:\n{proc.stderr}"
                )
            time.sleep(0.5)


def exited_status(
    pod: dict[str, Any], exit_code: int, message: str = "", reason: str | None = None
) -> dict[str, Any]:
    """The status a kubelet reports for a pod (restartPolicy Never) whose only container exited:
    Succeeded for exit 0, otherwise Failed with the exit code, reason and termination message."""
    container = pod["spec"]["containers"][0]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    terminated: dict[str, Any] = {
        "exitCode": exit_code,
        "reason": reason or ("Completed" if exit_code == 0 else "Error"),
        "startedAt": now,
        "finishedAt": now,
    }
    if message:
        terminated["message"] = message
    return {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "containerStatuses": [
            {
                "name": container["name"],
                "image": container["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": terminated},
            }
        ],
    }


def _cluster_home() -> Path:
    return Path(os.environ.get("GRPO_CLUSTER_HOME", Path.home() / ".cache" / "grpo-cluster"))


def _users_dir(name: str) -> Path:
    return _cluster_home() / f"{name}.users"


@contextlib.contextmanager
def _cluster_lock(name: str) -> Iterator[None]:
    _cluster_home().mkdir(parents=True, exist_ok=True)
    with open(_cluster_home() / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _answers(kubeconfig: Path) -> bool:
    try:
        proc = subprocess.run(
            [
                kubectl_binary(),
                "--kubeconfig",
                str(kubeconfig),
                "--request-timeout=5s",
                "get",
                "--raw",
                "/readyz",
            ],
            capture_output=True,
            timeout=15,
        )
    except (subprocess.TimeoutExpired, RuntimeError):
        return False
    return proc.returncode == 0
