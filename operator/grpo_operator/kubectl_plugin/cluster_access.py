"""Kubernetes API access for the plugin, with kubectl's connection flags and permission checks."""

from __future__ import annotations

import codecs
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from grpo_operator.api.resource import GROUP, PLURAL, VERSION
from grpo_operator.kubectl_plugin.errors import Forbidden, NotFound, PluginError

EDIT_ROLE_HINT = (
    "The edit role (Kubernetes' built-in `edit`, which the grpo-operator chart extends to GRPOJobs) "
    "grants this: ask your cluster admin for a RoleBinding to it in this namespace."
)


@dataclass(frozen=True)
class Permission:
    verb: str
    resource: str
    why: str
    group: str = ""
    subresource: str = ""

    def text(self) -> str:
        name = self.resource + (f"/{self.subresource}" if self.subresource else "")
        return f"{self.verb} {name}{'.' + self.group if self.group else ''}"


GET_JOB = Permission("get", PLURAL, "read the job", GROUP)
PATCH_JOB = Permission("patch", PLURAL, "set spec.suspend", GROUP)
READER = (
    Permission("get", "persistentvolumeclaims", "find the job's volume"),
    Permission("create", "pods", "start a reader pod that mounts the job's volume read-only"),
    Permission("get", "pods", "wait for the reader pod"),
    Permission("delete", "pods", "remove the reader pod afterwards"),
    Permission("create", "pods", "read files through the reader pod", subresource="exec"),
)
LOGS = (
    Permission("list", "pods", "find the job's pods"),
    Permission("get", "pods", "read pod logs", subresource="log"),
)


def _api_error(exc: ApiException, what: str) -> PluginError:
    reason = exc.reason or ""
    try:
        import json

        reason = json.loads(exc.body or "{}").get("message") or reason
    except ValueError:
        pass
    if exc.status == 404:
        return NotFound(f"{what}: not found ({reason})")
    if exc.status == 403:
        return Forbidden(f"{what}: forbidden ({reason}). {EDIT_ROLE_HINT}")
    return PluginError(f"{what}: the API server answered {exc.status} ({reason})")


