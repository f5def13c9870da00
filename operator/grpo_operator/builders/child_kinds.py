"""One record per kind of object the operator creates for a job: everything the operator knows per kind.

The runtime derives its watches, cache policy and wake-ups from these records (``CHILD_RESOURCES`` in
runtime/kube_client.py, the informers in runtime/wakeups.py and runtime/observe.py), the benches list children
with them, ``make generate`` renders the per-kind table of docs/scaling.md from them, and
tests/unit/test_child_kinds.py and tests/helm/test_chart_rbac.py hold the builders, the chart's RBAC and the
docs' tables to them. A new child kind is one more record here; the tests name whatever still disagrees.

The records live with the builders because they name the builders; they hold plain data and pure
functions of a manifest, so anything from the builders up (and the benches) can import them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from grpo_operator.api.resource import GROUP
from grpo_operator.builders.common import Manifest
from grpo_operator.builders.environment import (
    environment_deployment,
    environment_network_policy,
    environment_service,
)
from grpo_operator.builders.gang import generation_pod, generation_service, trainer_pod, trainer_service
from grpo_operator.builders.metric import metric_deployment, metric_service
from grpo_operator.builders.network import (
    generation_network_policy,
    metric_network_policy,
    trainer_network_policy,
)
from grpo_operator.builders.rbac import trainer_role, trainer_role_binding, trainer_service_account
from grpo_operator.builders.rollouts import (
    gateway_deployment,
    gateway_network_policy,
    gateway_service,
    gateway_token_secret,
    policy_service,
)
from grpo_operator.builders.storage import ANNOTATION_BIND_COMPLETED, checkpoint_pvc
from grpo_operator.builders.trainer_configmap import trainer_config_map


class Cache(Enum):
    """What the operator's list+watch cache of the kind holds."""

    # Whole objects (without managedFields): reconcile compares their bodies with what it builds (drift).
    WHOLE = "whole objects"
    # PartialObjectMetadata: reconcile reads labels, annotations, owner references and uid only, so no
    # body is ever sent or kept.
    METADATA = "metadata only"
    # Metadata only, and the body read (one GET) when the cached resourceVersion is not the one the
    # operator last wrote or read: a ConfigMap's data is large and changes only by someone else's hand.
    METADATA_READ_ON_CHANGE = "metadata only; read whole once per change"
    # Not listed, watched or read at all: that would need RBAC to read every Secret of the namespace. The
    # runtime creates it under a name the API server picks (generateName) and records that name in the
    # job's status (runtime/apply_plan.py): the status is all the operator knows of it.
    NONE = "not cached"


class Wake(Enum):
    """How a change to a child (one reconcile's view of it changed) wakes its job."""

    # Changes come in bursts (a pod's start is several status updates; a Deployment's counters follow its
    # pods): the job is queued settings.child_event_batch_seconds after the first, with all that follow.
    BATCHED = "batched"
    # Rare and each worth acting on at once: a claim bound, a child deleted or changed by someone else.
    IMMEDIATE = "at once"
    # Not watched (Cache.NONE): nothing but the operator's own create, recorded in the status, tells it.
    NEVER = "never (not watched)"


# Every verb the operator's runtime uses on a child it applies: list+watch (its caches), create (the
# first apply is a POST), patch (server-side apply), get (an update first reads the object to move the
# create's fields into its Apply entry; a changed ConfigMap is read whole), delete (no longer wanted).
APPLIED_VERBS = frozenset({"get", "list", "watch", "create", "patch", "delete"})
# A Secret whose value the runtime generates: created (POST, generateName) once, never read (its name is
# recorded in the job's status), never updated (an update would leave the pods that read the old value
# behind) and never deleted by the operator (the garbage collector does, through its owner reference).
CREATED_ONCE_VERBS = frozenset({"create"})
# Pods are created and deleted, patched only for Kueue's retriable mark, and never read one by one
# (a pod gone from the watch is looked up with a list by name).
POD_VERBS = frozenset({"list", "watch", "create", "patch", "delete"})


def whole_but_resource_version(obj: Manifest) -> object:
    """Everything but the resourceVersion: a pod's phase, conditions, container states, node, Kueue's
    gates and marks all matter to reconcile."""
    meta = obj.get("metadata") or {}
    return (
        {k: v for k, v in meta.items() if k not in ("resourceVersion", "managedFields")},
        obj.get("spec"),
        obj.get("status"),
    )


def resource_version(obj: Manifest) -> object:
    """Any change: the body is not cached, so a new resourceVersion may be a change to it."""
    return (obj.get("metadata") or {}).get("resourceVersion")


