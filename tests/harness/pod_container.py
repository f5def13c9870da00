"""TEST HARNESS — runs a pod's container from the pod as the API server holds it, with Podman.

kwok's simulated nodes start no container. For the pods whose image `make images` builds (the operator the
chart deploys, the metric servers), this plays the kubelet's container runtime: it reads the pod and
starts its first container in the project's image, with what the pod asks for and nothing more:

- the image, its command and args (``--pull never``: the image must be the one built here);
- the container's env (values, and the field, Secret and ConfigMap references a kubelet resolves), plus
  KUBERNETES_SERVICE_HOST/PORT, which every kubelet sets, pointing at the local API server;
- the pod's and the container's security context: user and group, fsGroup, runAsNonRoot (refused before
  start, as a kubelet does, when the image would run as root), a read-only root filesystem (with no
  writable tmpfs added: only the pod's own volumes are writable), dropped and added capabilities,
  no_new_privs for ``allowPrivilegeEscalation: false``;
- the pod's volumes: emptyDir as a tmpfs, and the projected volume the ServiceAccount admission adds
  (a token of the pod's own ServiceAccount, bound to the pod, from the TokenRequest API; the cluster's CA;
  the namespace), so the container reaches the API server as that ServiceAccount and nothing else;
- memory and CPU limits.

What differs from a kubelet, and why: the container shares the host's network (there is no pod network
here; the local cluster's Services are rewritten to 127.0.0.1 by the harness), and probes are run by the
test (:func:`probe_url` resolves a probe's named port), not on a schedule.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hack import images
from tests.harness.kube import Cluster

TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def engine_env() -> dict[str, str]:
    # The settings `make images` builds with (hack/containers.conf), so the tests run what it built.
    return images.engine_env("podman")


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["podman", *args], env=engine_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc


def missing_images(*tags: str) -> list[str]:
    """The tags Podman does not have (all of them when Podman itself is missing)."""
    if not shutil.which("podman"):
        return list(tags)
    return [tag for tag in tags if podman("image", "exists", tag, check=False).returncode != 0]


@dataclass
class PodContainer:
    """One running container of a pod; its output goes to ``log``."""

    name: str
    pod: dict[str, Any]
    popen: subprocess.Popen[bytes]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def exec(self, *command: str) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *command, check=False)

    def running(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: int = 20) -> int:
        if self.popen.poll() is None:
            podman("stop", "--time", str(grace), self.name, check=False, timeout=grace + 30)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                podman("rm", "--force", self.name, check=False)
                self.popen.wait(timeout=30)
        return int(self.popen.returncode)


def probe_url(pod: dict[str, Any], probe: str) -> str:
    """http://127.0.0.1:<port><path> of the first container's ``probe`` (readinessProbe, livenessProbe),
    a named port resolved through the container's ports, as a kubelet does."""
    container = pod["spec"]["containers"][0]
    get = container[probe]["httpGet"]
    port = get["port"]
    if isinstance(port, str) and not port.isdigit():
        named = [p["containerPort"] for p in container.get("ports") or [] if p.get("name") == port]
        assert named, f"{probe} names port {port!r}, which the container does not declare"
        port = named[0]
    return f"http://127.0.0.1:{port}{get.get('path', '/')}"


def _api_server(kube: Cluster) -> tuple[str, str, bytes]:
    """(host, port, CA certificate) of the local API server, from the admin kubeconfig."""
    cluster = yaml.safe_load(kube.kubeconfig.read_text())["clusters"][0]["cluster"]
    url = urllib.parse.urlsplit(cluster["server"])
    if "certificate-authority-data" in cluster:
        ca = base64.b64decode(cluster["certificate-authority-data"])
    else:
        ca = (kube.kubeconfig.parent / cluster["certificate-authority"]).read_bytes()
    return url.hostname or "127.0.0.1", str(url.port or 443), ca


def _field(pod: dict[str, Any], path: str) -> str:
    meta = pod["metadata"]
    values: dict[str, str] = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    if path not in values:
        raise AssertionError(f"pod {meta['name']}: fieldRef {path} is not resolved by this harness")
    return values[path]


