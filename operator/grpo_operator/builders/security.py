"""Pod Security: the security contexts and writable directories of every pod the operator creates.

Under the default level, ``restricted``, every pod meets the Kubernetes *restricted* Pod Security
Standard, so a tenant namespace may enforce it: a numeric non-root user, the container runtime's
default seccomp profile, no privilege escalation, every capability dropped, and only configMap,
persistentVolumeClaim and emptyDir volumes. ``baseline`` lifts the non-root requirement alone, for
images that must run as root, and needs namespaces that enforce no more than *baseline*. ``privileged``
is baseline plus the IPC_LOCK capability on trainer and vLLM containers (settings.ipc_lock, added by
builders/fast_network.py), which only the *privileged* standard allows; pods stay unprivileged otherwise.

Running an image as a user it was not built for (the stock vLLM image runs as root) works only if
what it writes is writable by that user and nothing asks the user database for its name. Every
container therefore gets an emptyDir ``/tmp``, an emptyDir home directory in ``HOME`` (where HF,
vLLM, Triton, FlashInfer and pip put their caches) and ``USER``: Python's ``getpass.getuser()``,
which some torch releases call unguarded to name their compile caches, raises KeyError for a uid
missing from /etc/passwd unless USER is set. The pod's ``fsGroup`` makes the job's volume group-writable for that user.
"""

from __future__ import annotations

from typing import Any

from grpo_operator.settings import OperatorSettings

HOME_DIR = "/home/grpo"
TMP_DIR = "/tmp"
USER_NAME = "grpo"
HOME_VOLUME = "home"
TMP_VOLUME = "tmp"


def pod_security_context(settings: OperatorSettings) -> dict[str, Any]:
    context: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if settings.pod_security == "restricted":
        context.update(
            {
                "runAsNonRoot": True,
                "runAsUser": settings.pod_run_as_user,
                "runAsGroup": settings.pod_run_as_group,
            }
        )
    # The volume root is chowned to this group only when its owner group differs: a checkpoint volume
    # holds many files, and a recursive chown at every pod start would delay each restart.
    context.update({"fsGroup": settings.pod_fs_group, "fsGroupChangePolicy": "OnRootMismatch"})
    return context


def container_security_context() -> dict[str, Any]:
    # The same at every level: the non-root user is set for the whole pod (pod_security_context); the one
    # capability the privileged level adds is added to trainer and vLLM containers alone (fast_network.py).
    return {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]}}


def secure_pod_spec(pod_spec: dict[str, Any], settings: OperatorSettings) -> dict[str, Any]:
    """``pod_spec`` with the security contexts set on the pod and on every container and init
    container, and with the writable /tmp and home directory, in place. An env var or a mount the
    container already has (a user's HOME, say) is kept."""
    pod_spec["securityContext"] = pod_security_context(settings)
    volumes: list[dict[str, Any]] = pod_spec.setdefault("volumes", [])
    names = {v["name"] for v in volumes}
    for name in (TMP_VOLUME, HOME_VOLUME):
        if name not in names:
            volumes.append({"name": name, "emptyDir": {}})
    for container in [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]:
        container["securityContext"] = container_security_context()
        mounts: list[dict[str, Any]] = container.setdefault("volumeMounts", [])
        paths = {m["mountPath"] for m in mounts}
        for name, path in ((TMP_VOLUME, TMP_DIR), (HOME_VOLUME, HOME_DIR)):
            if path not in paths:
                mounts.append({"name": name, "mountPath": path})
        env: list[dict[str, Any]] = container.setdefault("env", [])
        present = {e["name"] for e in env}
        env.extend(
            {"name": key, "value": value}
            for key, value in (("HOME", HOME_DIR), ("USER", USER_NAME))
            if key not in present
        )
    return pod_spec
