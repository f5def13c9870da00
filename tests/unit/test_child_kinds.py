"""One list of child kinds, read from its real sources: what the builders create, what the operator
watches (``CHILD_RESOURCES``), what the chart's RBAC grants, and the tables of docs/platform.md and
docs/operations.md. Adding a child kind without the rest fails here, naming the copy that drifted."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from grpo_operator.builders import gang_pods, infrastructure, metric_workload
from grpo_operator.runtime.kube import CHILD_RESOURCES, EVENT, GRPOJOB, KUEUE_WORKLOAD, NODE
from grpo_operator.settings import OperatorSettings

from tests.unit.test_builders import make_job

REPO = Path(__file__).resolve().parents[2]
RBAC_TEMPLATE = REPO / "helm" / "grpo-operator" / "templates" / "operator-rbac.yaml"
PLATFORM_MD = REPO / "docs" / "platform.md"
OPERATIONS_MD = REPO / "docs" / "operations.md"
# Every verb the operator uses on a child: list+watch (its caches), create+patch (server-side apply),
# delete (a child the job no longer needs).
CHILD_VERBS = {"list", "watch", "create", "patch", "delete"}
Grants = dict[tuple[str, str], set[str]]


def created_kinds() -> set[str]:
    """Kinds of every object the builders produce for a job that creates its own volume, in both the
    running (metric Deployment, gang pods) and the infrastructure-only state."""
    settings = OperatorSettings()
    job = make_job()
    children = [
        *infrastructure(job, settings),
        *metric_workload(job, settings),
        *gang_pods(job, settings, 1, ""),
    ]
    return {str(child["kind"]) for child in children}


def chart_rules(define: str) -> Grants:
    """The rules of one ``define`` block of the chart's RBAC template, as {(group, resource): verbs}.
    The blocks are plain YAML apart from template control lines, which are dropped (both branches of an
    ``if`` are kept: the union is what the chart can grant)."""
    text = RBAC_TEMPLATE.read_text(encoding="utf-8")
    match = re.search(
        r'\{\{-? define "' + re.escape(define) + r'" -?\}\}\n(.*?)\{\{-? end \}\}\n\n', text, re.S
    )
    assert match, f"{RBAC_TEMPLATE.relative_to(REPO)} has no define block {define!r}"
    body = "\n".join(line for line in match.group(1).splitlines() if not line.lstrip().startswith("{{"))
    out: Grants = {}
    for rule in yaml.safe_load(body):
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def docs_rbac_tables() -> list[Grants]:
    """Each "API group | Resource | Verbs | Why" table of docs/platform.md; a row with empty group and
    resource cells adds verbs to the row above."""
    tables: list[Grants] = []
    current: Grants | None = None
    last: list[tuple[str, str]] = []
    for line in PLATFORM_MD.read_text(encoding="utf-8").splitlines():
        if line.startswith("| API group | Resource | Verbs |"):
            current = {}
            tables.append(current)
            continue
        if current is None:
            continue
        if not line.startswith("|"):
            current = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if set(cells[0]) <= {"-"} and cells[0]:
            continue
        group_cell, resource_cell, verbs_cell = cells[:3]
        if resource_cell:
            group = "" if group_cell == "core" else group_cell.strip("`")
            last = [(group, r.strip().strip("`")) for r in resource_cell.split(",")]
        verbs = {v.strip() for v in verbs_cell.split(",")}
        for key in last:
            current.setdefault(key, set()).update(verbs)
    return tables


def test_the_operator_watches_exactly_the_kinds_its_builders_create() -> None:
    watched = {r.kind for r in CHILD_RESOURCES}
    created = created_kinds()
    assert created - watched == set(), (
        f"the builders create {sorted(created - watched)} but runtime/kube.py CHILD_RESOURCES does not list "
        "them: the operator would never see those children change or go; add them there"
    )
    assert watched - created == set(), (
        f"CHILD_RESOURCES watches {sorted(watched - created)}, which no builder creates: remove them"
    )


def test_the_chart_grants_every_verb_the_operator_uses_on_each_child_and_nothing_else() -> None:
    namespaced = chart_rules("grpo-operator.namespacedRules")
    for resource in CHILD_RESOURCES:
        granted = namespaced.get((resource.group, resource.plural), set())
        assert granted >= CHILD_VERBS, (
            f"{RBAC_TEMPLATE.relative_to(REPO)} grants {sorted(granted)} on {resource.plural}; the operator "
            f"needs {sorted(CHILD_VERBS)} on every child kind"
        )
    # The job itself (with its subresources), the Events the operator posts and the Kueue Workloads it reads
    # (only with kueue.enabled) are the only other grants.
    expected = {(r.group, r.plural) for r in CHILD_RESOURCES} | {
        (GRPOJOB.group, GRPOJOB.plural),
        (GRPOJOB.group, f"{GRPOJOB.plural}/status"),
        (GRPOJOB.group, f"{GRPOJOB.plural}/finalizers"),
        (EVENT.group, EVENT.plural),
        (KUEUE_WORKLOAD.group, KUEUE_WORKLOAD.plural),
    }
    assert namespaced.get((KUEUE_WORKLOAD.group, KUEUE_WORKLOAD.plural)) == {"get"}
    assert set(namespaced) == expected, (
        f"namespaced grants that match no resource the operator uses: {sorted(set(namespaced) - expected)}; "
        f"resources it uses that are not granted: {sorted(expected - set(namespaced))}"
    )
    cluster = chart_rules("grpo-operator.clusterRules")
    assert cluster.get((NODE.group, NODE.plural)) == {"list", "watch"}


def test_the_rbac_tables_of_platform_md_are_the_charts_rules() -> None:
    tables = docs_rbac_tables()
    assert len(tables) == 2, f"expected the namespaced and the cluster-scoped table in {PLATFORM_MD.name}"
    for documented, define in zip(
        tables, ("grpo-operator.namespacedRules", "grpo-operator.clusterRules"), strict=True
    ):
        assert documented == chart_rules(define), (
            f"{PLATFORM_MD.relative_to(REPO)} and {RBAC_TEMPLATE.relative_to(REPO)} ({define}) disagree; "
            "change the table with the template"
        )


def _children_table() -> list[str]:
    """First cells of the "Object | Name | Role | Lives while" table of docs/operations.md."""
    rows: list[str] = []
    inside = False
    for line in OPERATIONS_MD.read_text(encoding="utf-8").splitlines():
        if line.startswith("| Object | Name |"):
            inside = True
            continue
        if inside and not line.startswith("|"):
            break
        if inside and not line.startswith("|---"):
            rows.append(line.strip("|").split("|")[0].strip())
    return rows


def _names(kind: str, cell: str) -> bool:
    # "NetworkPolicies" names NetworkPolicy, "vLLM pod" names Pod.
    word = kind.lower()
    plural = word[:-1] + "ies" if word.endswith("y") else word + "s"
    return re.search(rf"\b({re.escape(word)}|{re.escape(plural)})\b", cell.lower()) is not None


def test_the_children_table_of_operations_md_names_every_created_kind() -> None:
    rows = _children_table()
    assert rows, f"{OPERATIONS_MD.name} lost its 'What the operator creates' table"
    kinds = created_kinds()
    missing = sorted(k for k in kinds if not any(_names(k, row) for row in rows))
    assert not missing, f"{OPERATIONS_MD.relative_to(REPO)} 'What the operator creates' omits {missing}"
    stray = [row for row in rows if not any(_names(k, row) for k in kinds)]
    assert not stray, f"rows of {OPERATIONS_MD.name} naming no kind the builders create: {stray}"
