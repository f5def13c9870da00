"""Reading the job's volume from outside the cluster: a short-lived reader pod and a transport.

Why a reader pod: the job's data (samples, per-step metrics, checkpoints, the final model) lives on its
claim, and must stay readable after the job finished, when no trainer pod exists. A pod that mounts the
claim read-only and only sleeps works in both cases, needs no change to the trainer or its
NetworkPolicy, and needs only permissions of the namespace's edit role (create/get/delete pods,
create pods/exec). While a trainer runs it is placed on the trainer's node, because a ReadWriteOnce
claim can be mounted by several pods on one node only. It deletes itself after ``lifetime`` seconds
if the plugin is interrupted before it removes it.

A transport reads paths under ``/workspace`` through that pod. What is on the volume was written by the
tenant's trainer image, so every transport reads a bounded number of bytes, refuses a path that
resolves (through symbolic links) outside the volume, and copies out only regular files, directories
and symbolic links that stay inside the copied directory:

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
import stat
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import IO, Any, Protocol

from grpo_operator.api.resource import API_VERSION, KIND
from grpo_operator.builders.common import LABEL_JOB, LABEL_NODE_RANK, LABEL_PART_OF, LABEL_ROLE, PART_OF
from grpo_operator.kubectl_plugin.cluster_access import Kube
from grpo_operator.kubectl_plugin.data import MOUNT
from grpo_operator.kubectl_plugin.errors import BadData, NotFound, PluginError

DEFAULT_READER_IMAGE = "busybox:1.37.0"
READER_CONTAINER = "reader"
READER_LABEL = "grpo.dev/reader-for"
ACCESS_ENV = "KUBECTL_GRPO_VOLUME_ACCESS"
# Matches the operator's default pod user (settings.pod_run_as_user / pod_fs_group) when no trainer pod
# exists to copy it from.
DEFAULT_UID = 65532
MISSING = 3  # exit code of the reader's shell when a path does not exist
OUTSIDE = 4  # exit code of the reader's shell when a path resolves outside the volume
CHUNK = 1 << 20


class VolumeTransport(Protocol):
    def size(self, path: str) -> int | None:
        """Size of the regular file at ``path``; None when there is none."""

    def chunks(self, path: str, offset: int, limit: int) -> Iterator[bytes]:
        """At most ``limit`` bytes of the file at ``path`` from ``offset`` on, a chunk at a time."""

    def read(self, path: str, offset: int = 0, limit: int = CHUNK) -> bytes | None:
        """At most ``limit`` bytes of the file at ``path`` from ``offset`` on; None when it does not
        exist."""

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


def outside(path: str, real: str) -> BadData:
    return BadData(
        f"{path} on the job's volume is a symbolic link to {real}, outside the volume: the plugin does "
        "not follow it (the trainer image wrote the link; remove it from the volume)"
    )


def refuse_member(source: str, name: str, why: str) -> BadData:
    return BadData(
        f"refusing to export {source}: {name!r} {why}. Only regular files, directories and relative "
        "symbolic links that stay inside the exported directory are copied; remove it from the volume "
        "(the trainer image wrote it) and export again"
    )


def link_escapes(target: str) -> bool:
    """Whether a symbolic link's target may leave the directory it is in: absolute, or with ``..``
    (checked on the text, since the links it passes through are themselves untrusted)."""
    return target.startswith("/") or ".." in PurePosixPath(target).parts


def extract_tar(stream: IO[bytes], dest: Path, source: str) -> None:
    """Extracts a tar stream of the directory ``source`` into ``dest``, member by member, refusing any
    member that could write or point outside ``dest``."""
    links: set[PurePosixPath] = set()
    try:
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            for member in archive:
                name = PurePosixPath(member.name)
                if member.name.startswith("/") or ".." in name.parts:
                    raise refuse_member(source, member.name, "has a path that leaves the directory")
                if any(parent in links for parent in name.parents):
                    raise refuse_member(source, member.name, "lies under a symbolic link")
                if member.islnk():
                    raise refuse_member(source, member.name, f"is a hard link to {member.linkname!r}")
                if member.issym():
                    if link_escapes(member.linkname):
                        raise refuse_member(source, member.name, f"is a symbolic link to {member.linkname!r}")
                    links.add(name)
                elif not (member.isfile() or member.isdir()):
                    raise refuse_member(source, member.name, "is a device, pipe or other special file")
                archive.extract(member, dest, filter="data")
    except tarfile.TarError as exc:
        raise BadData(
            f"copying {source} out of the job's volume failed: what the reader pod sent is not a "
            f"readable tar archive ({exc}); check the reader image (--reader-image) has a working tar"
        ) from exc


# Resolves "$1" in the reader pod and refuses what lies outside the volume; later commands use "$p".
_RESOLVE = (
    f'p=$(realpath "$1" 2>/dev/null) || exit {MISSING}; '
    f'case "$p" in {MOUNT}|{MOUNT}/*) ;; *) echo "$p" >&2; exit {OUTSIDE};; esac; '
)


class ExecTransport:
    """Reads through ``kubectl exec`` into the reader pod."""

    def __init__(self, kubectl: list[str], pod: str) -> None:
        self.prefix = [*kubectl, "exec", pod, "-c", READER_CONTAINER, "--"]

    def _check(self, returncode: int, stderr: str, path: str) -> None:
        if returncode == OUTSIDE:
            raise outside(path, stderr.strip()[:4096])
        if returncode not in (0, MISSING):
            raise PluginError(
                f"reading the job's volume through the reader pod failed (kubectl exec exited "
                f"{returncode}): {stderr.strip()[:4096]}. On a cluster whose nodes run no containers (the "
                f"project's local cluster of `make demo`, simulated nodes), set {ACCESS_ENV}=hostpath"
            )

    def _run(self, script: str, *args: str) -> subprocess.CompletedProcess[bytes]:
        proc = subprocess.run([*self.prefix, "sh", "-c", _RESOLVE + script, "sh", *args], capture_output=True)
        self._check(proc.returncode, proc.stderr.decode(errors="replace"), args[0])
        return proc

    def size(self, path: str) -> int | None:
        proc = self._run(f'test -f "$p" || exit {MISSING}; stat -c %s "$p"', path)
        if proc.returncode == MISSING:
            return None
        try:
            return int(proc.stdout.strip())
        except ValueError as exc:
            raise PluginError(
                f"the reader pod's stat printed {proc.stdout[:200]!r} for {path}, not a size: "
                "choose a reader image with busybox or coreutils stat (--reader-image)"
            ) from exc

    def chunks(self, path: str, offset: int, limit: int) -> Iterator[bytes]:
        script = f'test -f "$p" || exit {MISSING}; tail -c +"$2" "$p" | head -c "$3"'
        with (
            tempfile.TemporaryFile() as err,
            subprocess.Popen(
                [*self.prefix, "sh", "-c", _RESOLVE + script, "sh", path, str(offset + 1), str(limit)],
                stdout=subprocess.PIPE,
                stderr=err,
            ) as proc,
        ):
            assert proc.stdout is not None
            while chunk := proc.stdout.read(CHUNK):
                yield chunk
            proc.wait()
            err.seek(0)
            self._check(proc.returncode, err.read(4096).decode(errors="replace"), path)

    def read(self, path: str, offset: int = 0, limit: int = CHUNK) -> bytes | None:
        if self.size(path) is None:
            return None
        return b"".join(self.chunks(path, offset, limit))

    def list_dir(self, path: str) -> list[str] | None:
        proc = self._run(f'test -d "$p" || exit {MISSING}; ls -1A "$p"', path)
        return None if proc.returncode == MISSING else proc.stdout.decode(errors="replace").split()

    def copy_out(self, path: str, dest: Path) -> None:
        script = f'test -d "$p" || exit {MISSING}; exec tar cf - -C "$p" .'
        with (
            tempfile.TemporaryFile() as err,
            subprocess.Popen(
                [*self.prefix, "sh", "-c", _RESOLVE + script, "sh", path], stdout=subprocess.PIPE, stderr=err
            ) as proc,
        ):
            assert proc.stdout is not None
            try:
                extract_tar(proc.stdout, dest, path)
            except BadData:
                # Killing an exited process does nothing, so wait() still tells whether the stream was
                # empty because the path was missing or refused, which is the error to report then.
                proc.kill()
                proc.wait()
                if proc.returncode not in (MISSING, OUTSIDE):
                    raise
                err.seek(0)
                stderr = err.read(4096).decode(errors="replace")
            else:
                proc.wait()
                err.seek(0)
                stderr = err.read(4096).decode(errors="replace")
        if proc.returncode == MISSING:
            raise NotFound(f"{path} does not exist on the job's volume")
        self._check(proc.returncode, stderr, path)
        if proc.returncode != 0:
            raise PluginError(f"copying {path} out of the reader pod failed: {stderr.strip()}")


class HostPathTransport:
    """Reads the PersistentVolume's directory on this machine (single-machine development clusters)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _local(self, path: str) -> Path | None:
        """The file behind ``path``, resolved; None when it does not exist; refused when it resolves
        outside the volume."""
        local = self.root / Path(path).relative_to(MOUNT)
        try:
            real = local.resolve(strict=True)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except RuntimeError as exc:  # a loop of links
            raise BadData(f"{path} on the job's volume is a loop of symbolic links ({exc})") from exc
        if not real.is_relative_to(self.root.resolve()):
            raise outside(path, str(real))
        return real

    def _open(self, path: str) -> int | None:
        local = self._local(path)
        if local is None:
            return None
        try:
            # Non-blocking: opening a named pipe for reading would otherwise wait for a writer forever.
            fd = os.open(local, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
        except (FileNotFoundError, IsADirectoryError):
            return None
        except OSError as exc:
            raise BadData(f"{path} on the job's volume cannot be opened ({exc})") from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd

    def size(self, path: str) -> int | None:
        fd = self._open(path)
        if fd is None:
            return None
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def chunks(self, path: str, offset: int, limit: int) -> Iterator[bytes]:
        fd = self._open(path)
        if fd is None:
            return
        with os.fdopen(fd, "rb") as handle:
            handle.seek(offset)
            while limit > 0 and (chunk := handle.read(min(CHUNK, limit))):
                limit -= len(chunk)
                yield chunk

    def read(self, path: str, offset: int = 0, limit: int = CHUNK) -> bytes | None:
        if self.size(path) is None:
            return None
        return b"".join(self.chunks(path, offset, limit))

    def list_dir(self, path: str) -> list[str] | None:
        local = self._local(path)
        return sorted(p.name for p in local.iterdir()) if local is not None and local.is_dir() else None

    def copy_out(self, path: str, dest: Path) -> None:
        local = self._local(path)
        if local is None or not local.is_dir():
            raise NotFound(f"{path} does not exist on the job's volume")

        def copy_file(src: str, dst: str) -> None:
            name = os.path.relpath(src, local)
            try:
                fd = os.open(src, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError as exc:
                raise refuse_member(path, name, f"cannot be opened ({exc.strerror})") from exc
            with os.fdopen(fd, "rb") as source, open(dst, "wb") as target:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise refuse_member(path, name, "is a device, pipe or other special file")
                shutil.copyfileobj(source, target)

        # Links are copied as links, never followed, and checked afterwards in ``dest``, which the
        # trainer cannot change while they are checked.
        shutil.copytree(local, dest, symlinks=True, dirs_exist_ok=True, copy_function=copy_file)
        for dirpath, dirnames, filenames in os.walk(dest):
            for name in dirnames + filenames:
                entry = Path(dirpath) / name
                if entry.is_symlink() and link_escapes(os.readlink(entry)):
                    raise refuse_member(
                        path, str(entry.relative_to(dest)), f"is a symbolic link to {os.readlink(entry)!r}"
                    )
