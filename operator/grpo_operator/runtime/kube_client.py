"""A small synchronous Kubernetes REST client over the `kubernetes` package's ApiClient.

The reconcile loop works with plain dicts (what builders produce and reconcile reads), so it talks to
the API server by resource path instead of through the generated typed models: no model round-trips,
unknown fields survive, and one code path serves every kind. Authentication, TLS and token refresh
are the ApiClient's (kubeconfig or in-cluster config).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from grpo_operator.api.resource import GROUP, PLURAL, VERSION
from grpo_operator.builders.child_kinds import CHILD_KINDS, watched

Obj = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
        if subresource is not None:
            base += f"/{subresource}"
        return base


GRPOJOB = Resource(GROUP, VERSION, PLURAL, "GRPOJob")
NODE = Resource("", "v1", "nodes", "Node")
# Read (never written) for each class's volumeBindingMode: a new gang waits for a claim that binds at once.
STORAGE_CLASS = Resource("storage.k8s.io", "v1", "storageclasses", "StorageClass")
EVENT = Resource("", "v1", "events", "Event")
# Kueue's Workload of a queued pod group: read (never written) to show why Kueue has not admitted a job.
KUEUE_WORKLOAD = Resource("kueue.x-k8s.io", "v1beta2", "workloads", "Workload")

# Every kind the operator creates for a job and watches, in the order they are observed
# (builders/child_kinds.py); the kinds it does not watch (Secrets) are only ever created.
CHILD_RESOURCES: tuple[Resource, ...] = tuple(
    Resource(k.group, k.version, k.plural, k.kind) for k in CHILD_KINDS if watched(k)
)
UNWATCHED_RESOURCES: tuple[Resource, ...] = tuple(
    Resource(k.group, k.version, k.plural, k.kind) for k in CHILD_KINDS if not watched(k)
)
POD = next(r for r in CHILD_RESOURCES if r.kind == "Pod")
BY_KIND: dict[str, Resource] = {
    r.kind: r for r in (*CHILD_RESOURCES, *UNWATCHED_RESOURCES, GRPOJOB, NODE, EVENT)
}


def resource_for(kind: str) -> Resource:
    try:
        return BY_KIND[kind]
    except KeyError:
        raise ValueError(f"the operator does not manage objects of kind {kind!r}") from None


# Called once per API request with (verb, resource), e.g. ("create", "pods"), ("patch", "grpojobs/status").
RequestHook = Callable[[str, str], None]


def classify_request(method: str, url: str) -> tuple[str, str]:
    """The Kubernetes verb and resource (with its subresource) of a request, for counting requests.

    ``/api/v1/namespaces/a/pods`` GET is ("list", "pods"), with ``watch=true`` ("watch", "pods");
    ``/apis/grpo.dev/v1alpha1/namespaces/a/grpojobs/j/status`` PATCH is ("patch", "grpojobs/status").
    """
    parts = urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    for i, segment in enumerate(segments):  # the API root may sit under a proxy prefix
        if segment in ("api", "apis"):
            segments = segments[i + (2 if segment == "api" else 3) :]
            break
    if len(segments) > 2 and segments[0] == "namespaces":
        segments = segments[2:]
    resource = segments[0] if segments else "unknown"
    named = len(segments) >= 2
    if len(segments) >= 3:
        resource += "/" + segments[2]
    method = method.upper()
    if method == "GET":
        verb = "watch" if parse_qs(parts.query).get("watch") == ["true"] else "get" if named else "list"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
            method, method.lower()
        )
    return verb, resource


class CountingApiClient(client.ApiClient):  # type: ignore[misc]
    """An ApiClient that reports every request it sends to ``on_request`` (the operator's request counter)."""

    on_request: RequestHook | None = None

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        hook = self.on_request
        if hook is not None:
            hook(*classify_request(method, url))
        return super().call_api(method, url, *args, **kwargs)


def load_api_client(kubeconfig: str | None = None, pool_size: int = 16) -> client.ApiClient:
    """In-cluster config inside a pod, else the kubeconfig (``kubeconfig``, $KUBECONFIG or ~/.kube/config).

    ``pool_size`` connections are kept open: as many as API calls can be in flight at once.
    """
    configuration = client.Configuration()
    try:
        if kubeconfig is None and not os.environ.get("KUBECONFIG"):
            config.load_incluster_config(client_configuration=configuration)
            configuration.connection_pool_maxsize = pool_size
            return CountingApiClient(configuration)
    except config.ConfigException:
        pass
    try:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except (config.ConfigException, FileNotFoundError, OSError) as exc:
        raise RuntimeError(
            f"no Kubernetes credentials: not running in a pod and the kubeconfig could not be loaded ({exc}). "
            "Set KUBECONFIG or pass --kubeconfig."
        ) from exc
    configuration.connection_pool_maxsize = pool_size
    return CountingApiClient(configuration)


class Kube:
    """Blocking calls; the controller runs them in worker threads."""

    def __init__(self, api: client.ApiClient, *, field_manager: str, timeout: float) -> None:
        self.api = api
        self.field_manager = field_manager
        self.timeout = timeout
        self.on_request: RequestHook | None = None

    def count_requests(self, hook: RequestHook) -> None:
        """Report every request of this client and of its watch clients to ``hook``."""
        self.on_request = hook
        if isinstance(self.api, CountingApiClient):
            self.api.on_request = hook

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Obj:
        url_path = path + ("?" + urlencode(query) if query else "")
        headers = {"Accept": "application/json", "Content-Type": content_type}
        _, url, header_params, serialized, _ = self.api.param_serialize(
            method=method,
            resource_path=url_path,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(
            method, url, header_params=header_params, body=serialized, _request_timeout=self.timeout
        )
        response.read()
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
        data = response.data
        return json.loads(data) if data else {}

    def watch_client(self, streams: int) -> client.ApiClient:
        """A client of its own for ``streams`` long-lived watch requests, so they never hold the
        connections that reconcile's requests need."""
        configuration = copy.deepcopy(self.api.configuration)
        configuration.connection_pool_maxsize = streams + 2
        watcher = CountingApiClient(configuration)
        watcher.on_request = self.on_request
        return watcher

    # --- reads ------------------------------------------------------------------------------------------------

    def get(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        return self.request("GET", resource.path(namespace, name))

    def list(
        self,
        resource: Resource,
        namespace: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        query = {"labelSelector": label_selector} if label_selector else {}
        if field_selector:
            query["fieldSelector"] = field_selector
        items = self.request("GET", resource.path(namespace), query=query or None).get("items") or []
        # List items carry no kind; reconcile needs it to tell children apart.
        for item in items:
            item["kind"] = resource.kind
            item["apiVersion"] = resource.api_version
        return list(items)

    # --- writes -----------------------------------------------------------------------------------------------

    def create(self, manifest: Obj) -> Obj:
        resource = resource_for(manifest["kind"])
        namespace = manifest["metadata"].get("namespace")
        return self.request(
            "POST", resource.path(namespace), query={"fieldManager": self.field_manager}, body=manifest
        )

    def apply(self, manifest: Obj) -> Obj:
        """Server-side apply with force: make the fields the operator owns match ``manifest``.

        With ``metadata.uid`` (every update of a child) the uid is a precondition, and the fields the
        operator's create set are first moved into its ``Apply`` entry (``_fields_to_apply``)."""
        resource = resource_for(manifest["kind"])
        meta = manifest["metadata"]
        if meta.get("uid"):
            self._fields_to_apply(resource, meta["namespace"], meta["name"], str(meta["uid"]))
        return self.request(
            "PATCH",
            resource.path(meta.get("namespace"), meta["name"]),
            query={"fieldManager": self.field_manager, "force": "true"},
            body=manifest,
            content_type="application/apply-patch+yaml",
        )

    def create_for_apply(self, manifest: Obj) -> Obj:
        """Create a child that later server-side applies keep up to date.

        A create (POST) fails with 409 when the name is taken, so it can never take over someone else's
        object, which an apply would. The fields a create sets belong to the manager's ``Update`` entry;
        ``apply`` moves them into its ``Apply`` entry before it first updates the object, so one request
        creates a child and only the rare update pays for the move.
        """
        return self.create(manifest)

    def _fields_to_apply(self, resource: Resource, namespace: str, name: str, uid: str) -> None:
        """Turns the operator's ``Update`` entry of the object into its ``Apply`` entry (what kubectl does
        when it moves an object to server-side apply). A later apply removes only fields its ``Apply`` entry
        owned, so without this a field dropped from the spec would stay on an object the operator created.
        Conditional on the uid and resourceVersion read: a replaced or changed object answers 409."""
        current = self.get(resource, namespace, name)
        meta = current.get("metadata") or {}
        if meta.get("uid") != uid:
            return  # replaced: the apply's uid precondition refuses it
        entries = meta.get("managedFields") or []
        upgraded = [
            {**e, "operation": "Apply"}
            if e.get("manager") == self.field_manager
            and e.get("operation") == "Update"
            and not e.get("subresource")
            else e
            for e in entries
        ]
        if upgraded == entries:
            return
        patch = {
            "metadata": {
                "uid": uid,
                "resourceVersion": meta.get("resourceVersion"),
                "managedFields": upgraded,
            }
        }
        self.merge_patch(resource, namespace, name, patch)

    def merge_patch(
        self, resource: Resource, namespace: str, name: str, patch: Obj, subresource: str | None = None
    ) -> Obj:
        return self.request(
            "PATCH",
            resource.path(namespace, name, subresource),
            query={"fieldManager": self.field_manager},
            body=patch,
            content_type="application/merge-patch+json",
        )

    def delete(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        *,
        uid: str | None = None,
        propagation: str = "Background",
    ) -> None:
        """Delete one object. With ``uid`` the API server deletes only the object with that uid and answers
        409 Conflict when the name now belongs to another (newer) object."""
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        self.request("DELETE", resource.path(namespace, name), body=body)
