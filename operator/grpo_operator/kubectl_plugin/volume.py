"""Reading the job's volume from outside the cluster: a short-lived reader pod and a transport.

Why a reader pod: the job's data (samples, per-step metrics, checkpoints, the final model) lives on its
claim, and must stay readable after the job finished, when no trainer pod exists. A pod that mounts the
claim read-only and only sleeps works in both cases, needs no change to the trainer or its
NetworkPolicy, and needs only permissions of the namespace's edit role (create/get/delete pods,
create pods/exec). While a trainer runs it is placed on the trainer's node, because a ReadWriteOnce
claim can be mounted by several pods on one node only. It deletes itself after ``lifetime`` seconds
if the plugin is interrupted before it removes it.

A transport reads paths under ``/workspace`` through that pod:

- :class:`ExecTransport` (the default): ``kubectl exec`` into the reader pod running ``tail`` / ``ls`` /
  ``tar``, through the real kubectl with the user's connection flags;
- :class:`HostPathTransport` (``KUBECTL_GRPO_VOLUME_ACCESS=hostpath``): for a single-machine
  development cluster whose PersistentVolumes are hostPath directories on the machine running the
  plugin (the project's local cluster, where nodes are simulated and no container runs, so exec cannot
  work); it reads the PersistentVolume's directory directly, and needs ``get persistentvolumes``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from grpo_operator.api.resource import API_VERSION, KIND
from grpo_operator.builders.common import LABEL_JOB, LABEL_NODE_RANK, LABEL_PART_OF, LABEL_ROLE, PART_OF
from grpo_operator.kubectl_plugin.data import MOUNT
from grpo_operator.kubectl_plugin.errors import NotFound, PluginError
from grpo_operator.kubectl_plugin.kube import Kube

DEFAULT_READER_IMAGE = "busybox:1.37.0"
READER_CONTAINER = "reader"
READER_LABEL = "grpo.dev/reader-for"
ACCESS_ENV = "KUBECTL_GRPO_VOLUME_ACCESS"
# Matches the operator's default pod user (settings.pod_run_as_user / pod_fs_group) when no trainer pod
# exists to copy it from.
DEFAULT_UID = 65532
MISSING = 3  # exit code of the reader's shell when a path does not exist


class VolumeTransport(Protocol):
    def read(self, path: str, offset: int = 0) -> bytes | None:
        """Bytes of the file at ``path`` from ``offset`` on; None when it does not exist."""

    def list_dir(self, path: str) -> list[str] | None:
        """Names in the directory at ``path``; None when it does not exist."""

    def copy_out(self, path: str, dest: Path) -> None:
        """Copies the contents of the directory at ``path`` into ``dest``."""


def claim_name(job: dict[str, Any]) -> str:
    volume = ((job.get("spec") or {}).get("checkpoints") or {}).get("volume") or {}
    return str(volume.get("existingClaim") or f"{job['metadata']['name']}-ckpt")


def running_trainer(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Rank 0 of the job's trainer gang, if it is placed on a node and not finished."""
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        phase = (pod.get("status") or {}).get("phase")
        if (
            labels.get(LABEL_NODE_RANK, "0") == "0"
            and (pod.get("spec") or {}).get("nodeName")
            and phase not in ("Succeeded", "Failed")
            and not pod["metadata"].get("deletionTimestamp")
        ):
            return pod
    return None


def reader_pod(
    job: dict[str, Any], image: str, lifetime: int, trainer: dict[str, Any] | None
) -> dict[str, Any]:
    """The reader pod's manifest: the claim mounted read-only at /workspace, a non-root user that can
    read what the trainer wrote (the trainer's own user and groups when a trainer pod exists), no
    privileges, small requests, and an active deadline so it never outlives ``lifetime``."""
    meta = job["metadata"]
    trainer_ctx = ((trainer or {}).get("spec") or {}).get("securityContext") or {}
    uid = trainer_ctx.get("runAsUser", DEFAULT_UID)
    gid = trainer_ctx.get("runAsGroup", DEFAULT_UID)
    fs_group = trainer_ctx.get("fsGroup", DEFAULT_UID)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": lifetime,
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": gid,
            "supplementalGroups": [fs_group],
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": READER_CONTAINER,
                "image": image,
                "command": ["sleep", str(lifetime)],
                "volumeMounts": [{"name": "workspace", "mountPath": MOUNT, "readOnly": True}],
                "resources": {
                    "requests": {"cpu": "10m", "memory": "32Mi"},
                    "limits": {"cpu": "500m", "memory": "128Mi"},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "privileged": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
        "volumes": [
            {"name": "workspace", "persistentVolumeClaim": {"claimName": claim_name(job), "readOnly": True}}
        ],
    }
    if trainer is not None:
        # Beside the running trainer (a ReadWriteOnce claim mounts on one node only); nodeName skips the
        # scheduler, so GPU-node taints with NoSchedule do not apply, and NoExecute ones are tolerated.
        spec["nodeName"] = trainer["spec"]["nodeName"]
        spec["tolerations"] = [{"operator": "Exists", "effect": "NoExecute"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{meta['name'][:40]}-reader-{uuid.uuid4().hex[:6]}",
            "namespace": meta["namespace"],
            # Not grpo.dev/job: the operator treats pods with that label as the job's own children.
            "labels": {READER_LABEL: meta["name"], LABEL_PART_OF: PART_OF},
            # Garbage-collected with the job.
            "ownerReferences": [
                {"apiVersion": API_VERSION, "kind": KIND, "name": meta["name"], "uid": meta["uid"]}
            ],
        },
        "spec": spec,
    }


