"""The watch caches reconcile reads from: relist semantics, resourceVersion ordering, the by-job index."""

from __future__ import annotations

import copy
from typing import Any, cast

from grpo_operator.runtime.informer import ClusterCache, Informer
from grpo_operator.runtime.kube_client import CHILD_RESOURCES, GRPOJOB, NODE, POD


def obj(
    name: str, rv: int, namespace: str = "ns", job: str | None = None, kind: str = "Pod"
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "resourceVersion": str(rv)}
    if job is not None:
        meta["labels"] = {"grpo.dev/job": job}
    meta["managedFields"] = [{"manager": "x"}]
    return {"kind": kind, "metadata": meta}


def informer(events: list[tuple[str, str]]) -> Informer:
    return Informer(
        cast(Any, None), POD, None, listener=lambda t, o: events.append((t, o["metadata"]["name"]))
    )


def test_a_relist_replaces_the_store_and_reports_what_disappeared_meanwhile() -> None:
    events: list[tuple[str, str]] = []
    inf = informer(events)
    assert not inf.synced
    inf._replace([obj("a", 1), obj("b", 2)])
    assert inf.synced and sorted(inf.objects) == [("ns", "a"), ("ns", "b")]
    events.clear()
    # The watch was down while "a" was deleted and "c" created: the relist must say both.
    inf._replace([obj("b", 5), obj("c", 6)])
    assert sorted(inf.objects) == [("ns", "b"), ("ns", "c")]
    assert sorted(events) == [("ADDED", "c"), ("DELETED", "a"), ("MODIFIED", "b")]
    assert "managedFields" not in inf.objects[("ns", "b")]["metadata"]


def test_an_older_event_never_replaces_the_operators_own_newer_write() -> None:
    inf = informer([])
    inf._replace([obj("a", 10)])
    inf.put(obj("a", 12))  # the API server's answer to our status patch
    inf._apply("MODIFIED", obj("a", 11))  # an event from before our write, arriving late
    assert inf.get("ns", "a")["metadata"]["resourceVersion"] == "12"  # type: ignore[index]
    inf.put(obj("a", 11))
    assert inf.get("ns", "a")["metadata"]["resourceVersion"] == "12"  # type: ignore[index]
    inf._apply("MODIFIED", obj("a", 13))
    assert inf.get("ns", "a")["metadata"]["resourceVersion"] == "13"  # type: ignore[index]
    inf._apply("DELETED", obj("a", 14))
    assert inf.get("ns", "a") is None


def cache(
    jobs: list[tuple[str, str, str, str | None]], touched: list[tuple[str, str]], **options: Any
) -> ClusterCache:
    """A cache with no API client that records the job and child events it dispatches."""
    return ClusterCache(
        cast(Any, None),
        [None],
        job_resource=GRPOJOB,
        child_resources=CHILD_RESOURCES,
        node_resource=NODE,
        job_label="grpo.dev/job",
        on_job=lambda t, ns, name, rv: jobs.append((t, ns, name, rv)),
        on_child=lambda ns, job, kind: touched.append((ns, job)),
        **options,
    )


def test_children_are_found_by_job_and_leave_it_when_deleted_or_relabelled() -> None:
    touched: list[tuple[str, str]] = []
    c = cache([], touched)
    pods = c.children[POD.kind][None]
    configmaps = c.children["ConfigMap"][None]
    for informer_ in (i for per in c.children.values() for i in per.values()):
        informer_._replace([])
    pods._apply("ADDED", obj("j1-trainer-1-0", 1, job="j1"))
    pods._apply("ADDED", obj("j2-trainer-1-0", 2, job="j2"))
    configmaps._apply("ADDED", obj("j1-config", 3, job="j1", kind="ConfigMap"))
    found, missing = c.children_of("ns", "j1")
    assert sorted(o["metadata"]["name"] for o in found) == ["j1-config", "j1-trainer-1-0"]
    assert missing == set()
    assert touched == [("ns", "j1"), ("ns", "j2"), ("ns", "j1")]

    touched.clear()
    pods._apply("MODIFIED", obj("j1-trainer-1-0", 4, job="j2"))  # relabelled: now j2's
    assert [o["metadata"]["name"] for o in c.children_of("ns", "j1")[0]] == ["j1-config"]
    assert sorted(touched) == [("ns", "j1"), ("ns", "j2")], "both the old and the new owner are re-queued"
    pods._apply("DELETED", obj("j2-trainer-1-0", 5, job="j2"))
    assert [o["metadata"]["name"] for o in c.children_of("ns", "j2")[0]] == ["j1-trainer-1-0"]


