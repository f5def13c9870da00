"""TEST HARNESS — the process side of the local runner (tests/harness/local_runner.py): a pod's process,
its environment and paths, the directories a kubelet would mount for spec.inputs, the exit code a container
runtime would report for it, and a server started for a pod and waited for as its readiness probe would."""

from __future__ import annotations

import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from tests.harness.kube import Cluster

WORKSPACE = "/workspace"


def rewrite_paths(value: Any, workspace: Path, mounts: dict[str, Path] | None = None) -> Any:
    """Replaces the /workspace prefix (and each other mount path in ``mounts``) in every string of a JSON
    document with the local directory that stands in for it."""
    local = {WORKSPACE: workspace, **(mounts or {})}
    if isinstance(value, dict):
        return {k: rewrite_paths(v, workspace, mounts) for k, v in value.items()}
    if isinstance(value, list):
        return [rewrite_paths(v, workspace, mounts) for v in value]
    if isinstance(value, str):
        for mount, directory in local.items():
            for prefix in (f"file://{mount}", mount):
                if value == prefix or value.startswith(prefix + "/"):
                    head = "file://" if prefix.startswith("file://") else ""
                    return head + str(directory) + value[len(prefix) :]
    return value


def container_env(pod: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for var in pod["spec"]["containers"][0].get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif "valueFrom" in var and "fieldRef" in var["valueFrom"]:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            if path == "metadata.name":
                env[var["name"]] = pod["metadata"]["name"]
            elif path == "metadata.namespace":
                env[var["name"]] = pod["metadata"]["namespace"]
    return env


def container_exit_code(returncode: int) -> int:
    """The exit code a container runtime reports for a process: Popen's ``-N`` for a process killed by
    signal N is reported as 128 + N (137 for SIGKILL), as a kubelet shows it in the pod's status."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class Proc:
    pod: str
    uid: str
    popen: subprocess.Popen[bytes]
    log: Path
    handle: BinaryIO

    # When the runner sent SIGTERM because the pod was deleted: the time to send SIGKILL.
    kill_at: float | None = None

    def finished(self) -> bool:
        if self.popen.poll() is None:
            return False
        self.handle.close()
        return True


def input_mounts(kube: Cluster, namespace: str, workdir: Path, pod: dict[str, Any]) -> dict[str, Path]:
    """What a kubelet would mount for the pod's spec.inputs volumes: a ConfigMap's keys as files, a
    claim's directory (or its subPath), by mount path."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    out: dict[str, Path] = {}
    for mount in pod["spec"]["containers"][0].get("volumeMounts", []):
        if not mount["mountPath"].startswith("/inputs/"):
            continue
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            cm = kube.get("configmap", volume["configMap"]["name"], namespace)
            if cm is None:
                raise RuntimeError(f"ConfigMap {volume['configMap']['name']} of {mount['mountPath']} missing")
            directory = workdir / "inputs" / mount["name"]
            directory.mkdir(parents=True, exist_ok=True)
            for key, text in (cm.get("data") or {}).items():
                (directory / key).write_text(text, encoding="utf-8")
        else:
            claim = kube.get("pvc", volume["persistentVolumeClaim"]["claimName"], namespace)
            assert claim is not None and claim.get("status", {}).get("phase") == "Bound"
            pv = kube.get("pv", claim["spec"]["volumeName"])
            assert pv is not None
            directory = Path(pv["spec"]["hostPath"]["path"]) / mount.get("subPath", "")
        out[mount["mountPath"]] = directory
    return out


def serve_locally(
    what: str,
    pod: dict[str, Any],
    command: list[str],
    env: dict[str, str],
    log: Path,
    health_url: str,
    cwd: Path,
) -> Proc:
    """Starts ``command`` for ``pod`` (its output appended to ``log``) and waits up to 60 s for ``health_url``
    to answer, as the pod's readiness probe would; RuntimeError, naming ``what`` and the log, when it exits or
    never answers."""
    handle = log.open("ab")
    popen = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=cwd)
    proc = Proc(pod["metadata"]["name"], pod["metadata"]["uid"], popen, log, handle)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(health_url, timeout=2):
                return proc
        except OSError:
            if popen.poll() is not None:
                raise RuntimeError(f"{what} exited with {popen.returncode}; see {log}") from None
            time.sleep(0.3)
    raise RuntimeError(
        f"{what} did not answer {urllib.parse.urlsplit(health_url).path} within 60s; see {log}"
    )


def local_url(url: str, port: int) -> str:
    """``url`` with its host (a Service's cluster DNS name) replaced by 127.0.0.1 and the local ``port``."""
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(netloc=f"127.0.0.1:{port}"))