def _waiting_problem(pod: dict[str, Any]) -> str | None:
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in (
            "ErrImagePull",
            "ImagePullBackOff",
            "InvalidImageName",
            "CreateContainerConfigError",
        ):
            return f"{waiting['reason']}: {waiting.get('message', '')} (choose another image with --reader-image)"
    for cond in status.get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            return f"it cannot be scheduled: {cond.get('message', '')}"
    if status.get("phase") in ("Failed", "Succeeded"):
        return f"it ended ({status.get('phase')}: {status.get('reason') or status.get('message') or 'no reason given'})"
    return None


@contextmanager
def reader(
    kube: Kube, job: dict[str, Any], image: str, timeout: float, lifetime: int
) -> Iterator[VolumeTransport]:
    """A reader pod for the job's claim, running, and the transport that reads through it; the pod is
    deleted on exit."""
    claim = kube.claim(claim_name(job))
    if (claim.get("status") or {}).get("phase") != "Bound":
        raise PluginError(
            f"the job's volume claim {claim_name(job)!r} is not bound yet "
            f"(phase {(claim.get('status') or {}).get('phase')}); nothing has been written to it"
        )
    trainers = kube.pods(f"{LABEL_JOB}={job['metadata']['name']},{LABEL_ROLE}=trainer")
    manifest = reader_pod(job, image, lifetime, running_trainer(trainers))
    name = manifest["metadata"]["name"]
    kube.create_pod(manifest)
    try:
        deadline = time.monotonic() + timeout
        while True:
            pod = kube.pod(name)
            if pod is None:
                raise PluginError(f"reader pod {name} disappeared before it started")
            if (pod.get("status") or {}).get("phase") == "Running":
                break
            problem = _waiting_problem(pod)
            if problem:
                raise PluginError(f"reader pod {name} cannot read the job's volume: {problem}")
            if time.monotonic() > deadline:
                raise PluginError(
                    f"reader pod {name} did not start within {timeout:.0f}s "
                    f"(kubectl describe pod {name} -n {kube.namespace} says why; raise --reader-timeout)"
                )
            time.sleep(0.5)
        if os.environ.get(ACCESS_ENV, "exec") == "hostpath":
            yield HostPathTransport(Path(kube.volume_host_path(claim)))
        else:
            yield ExecTransport(kube.kubectl(), name)
    finally:
        kube.delete_pod(name)


class ExecTransport:
    """Reads through ``kubectl exec`` into the reader pod."""

    def __init__(self, kubectl: list[str], pod: str) -> None:
        self.prefix = [*kubectl, "exec", pod, "-c", READER_CONTAINER, "--"]

    def _run(self, script: str, *args: str) -> subprocess.CompletedProcess[bytes]:
        proc = subprocess.run([*self.prefix, "sh", "-c", script, "sh", *args], capture_output=True)
        if proc.returncode not in (0, MISSING):
            raise PluginError(
                f"reading the job's volume through the reader pod failed (kubectl exec exited "
                f"{proc.returncode}): {proc.stderr.decode(errors='replace').strip()}"
            )
        return proc

    def read(self, path: str, offset: int = 0) -> bytes | None:
        proc = self._run(f'test -f "$1" || exit {MISSING}; tail -c +"$2" "$1"', path, str(offset + 1))
        return None if proc.returncode == MISSING else proc.stdout

    def list_dir(self, path: str) -> list[str] | None:
        proc = self._run(f'test -d "$1" || exit {MISSING}; ls -1A "$1"', path)
        return None if proc.returncode == MISSING else proc.stdout.decode().split()

    def copy_out(self, path: str, dest: Path) -> None:
        with subprocess.Popen(
            [*self.prefix, "tar", "cf", "-", "-C", path, "."], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        ) as proc:
            assert proc.stdout is not None
            with tarfile.open(fileobj=proc.stdout, mode="r|") as archive:
                archive.extractall(dest, filter="data")
            stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.returncode != 0:
            raise PluginError(f"copying {path} out of the reader pod failed: {stderr.strip()}")


class HostPathTransport:
    """Reads the PersistentVolume's directory on this machine (single-machine development clusters)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _local(self, path: str) -> Path:
        relative = Path(path).relative_to(MOUNT)
        return self.root / relative

    def read(self, path: str, offset: int = 0) -> bytes | None:
        local = self._local(path)
        if not local.is_file():
            return None
        with local.open("rb") as handle:
            handle.seek(offset)
            return handle.read()

    def list_dir(self, path: str) -> list[str] | None:
        local = self._local(path)
        return sorted(p.name for p in local.iterdir()) if local.is_dir() else None

    def copy_out(self, path: str, dest: Path) -> None:
        local = self._local(path)
        if not local.is_dir():
            raise NotFound(f"{path} does not exist on the job's volume")
        shutil.copytree(local, dest, dirs_exist_ok=True)