class Kube:
    """One connection, as kubectl would make it from ``--kubeconfig``, ``--context`` and ``-n``."""

    def __init__(self, kubeconfig: str | None, context: str | None, namespace: str | None) -> None:
        self.kubeconfig = kubeconfig
        self.context = context
        try:
            self.api = config.new_client_from_config(config_file=kubeconfig, context=context)
            contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
        except (ConfigException, OSError) as exc:
            raise PluginError(
                f"cannot load the kubeconfig ({exc}): pass --kubeconfig FILE, set KUBECONFIG, "
                "or pick a context that exists with --context"
            ) from exc
        chosen = next((c for c in contexts if c["name"] == context), None) if context else active
        self.namespace = namespace or ((chosen or {}).get("context") or {}).get("namespace") or "default"
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.auth = client.AuthorizationV1Api(self.api)

    def kubectl(self) -> list[str]:
        """The real kubectl with the same connection flags (used for exec)."""
        binary = shutil.which("kubectl")
        if binary is None:
            raise PluginError(
                "kubectl is not on PATH: the plugin runs `kubectl exec` to read the job's volume"
            )
        args = [binary]
        if self.kubeconfig:
            args += ["--kubeconfig", self.kubeconfig]
        if self.context:
            args += ["--context", self.context]
        return [*args, "-n", self.namespace]

    # -- permissions --------------------------------------------------------------------------
    def missing(self, permissions: tuple[Permission, ...] | list[Permission]) -> list[Permission]:
        absent = []
        for p in permissions:
            review = client.V1SelfSubjectAccessReview(
                spec=client.V1SelfSubjectAccessReviewSpec(
                    resource_attributes=client.V1ResourceAttributes(
                        namespace=self.namespace,
                        verb=p.verb,
                        group=p.group,
                        resource=p.resource,
                        subresource=p.subresource or None,
                    )
                )
            )
            try:
                answer = self.auth.create_self_subject_access_review(review)
            except ApiException as exc:
                raise _api_error(exc, "checking your permissions (SelfSubjectAccessReview)") from exc
            if not answer.status.allowed:
                absent.append(p)
        return absent

    def require(self, permissions: tuple[Permission, ...] | list[Permission]) -> None:
        absent = self.missing(permissions)
        if absent:
            raise Forbidden(self.forbidden_text(absent))

    def forbidden_text(self, absent: list[Permission]) -> str:
        lines = "\n".join(f"  - {p.text()}  (to {p.why})" for p in absent)
        return f"you are not allowed, in namespace {self.namespace!r}:\n{lines}\n{EDIT_ROLE_HINT}"

    # -- the job ------------------------------------------------------------------------------
    def job(self, name: str) -> dict[str, Any]:
        try:
            job: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                raise NotFound(
                    f'GRPOJob "{name}" not found in namespace "{self.namespace}" '
                    f"(list them with: kubectl get grpo -n {self.namespace})"
                ) from exc
            if exc.status == 403:
                raise Forbidden(self.forbidden_text([GET_JOB])) from exc
            raise _api_error(exc, f"reading GRPOJob {name}") from exc
        return job

    def set_suspend(self, name: str, value: bool) -> dict[str, Any]:
        try:
            job: dict[str, Any] = self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, {"spec": {"suspend": value}}
            )
        except ApiException as exc:
            if exc.status == 403:
                raise Forbidden(self.forbidden_text([PATCH_JOB])) from exc
            raise _api_error(exc, f"patching GRPOJob {name}") from exc
        return job

    def config_map(self, name: str) -> dict[str, Any] | None:
        try:
            found = self.core.read_namespaced_config_map(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _api_error(exc, f"reading ConfigMap {name}") from exc
        return dict(self.api.sanitize_for_serialization(found))

    # -- pods, events, claims -----------------------------------------------------------------
    def pods(self, selector: str) -> list[dict[str, Any]]:
        try:
            found = self.core.list_namespaced_pod(self.namespace, label_selector=selector)
        except ApiException as exc:
            raise _api_error(exc, f"listing pods ({selector})") from exc
        return [self.api.sanitize_for_serialization(p) for p in found.items]

    def pod(self, name: str) -> dict[str, Any] | None:
        try:
            pod = self.core.read_namespaced_pod(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _api_error(exc, f"reading pod {name}") from exc
        return dict(self.api.sanitize_for_serialization(pod))

    def create_pod(self, manifest: dict[str, Any]) -> None:
        try:
            self.core.create_namespaced_pod(self.namespace, manifest)
        except ApiException as exc:
            if exc.status == 403 and "forbidden" in (exc.body or "") and "exceeded quota" in (exc.body or ""):
                raise PluginError(f"the reader pod does not fit the namespace's quota: {exc.body}") from exc
            raise _api_error(exc, "creating the reader pod") from exc

    def delete_pod(self, name: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise _api_error(exc, f"deleting pod {name}") from exc

    def events(self, uid: str) -> list[dict[str, Any]]:
        try:
            found = self.core.list_namespaced_event(
                self.namespace, field_selector=f"involvedObject.uid={uid}"
            )
        except ApiException as exc:
            raise _api_error(exc, "listing the job's events") from exc
        return [self.api.sanitize_for_serialization(e) for e in found.items]

    def claim(self, name: str) -> dict[str, Any]:
        try:
            pvc = self.core.read_namespaced_persistent_volume_claim(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise NotFound(
                    f"the job's volume claim {name!r} does not exist in namespace {self.namespace!r} "
                    "(the job has not created it yet, or it was deleted with the job)"
                ) from exc
            raise _api_error(exc, f"reading claim {name}") from exc
        return dict(self.api.sanitize_for_serialization(pvc))

    def volume_host_path(self, claim: dict[str, Any]) -> str:
        """The node-local directory behind a bound claim (hostPath or local PersistentVolumes only)."""
        volume = (claim.get("spec") or {}).get("volumeName")
        if not volume:
            raise PluginError(f"claim {claim['metadata']['name']} is not bound to a volume yet")
        try:
            pv = self.api.sanitize_for_serialization(self.core.read_persistent_volume(volume))
        except ApiException as exc:
            raise _api_error(exc, f"reading PersistentVolume {volume}") from exc
        spec = pv.get("spec") or {}
        path = (spec.get("hostPath") or spec.get("local") or {}).get("path")
        if not path:
            raise PluginError(f"PersistentVolume {volume} is neither hostPath nor local: use exec access")
        return str(path)

    def log_chunks(self, pod: str, container: str | None, follow: bool, tail: int | None) -> Iterator[str]:
        try:
            response = self.core.read_namespaced_pod_log(
                pod,
                self.namespace,
                container=container,
                follow=follow,
                tail_lines=tail,
                _preload_content=False,
            )
        except ApiException as exc:
            raise _api_error(exc, f"reading the log of pod {pod}") from exc
        # A character split between two chunks is decoded whole, not as two replacement characters.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            for raw in response.stream(decode_content=True):
                yield decoder.decode(raw)
        finally:
            response.release_conn()
