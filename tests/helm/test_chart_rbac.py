"""The chart's RBAC, rendered offline: the operator's rules (cluster-wide or per watched namespace),
exactly the verbs its code needs and no Secret reads, and the user roles that aggregate into admin, edit and
view."""

from __future__ import annotations

from typing import Any

from grpo_operator.builders.child_kinds import CHILD_KINDS

from tests.helm.chart import (
    FULLNAME,
    MONITORING_APIS,
    NAMESPACE,
    VALUES_DIR,
    Doc,
    find,
    one,
    render,
    values_files,
)

# The operator's rules, spelled out: a change to the chart's RBAC must change this table too, on purpose.
# Why each verb is needed: templates/operator-rbac.yaml and docs/platform.md. The children's rows are
# exactly the verbs each child kind's record names (builders/child_kinds.py), which the runtime uses.
NAMESPACED_RULES = {
    ("grpo.dev", "grpojobs"): {"get", "list", "watch", "patch", "delete"},
    ("grpo.dev", "grpojobs/status"): {"get", "patch"},
    ("grpo.dev", "grpojobs/finalizers"): {"update"},
    **{(k.group, k.plural): set(k.verbs) for k in CHILD_KINDS if k.namespaced},
    ("", "events"): {"create"},
}
CLUSTER_RULES = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "nodes"): {"list", "watch"},
    ("storage.k8s.io", "storageclasses"): {"list", "watch"},
}


def flatten(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        assert not rule.get("resourceNames"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_cluster_wide_rbac_is_exactly_the_documented_rules(defaults: list[Doc]) -> None:
    role = one(defaults, "ClusterRole", FULLNAME)
    assert flatten(role["rules"]) == {**CLUSTER_RULES, **NAMESPACED_RULES}
    binding = one(defaults, "ClusterRoleBinding", FULLNAME)
    assert binding["roleRef"]["name"] == FULLNAME
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    assert not find(defaults, "Role") and not find(defaults, "RoleBinding")


def test_kueue_enabled_adds_only_get_on_workloads() -> None:
    # What lets a queued job's status carry Kueue's reason (docs/kueue.md); read-only, nothing more.
    docs = render(sets={"kueue.enabled": "true"})
    role = one(docs, "ClusterRole", FULLNAME)
    kueue_rules = {("kueue.x-k8s.io", "workloads"): {"get"}}
    assert flatten(role["rules"]) == {**CLUSTER_RULES, **NAMESPACED_RULES, **kueue_rules}


def test_namespaced_watch_gets_roles_in_each_namespace_only() -> None:
    docs = render([VALUES_DIR / "namespaced.yaml"], api_versions=MONITORING_APIS)
    cluster_role = one(docs, "ClusterRole", FULLNAME)
    assert flatten(cluster_role["rules"]) == {**CLUSTER_RULES, ("", "namespaces"): {"list", "watch"}}
    for ns in ("team-a", "team-b"):
        role = one(docs, "Role", FULLNAME, ns)
        assert flatten(role["rules"]) == NAMESPACED_RULES
        binding = one(docs, "RoleBinding", FULLNAME, ns)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": FULLNAME,
        }
        assert binding["subjects"][0]["namespace"] == NAMESPACE
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args and "--all-namespaces" not in args
    pod_monitor = one(docs, "PodMonitor")
    assert pod_monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    alerts = {r["alert"] for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    assert "GRPOJobNoLearningSignal" not in alerts and "GRPOJobFormatFailureRatioHigh" in alerts


def test_secrets_are_only_created_never_read_by_the_operator() -> None:
    # The operator creates each client-rollout job's gateway-token Secret under a name the API server picks
    # and records that name in the job's status, so it never reads a Secret: get would let it read any
    # Secret of the namespace by name, list or watch all of them. The roles the chart gives tenants never
    # touch Secrets (the built-in edit role already does).
    for values in values_files():
        for doc in render([values], api_versions=MONITORING_APIS):
            if doc["kind"] not in ("ClusterRole", "Role"):
                continue
            aggregated = any(
                k.startswith("rbac.authorization.k8s.io/aggregate-to-")
                for k in doc["metadata"].get("labels") or {}
            )
            for rule in doc.get("rules") or []:
                if "secrets" not in rule["resources"]:
                    continue
                where = (values.stem, doc["metadata"]["name"], rule)
                assert not aggregated, where
                assert rule["resources"] == ["secrets"] and rule["verbs"] == ["create"], where


def test_rbac_can_be_left_to_the_platform_team() -> None:
    docs = render([VALUES_DIR / "byo-rbac.yaml"])
    admission = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    assert {d["kind"] for d in docs} - admission == {"Deployment", "Service"}
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "platform-grpo-operator"
    # The admission policies exempt the operator by the ServiceAccount it really runs as.
    labels = one(docs, "ValidatingAdmissionPolicy", f"{FULLNAME}-job-labels")
    assert labels["spec"]["matchConditions"][0]["expression"] == (
        f"request.userInfo.username != 'system:serviceaccount:{NAMESPACE}:platform-grpo-operator'"
    )


def test_user_roles_aggregate_into_admin_edit_and_view(defaults: list[Doc]) -> None:
    edit = one(defaults, "ClusterRole", f"{FULLNAME}-edit")
    view = one(defaults, "ClusterRole", f"{FULLNAME}-view")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-edit" not in view["metadata"]["labels"]
    assert flatten(edit["rules"]) == {
        ("grpo.dev", "grpojobs"): {
            "get",
            "list",
            "watch",
            "create",
            "update",
            "patch",
            "delete",
            "deletecollection",
        },
        ("grpo.dev", "grpojobs/status"): {"get"},
    }
    assert flatten(view["rules"]) == {
        ("grpo.dev", "grpojobs"): {"get", "list", "watch"},
        ("grpo.dev", "grpojobs/status"): {"get", "list", "watch"},
    }