def metadata_and_body(obj: Manifest) -> object:
    """uid, labels, owner references, deletion, the operator's own annotations and a claim's
    bind-completed mark, and the body reconcile compares with what it builds (spec, rules, subjects,
    roleRef). Left out: the status and other controllers' marks (the PV controller's and provisioner's
    on a claim)."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    kept = {
        k: v for k, v in annotations.items() if k.startswith(f"{GROUP}/") or k == ANNOTATION_BIND_COMPLETED
    }
    view: dict[str, Any] = {
        "uid": meta.get("uid"),
        "labels": meta.get("labels"),
        "ownerReferences": meta.get("ownerReferences"),
        "deletionTimestamp": meta.get("deletionTimestamp"),
        "finalizers": meta.get("finalizers"),
        "annotations": kept,
    }
    view.update({k: v for k, v in obj.items() if k not in ("metadata", "status")})
    return view


def metadata_body_and_availability(obj: Manifest) -> object:
    """As ``metadata_and_body``, and the available replicas and the ReplicaFailure condition; the other
    counters and the Progressing condition are left out."""
    view = metadata_and_body(obj)
    assert isinstance(view, dict)
    status = obj.get("status") or {}
    view["availableReplicas"] = status.get("availableReplicas")
    view["replicaFailure"] = [
        (c.get("status"), c.get("reason"), c.get("message"))
        for c in status.get("conditions") or []
        if isinstance(c, dict) and c.get("type") == "ReplicaFailure"
    ]
    return view


@dataclass(frozen=True)
class ChildKind:
    """What the operator knows of one kind of child. The defaults are the common case: a core namespaced
    kind the operator applies (server-side apply), cached whole, a change waking its job at once."""

    kind: str
    plural: str
    # The builders that produce objects of this kind (each takes the job, and some the settings, the
    # attempt and the rank or index); a kind another controller creates from the operator's object
    # (metric and environment pods, from the Deployment's ReplicaSet) names only the operator's own builders.
    builders: tuple[Callable[..., Manifest | None], ...]
    # What reconcile reads of an object of this kind, in words, for the docs (``view`` below, in code).
    reads: str
    # The API resource.
    group: str = ""
    version: str = "v1"
    namespaced: bool = True
    # The RBAC verbs the operator's runtime uses on the resource: exactly what the chart grants.
    verbs: frozenset[str] = APPLIED_VERBS
    cache: Cache = Cache.WHOLE
    wake: Wake = Wake.IMMEDIATE
    # What reconcile reads of an object of this kind: a change that leaves it equal wakes nobody.
    view: Callable[[Manifest], object] = metadata_and_body

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def kubectl_name(self) -> str:
        """The resource as kubectl names it unambiguously (``deployments.apps``)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


_METADATA = "labels, owner references, uid, deletion, the operator's annotations"
_BODY = f"{_METADATA}, and the body it compares with its build"

# In the order reconcile observes them; the Secret first and pods last, since each is created after
# everything it mounts.
CHILD_KINDS: tuple[ChildKind, ...] = (
    ChildKind(
        kind="Secret",
        plural="secrets",
        builders=(gateway_token_secret,),
        verbs=CREATED_ONCE_VERBS,
        cache=Cache.NONE,
        wake=Wake.NEVER,
        reads="nothing: created once under a name the API server picks, recorded in status.gatewayTokenSecret",
    ),
    ChildKind(
        kind="ConfigMap",
        plural="configmaps",
        builders=(trainer_config_map,),
        cache=Cache.METADATA_READ_ON_CHANGE,
        view=resource_version,
        reads="any change (its data, read whole, is compared with its build)",
    ),
    ChildKind(
        kind="PersistentVolumeClaim",
        plural="persistentvolumeclaims",
        builders=(checkpoint_pvc,),
        cache=Cache.METADATA,
        reads=f"{_METADATA}, and the PV controller's bind-completed mark",
    ),
    ChildKind(
        kind="ServiceAccount",
        plural="serviceaccounts",
        builders=(trainer_service_account,),
        reads=_BODY,
    ),
    ChildKind(
        kind="Role",
        group="rbac.authorization.k8s.io",
        plural="roles",
        builders=(trainer_role,),
        reads=f"{_BODY} (rules)",
    ),
    ChildKind(
        kind="RoleBinding",
        group="rbac.authorization.k8s.io",
        plural="rolebindings",
        builders=(trainer_role_binding,),
        reads=f"{_BODY} (subjects, roleRef)",
    ),
    ChildKind(
        kind="Service",
        plural="services",
        builders=(
            trainer_service,
            generation_service,
            metric_service,
            environment_service,
            gateway_service,
            policy_service,
        ),
        reads=f"{_BODY} (spec)",
    ),
    ChildKind(
        kind="NetworkPolicy",
        group="networking.k8s.io",
        plural="networkpolicies",
        builders=(
            generation_network_policy,
            metric_network_policy,
            environment_network_policy,
            gateway_network_policy,
            trainer_network_policy,
        ),
        reads=f"{_BODY} (spec)",
    ),
    ChildKind(
        kind="Deployment",
        group="apps",
        plural="deployments",
        builders=(metric_deployment, environment_deployment, gateway_deployment),
        wake=Wake.BATCHED,
        view=metadata_body_and_availability,
        reads=f"{_BODY} (spec), available replicas, the ReplicaFailure condition",
    ),
    ChildKind(
        kind="Pod",
        plural="pods",
        builders=(generation_pod, trainer_pod),
        verbs=POD_VERBS,
        wake=Wake.BATCHED,
        view=whole_but_resource_version,
        reads="everything but the resourceVersion (phase, conditions, container states, node, Kueue's marks)",
    ),
)

BY_KIND: dict[str, ChildKind] = {k.kind: k for k in CHILD_KINDS}


def child_kind(kind: str) -> ChildKind:
    try:
        return BY_KIND[kind]
    except KeyError:
        raise ValueError(
            f"{kind!r} is not a kind the operator creates for a job; the kinds are "
            f"{', '.join(BY_KIND)} (builders/child_kinds.py)"
        ) from None


def child_view(obj: Manifest) -> object:
    """What reconcile reads of a child, by its kind's record."""
    return child_kind(str(obj.get("kind"))).view(obj)


def kinds_where(predicate: Callable[[ChildKind], bool]) -> frozenset[str]:
    return frozenset(k.kind for k in CHILD_KINDS if predicate(k))


def watched(kind: ChildKind) -> bool:
    return kind.cache is not Cache.NONE