def test_an_incomplete_or_forbidden_cache_is_never_used() -> None:
    jobs: list[tuple[str, str, str, str | None]] = []
    c = cache(jobs, [])
    assert c.job_keys() is None and c.job("ns", "j1") == (False, None) and c.node_names() is None
    _, missing = c.children_of("ns", "j1")
    assert missing == {r.kind for r in CHILD_RESOURCES}, "until synced, every kind is listed from the API"

    c.jobs[None]._replace([obj("j1", 7, kind="GRPOJob")])
    assert c.job_keys() == [("ns", "j1")]
    assert c.job("ns", "j1")[0] and c.job("ns", "gone") == (True, None)
    assert jobs == [("ADDED", "ns", "j1", "7")]

    for informer_ in (i for per in c.children.values() for i in per.values()):
        informer_._replace([])
    deployments = c.children["Deployment"][None]
    deployments.forbidden, deployments.synced = True, False  # HTTP 403 on watch: an older RBAC role
    assert c.children_of("ns", "j1")[1] == {"Deployment"}

    c.nodes._replace([obj("gpu-node-0", 1, namespace="", kind="Node")])
    assert c.node_names() == frozenset({"gpu-node-0"})


def test_child_caches_keep_only_the_operators_objects_and_no_configmap_data() -> None:
    from grpo_operator.runtime.wakeups import METADATA_ONLY_KINDS, managed_child

    touched: list[tuple[str, str]] = []
    c = cache([], touched, keep_child=managed_child, metadata_only=METADATA_ONLY_KINDS)
    configmaps = c.children["ConfigMap"][None]
    assert configmaps.metadata_only and not c.children["Pod"][None].metadata_only
    owner = {
        "apiVersion": "grpo.dev/v1alpha1",
        "kind": "GRPOJob",
        "name": "j1",
        "uid": "u1",
        "controller": True,
    }
    ours = obj("j1-config", 1, job="j1", kind="ConfigMap")
    ours["metadata"]["ownerReferences"] = [owner]
    ours["data"] = {"trainer.json": "{}"}
    tenants = [obj(f"bulk-{i}", 10 + i, job="j1", kind="ConfigMap") for i in range(50)]
    for t in tenants:
        t["data"] = {"blob": "x" * 1024}
    configmaps._replace([ours, *tenants])
    assert list(configmaps.objects) == [("ns", "j1-config")], "a tenant's labelled ConfigMaps are not cached"
    assert "data" not in configmaps.objects[("ns", "j1-config")], "ConfigMap data is never kept"
    assert [o["metadata"]["name"] for o in c.children_of("ns", "j1")[0]] == ["j1-config"]

    configmaps._apply("ADDED", obj("bulk-new", 99, job="j1", kind="ConfigMap"))
    assert ("ns", "bulk-new") not in configmaps.objects
    touched.clear()
    released = obj("j1-config", 100, job="j1", kind="ConfigMap")  # its owner reference was removed
    configmaps._apply("MODIFIED", released)
    assert configmaps.objects == {} and touched == [("ns", "j1")], "the job hears that its child is gone"


def test_a_child_the_operator_created_is_its_jobs_at_once_and_its_echo_wakes_nobody() -> None:
    """The next reconcile of a job must see the children the last one created (else it creates them again,
    gets 409 and backs off), and the watch's copy of the operator's own write is no reason to reconcile."""
    touched: list[tuple[str, str]] = []
    c = cache([], touched, metadata_only=frozenset({"ConfigMap"}))
    for informer_ in (i for per in c.children.values() for i in per.values()):
        informer_._replace([])
    created = obj("j1-config", 7, job="j1", kind="ConfigMap")
    created["data"] = {"grpo.yaml": "large"}
    c.put_child(created)  # the API server's answer to the operator's POST
    found, _ = c.children_of("ns", "j1")
    assert [o["metadata"]["name"] for o in found] == ["j1-config"]
    assert "data" not in found[0], "a metadata-only cache keeps no ConfigMap data, whoever put it there"
    assert touched == []
    configmaps = c.children["ConfigMap"][None]
    configmaps._apply("ADDED", obj("j1-config", 7, job="j1", kind="ConfigMap"))
    assert touched == [], "the echo of the operator's own create queued the job"
    configmaps._apply("MODIFIED", obj("j1-config", 8, job="j1", kind="ConfigMap"))
    assert touched == [("ns", "j1")], "a change by anyone else is news"


def test_an_echo_of_the_operators_own_status_write_wakes_nobody() -> None:
    jobs: list[tuple[str, str, str, str | None]] = []
    c = cache(jobs, [])
    job_informer = c.jobs[None]
    job_informer._replace([obj("j1", 3, kind="GRPOJob")])
    jobs.clear()
    c.put_job(obj("j1", 4, kind="GRPOJob"))  # the record annotation patch
    c.put_job(obj("j1", 5, kind="GRPOJob"))  # then the status patch
    job_informer._apply("MODIFIED", obj("j1", 4, kind="GRPOJob"))
    job_informer._apply("MODIFIED", obj("j1", 5, kind="GRPOJob"))
    assert jobs == []
    job_informer._apply("MODIFIED", obj("j1", 6, kind="GRPOJob"))  # e.g. the trainer's status
    assert jobs == [("MODIFIED", "ns", "j1", "6")]