def _key_of(kube: Cluster, kind: str, name: str, key: str, namespace: str) -> str:
    obj = kube.get(kind, name, namespace)
    assert obj is not None, f"{kind} {namespace}/{name} referenced by the pod does not exist"
    if kind == "secret":
        return base64.b64decode(obj["data"][key]).decode()
    return str(obj["data"][key])


def _env(kube: Cluster, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        source = item.get("valueFrom") or {}
        if not source:  # the API server drops `value: ""`; an env var with neither is empty
            env[item["name"]] = item.get("value", "")
            continue
        if "fieldRef" in source:
            env[item["name"]] = _field(pod, source["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[item["name"]] = _key_of(kube, "secret", ref["name"], ref["key"], namespace)
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[item["name"]] = _key_of(kube, "configmap", ref["name"], ref["key"], namespace)
        else:
            raise AssertionError(f"env {item['name']}: {sorted(source)} is not resolved by this harness")
    return env


def _projected(kube: Cluster, pod: dict[str, Any], volume: dict[str, Any], target: Path, ca: bytes) -> None:
    """Writes a projected volume's files (ServiceAccount token, ConfigMap keys, downward API) to ``target``.
    ``ca`` is the API server's CA: kube-root-ca.crt's content where no controller publishes that ConfigMap."""
    meta = pod["metadata"]
    target.mkdir(parents=True, exist_ok=True)
    target.chmod(0o755)
    for source in volume["projected"]["sources"]:
        files: dict[str, str] = {}
        if "serviceAccountToken" in source:
            token = source["serviceAccountToken"]
            command = [
                "create", "token", pod["spec"].get("serviceAccountName", "default"), "-n", meta["namespace"],
                "--bound-object-kind", "Pod", "--bound-object-name", meta["name"],
                "--bound-object-uid", meta["uid"],
                f"--duration={token.get('expirationSeconds', 3607)}s",
            ]  # fmt: skip
            if token.get("audience"):
                command.append(f"--audience={token['audience']}")
            files[token["path"]] = kube.kubectl(*command).stdout.strip()
        elif "configMap" in source:
            ref = source["configMap"]
            published = kube.get("configmap", ref["name"], meta["namespace"])
            for item in ref.get("items") or []:
                if published is None and ref["name"] == "kube-root-ca.crt":
                    files[item["path"]] = ca.decode()
                else:
                    files[item["path"]] = _key_of(
                        kube, "configmap", ref["name"], item["key"], meta["namespace"]
                    )
        elif "downwardAPI" in source:
            for item in source["downwardAPI"].get("items") or []:
                files[item["path"]] = _field(pod, item["fieldRef"]["fieldPath"])
        else:
            raise AssertionError(f"projected source {sorted(source)} is not resolved by this harness")
        for path, content in files.items():
            written = target / path
            written.write_text(content)
            written.chmod(0o644)


def _security(pod: dict[str, Any], container: dict[str, Any], image_user: str) -> list[str]:
    pod_context = pod["spec"].get("securityContext") or {}
    context = container.get("securityContext") or {}
    if context.get("privileged"):
        raise AssertionError("privileged containers are not run by this harness")
    uid = context.get("runAsUser", pod_context.get("runAsUser"))
    gid = context.get("runAsGroup", pod_context.get("runAsGroup"))
    args: list[str] = []
    if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")):
        # The kubelet's check: with no runAsUser, the image's USER must be numeric and not 0.
        effective = str(uid) if uid is not None else image_user.split(":")[0]
        if not effective.isdigit() or int(effective) == 0:
            raise AssertionError(
                f"container has runAsNonRoot and the image would run as {effective or 'root'!r}: "
                "a kubelet refuses to start it"
            )
    if uid is not None:
        args += ["--user", f"{uid}:{gid}" if gid is not None else str(uid)]
    for group in [pod_context.get("fsGroup"), *(pod_context.get("supplementalGroups") or [])]:
        if group is not None:
            args += ["--group-add", str(group)]
    if context.get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]
    capabilities = context.get("capabilities") or {}
    args += [f"--cap-drop={cap.lower()}" for cap in capabilities.get("drop") or []]
    args += [f"--cap-add={cap.lower()}" for cap in capabilities.get("add") or []]
    if context.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    return args


def _quantity_bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9}
    match = re.fullmatch(r"(\d+)([KMG]i?)?", quantity)
    assert match, f"memory quantity {quantity!r} is not resolved by this harness"
    return int(match.group(1)) * units.get(match.group(2) or "", 1)


def _cpus(quantity: str) -> str:
    return str(int(quantity[:-1]) / 1000) if quantity.endswith("m") else quantity


def run_command(
    kube: Cluster, pod: dict[str, Any], workdir: Path, env_overrides: dict[str, str] | None = None
) -> tuple[str, list[str]]:
    """(container name, the `podman run` command line) that runs ``pod``'s first container in the
    foreground: the command exits when the container does, and a SIGTERM to it reaches the container."""
    meta, spec = pod["metadata"], pod["spec"]
    container = spec["containers"][0]
    name = re.sub(r"[^a-zA-Z0-9_.-]", "-", f"grpo-{meta['namespace']}-{meta['name']}")[:120]
    podman("rm", "--force", name, check=False)
    image = container["image"]
    image_user = podman("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    host, port, ca = _api_server(kube)
    args = ["run", "--rm", "--name", name, "--pull", "never", "--network", "host", "--hostname", meta["name"]]
    args += _security(pod, container, image_user)
    env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
    env.update(_env(kube, pod, container))
    env.update(env_overrides or {})
    for key, value in env.items():
        args += ["--env", f"{key}={value}"]
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    volume_dir = workdir / f"{meta['name']}-volumes"
    for mount in container.get("volumeMounts") or []:
        volume = volumes[mount["name"]]
        read_only = ",ro" if mount.get("readOnly") else ""
        if "emptyDir" in volume:
            size = (volume["emptyDir"] or {}).get("sizeLimit")
            tmpfs = f"type=tmpfs,destination={mount['mountPath']},tmpfs-mode=1777"
            args += ["--mount", tmpfs + (f",tmpfs-size={_quantity_bytes(size)}" if size else "")]
        elif "projected" in volume:
            target = volume_dir / mount["name"]
            _projected(kube, pod, volume, target, ca)
            args += ["--mount", f"type=bind,source={target},destination={mount['mountPath']}{read_only}"]
        else:
            raise AssertionError(f"volume {mount['name']}: {sorted(volume)} is not resolved by this harness")
    limits = (container.get("resources") or {}).get("limits") or {}
    if "memory" in limits:
        args += ["--memory", str(_quantity_bytes(str(limits["memory"])))]
    if "cpu" in limits:
        args += ["--cpus", _cpus(str(limits["cpu"]))]
    if container.get("workingDir"):
        args += ["--workdir", container["workingDir"]]
    if container.get("command"):
        args += ["--entrypoint", json.dumps(container["command"])]
    args += [image, *(container.get("args") or [])]
    return name, ["env", f"CONTAINERS_CONF={engine_env()['CONTAINERS_CONF']}", "podman", *args]


def run_pod(
    kube: Cluster, pod: dict[str, Any], workdir: Path, env_overrides: dict[str, str] | None = None
) -> PodContainer:
    """Starts ``pod``'s first container (as read from the API server) and returns it once running."""
    workdir.mkdir(parents=True, exist_ok=True)
    name, command = run_command(kube, pod, workdir, env_overrides)
    log = workdir / f"{pod['metadata']['name']}.log"
    with log.open("ab") as handle:
        popen = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
    started = PodContainer(name, pod, popen, log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = podman("inspect", "--format", "{{.State.Status}}", name, check=False).stdout.strip()
        if state == "running":
            return started
        if popen.poll() is not None:
            raise AssertionError(f"container {name} exited {popen.returncode}:\n{started.log_text()[-3000:]}")
        time.sleep(0.3)
    raise AssertionError(f"container {name} did not start within 60 s:\n{started.log_text()[-3000:]}")


def metric_in_container(kube: Cluster, workdir: Path) -> Callable[[dict[str, Any], int], list[str]]:
    """For the local runner's ``metric_commands``: the metric pod's own container, serving on ``port``
    (the local stand-in for the metric Service's port, passed as GRPO_METRIC_PORT as the operator does)."""

    def command(pod: dict[str, Any], port: int) -> list[str]:
        workdir.mkdir(parents=True, exist_ok=True)
        return run_command(kube, pod, workdir, {"GRPO_METRIC_PORT": str(port)})[1]

    return command