def test_an_unmanaged_object_is_never_put_into_a_child_cache() -> None:
    c = ClusterCache(
        cast(Any, None),
        [None],
        job_resource=GRPOJOB,
        child_resources=CHILD_RESOURCES,
        node_resource=NODE,
        job_label="grpo.dev/job",
        on_job=lambda t, ns, name, rv: None,
        on_child=lambda ns, job, kind: None,
        keep_child=lambda o: bool((o["metadata"].get("annotations") or {}).get("mine")),
    )
    for informer_ in (i for per in c.children.values() for i in per.values()):
        informer_._replace([])
    c.put_child(obj("j1-config", 7, job="j1", kind="ConfigMap"))
    assert c.children_of("ns", "j1")[0] == []


def test_a_childs_change_wakes_its_job_only_where_reconcile_looks() -> None:
    """A provisioner marking a claim, a Deployment's counters moving: the cache follows, the job is not
    reconciled. A claim bound, a pod's status, the operator's annotations or the metric Deployment's
    availability: the job is reconciled."""
    from grpo_operator.builders.child_kinds import child_view
    from grpo_operator.runtime.wakeups import METADATA_ONLY_KINDS

    touched: list[tuple[str, str]] = []
    c = cache([], touched, metadata_only=METADATA_ONLY_KINDS, child_view=child_view)
    claims, deployments, pods = (c.children[k][None] for k in ("PersistentVolumeClaim", "Deployment", "Pod"))
    claim = obj("j1-ckpt", 1, job="j1", kind="PersistentVolumeClaim")
    claim["metadata"]["annotations"] = {"grpo.dev/job-uid": "u1"}
    deployment = obj("j1-metric", 2, job="j1", kind="Deployment")
    deployment["status"] = {"replicas": 1, "conditions": [{"type": "Progressing", "status": "True"}]}
    pod = obj("j1-trainer-1-0", 3, job="j1")
    pod["status"] = {"phase": "Pending"}
    claims._replace([claim])
    deployments._replace([deployment])
    pods._replace([pod])
    touched.clear()

    provisioning = copy.deepcopy(claim)
    provisioning["metadata"]["resourceVersion"] = "10"
    provisioning["metadata"]["annotations"]["volume.kubernetes.io/storage-provisioner"] = "csi.example"
    claims._apply("MODIFIED", provisioning)
    counters = copy.deepcopy(deployment)
    counters["metadata"]["resourceVersion"] = "12"
    counters["status"].update(updatedReplicas=1, observedGeneration=2)
    counters["status"]["conditions"][0]["lastUpdateTime"] = "2026-12-01T00:00:00Z"
    deployments._apply("MODIFIED", counters)
    assert touched == [], "nothing reconcile reads changed"
    assert claims.objects[("ns", "j1-ckpt")]["metadata"]["resourceVersion"] == "10", "the cache follows"

    bound = copy.deepcopy(provisioning)
    bound["metadata"]["resourceVersion"] = "11"
    bound["metadata"]["annotations"]["pv.kubernetes.io/bind-completed"] = "yes"
    claims._apply("MODIFIED", bound)  # a new gang waits for this
    assert touched == [("ns", "j1")]
    available = copy.deepcopy(counters)
    available["metadata"]["resourceVersion"] = "13"
    available["status"]["availableReplicas"] = 1
    deployments._apply("MODIFIED", available)
    assert touched == [("ns", "j1")] * 2
    running = copy.deepcopy(pod)
    running["metadata"]["resourceVersion"] = "14"
    running["status"]["phase"] = "Running"
    pods._apply("MODIFIED", running)
    relabelled = copy.deepcopy(bound)
    relabelled["metadata"]["resourceVersion"] = "15"
    relabelled["metadata"]["annotations"]["grpo.dev/retention"] = "Retain"
    claims._apply("MODIFIED", relabelled)
    assert touched == [("ns", "j1")] * 4


def test_storage_classes_give_each_binding_mode_and_the_newest_default() -> None:
    from grpo_operator.runtime.kube_client import STORAGE_CLASS

    c = cache([], [], storage_class_resource=STORAGE_CLASS)
    assert c.storage_class_modes() is None, "not known before the first list"

    def storage_class(name: str, mode: str | None, default: bool, created: str) -> dict[str, Any]:
        sc = obj(name, 1, namespace="", kind="StorageClass")
        sc["metadata"]["creationTimestamp"] = created
        if default:
            sc["metadata"]["annotations"] = {"storageclass.kubernetes.io/is-default-class": "true"}
        if mode is not None:
            sc["volumeBindingMode"] = mode
        return sc

    assert c.storage_classes is not None
    c.storage_classes._replace(
        [
            storage_class("old-default", "WaitForFirstConsumer", True, "2026-01-01T00:00:00Z"),
            storage_class("new-default", None, True, "2026-06-01T00:00:00Z"),  # unset means Immediate
            storage_class("local", "WaitForFirstConsumer", False, "2026-07-01T00:00:00Z"),
        ]
    )
    assert c.storage_class_modes() == (
        (
            ("local", "WaitForFirstConsumer"),
            ("new-default", "Immediate"),
            ("old-default", "WaitForFirstConsumer"),
        ),
        "new-default",
    )
    c.storage_classes.forbidden = True
    assert c.storage_class_modes() is None, "without permission to watch them, nothing is known"
