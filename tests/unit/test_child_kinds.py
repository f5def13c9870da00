"""One record per child kind (operator/grpo_operator/builders/child_kinds.py), held to its real copies:
what the builders create, what the runtime watches and how a change wakes a job, what the chart's RBAC
grants, and the tables of docs/platform.md and docs/operations.md (the table of docs/scaling.md is
generated from the records). Adding a child kind without the rest fails here, naming the copy that drifted."""

from __future__ import annotations

import asyncio
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from grpo_operator.builders import gang_pods, generated_secrets, infrastructure, metric_workload
from grpo_operator.builders.child_kinds import BY_KIND, CHILD_KINDS, Cache, ChildKind, Wake, watched
from grpo_operator.builders.common import Job
from grpo_operator.runtime.controller import Controller
from grpo_operator.runtime.kube_client import (
    CHILD_RESOURCES,
    EVENT,
    GRPOJOB,
    KUEUE_WORKLOAD,
    NODE,
    UNWATCHED_RESOURCES,
    resource_for,
)
from grpo_operator.runtime.wakeups import BATCHED_KINDS, METADATA_ONLY_KINDS, READ_ON_CHANGE_KINDS
from grpo_operator.settings import OperatorSettings

from tests.unit.test_builders import make_job
from tests.unit.test_builders_rollouts import client_job
from tests.unit.test_environment_builders import environment_job

REPO = Path(__file__).resolve().parents[2]
RBAC_TEMPLATE = REPO / "helm" / "grpo-operator" / "templates" / "operator-rbac.yaml"
PLATFORM_MD = REPO / "docs" / "platform.md"
OPERATIONS_MD = REPO / "docs" / "operations.md"
Grants = dict[tuple[str, str], set[str]]
SETTINGS = OperatorSettings()


def jobs() -> list[Job]:
    """A job with a metric service that creates its own volume, a job with an environment server instead, and
    a client-rollout job before and after its gateway-token Secret is recorded: between them every child the
    builders can make."""
    return [make_job(), environment_job(), client_job(), client_job(token_secret=None)]


def built_children(job: Job) -> list[dict[str, Any]]:
    """Everything the operator creates for ``job`` as it stands: the Secrets it still lacks, or else its
    gang pods (a client-rollout job's rank 0 reads the token Secret), and its infrastructure and metric
    workload."""
    secrets = [manifest for manifest, _ in generated_secrets(job)]
    return [
        *secrets,
        *infrastructure(job, SETTINGS),
        *metric_workload(job, SETTINGS),
        *([] if secrets else gang_pods(job, SETTINGS, 1, "")),
    ]


def child_name(manifest: dict[str, Any]) -> str:
    """Its name, or for a Secret the API server names, its generateName."""
    meta = manifest["metadata"]
    return str(meta.get("name") or meta["generateName"])


def created_kinds() -> set[str]:
    return {str(child["kind"]) for job in jobs() for child in built_children(job)}


def built_by(builder: Any, job: Job) -> dict[str, Any] | None:
    """What one builder makes for ``job`` (gang pods: attempt 1, rank or index 0); None where it makes
    nothing for this kind of job."""
    arguments = {"job": job, "settings": SETTINGS, "attempt": 1, "rank": 0, "index": 0, "resume_from": ""}
    params = inspect.signature(builder).parameters
    try:
        manifest: dict[str, Any] | None = builder(**{n: arguments[n] for n in params if n in arguments})
    except (AssertionError, ValueError):
        # A builder of the other kind of job (a metric policy for a client-rollout job), or of a pod that
        # reads a token Secret the job has not recorded yet.
        return None
    return manifest


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


def test_each_records_builders_make_exactly_the_children_of_its_kind() -> None:
    assert created_kinds() == set(BY_KIND), (
        f"the builders create {sorted(created_kinds() - set(BY_KIND))} with no record in "
        f"builders/child_kinds.py, and records name {sorted(set(BY_KIND) - created_kinds())} that no builder "
        "creates"
    )
    for record in CHILD_KINDS:
        made: set[tuple[int, str]] = set()
        for builder in record.builders:
            found = [(i, built_by(builder, job)) for i, job in enumerate(jobs())]
            found = [(i, m) for i, m in found if m is not None and m in built_children(jobs()[i])]
            assert found, (
                f"{builder.__name__}, named by the {record.kind} record, makes none of a job's children"
            )
            for i, manifest in found:
                assert manifest is not None and manifest["kind"] == record.kind, (
                    f"{builder.__name__} builds a {manifest and manifest['kind']}, but the {record.kind} record "
                    "names it"
                )
                made.add((i, child_name(manifest)))
        # Every trainer rank's pod comes from trainer_pod; rank 0 stands for them.
        wanted = {
            (i, child_name(c))
            for i, job in enumerate(jobs())
            for c in built_children(job)
            if c["kind"] == record.kind and not re.search(r"-trainer-1-[1-9]\d*$", child_name(c))
        }
        assert made == wanted, (
            f"{record.kind}: the record's builders make {sorted(made)}, the jobs' children of that kind are "
            f"{sorted(wanted)}: name the missing builder in builders/child_kinds.py"
        )


def test_the_runtime_watches_and_wakes_by_the_records() -> None:
    assert [(r.group, r.version, r.plural, r.kind) for r in CHILD_RESOURCES] == [
        (k.group, k.version, k.plural, k.kind) for k in CHILD_KINDS if watched(k)
    ]
    assert all(resource_for(k.kind).plural == k.plural for k in CHILD_KINDS)
    # Secrets are never listed or watched: that would take RBAC to read every Secret of the namespace.
    assert [r.kind for r in UNWATCHED_RESOURCES] == ["Secret"]
    unwatched = [k for k in CHILD_KINDS if not watched(k)]
    assert all(k.wake is Wake.NEVER and k.cache is Cache.NONE for k in unwatched)
    # Nor read: the name the API server gave the one it created is recorded in the job's status.
    assert [sorted(k.verbs) for k in unwatched] == [["create"]]
    # What the drift restore relies on: Service, NetworkPolicy, Role, RoleBinding and ServiceAccount cached
    # whole (compared with their build), ConfigMaps by resourceVersion (read whole when changed).
    assert {"Pod", "Deployment"} == BATCHED_KINDS
    assert {"ConfigMap", "PersistentVolumeClaim"} == METADATA_ONLY_KINDS
    assert {"ConfigMap"} == READ_ON_CHANGE_KINDS


@pytest.mark.parametrize("record", [k for k in CHILD_KINDS if watched(k)], ids=lambda k: k.kind)
def test_a_childs_change_wakes_its_job_as_its_record_says(record: ChildKind) -> None:
    """A pod's or Deployment's change waits for the batch (the rest of a burst joins it); any other child's
    change queues the job at once."""

    class NoKube:
        def count_requests(self, hook: Any) -> None:
            pass

    async def queued_at_once() -> bool:
        controller = Controller(OperatorSettings(child_event_batch_seconds=5.0), NoKube())  # type: ignore[arg-type]
        controller.child_event("team-a", "math", record.kind)
        waiting = len(controller.queue) == 1
        await controller.stop()
        return waiting

    queued_now = asyncio.run(queued_at_once())
    assert queued_now == (record.wake is Wake.IMMEDIATE), (
        f"a {record.kind} change {'queued' if queued_now else 'did not queue'} its job at once; "
        f"its record says {record.wake.value}"
    )


def test_the_chart_grants_exactly_each_records_verbs_and_nothing_else() -> None:
    namespaced = chart_rules("grpo-operator.namespacedRules")
    cluster = chart_rules("grpo-operator.clusterRules")
    for record in CHILD_KINDS:
        rules = namespaced if record.namespaced else cluster
        granted = rules.get((record.group, record.plural), set())
        assert granted == record.verbs, (
            f"{RBAC_TEMPLATE.relative_to(REPO)} grants {sorted(granted)} on {record.kubectl_name}; the "
            f"operator uses exactly {sorted(record.verbs)} (builders/child_kinds.py): change one to match"
        )
    # The job itself (with its subresources), the Events the operator posts and the Kueue Workloads it reads
    # (only with kueue.enabled) are the only other grants.
    expected = {(k.group, k.plural) for k in CHILD_KINDS} | {
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
    assert cluster.get((NODE.group, NODE.plural)) == {"list", "watch"}


def test_the_rbac_table_of_platform_md_grants_each_records_verbs() -> None:
    namespaced = docs_rbac_tables()[0]
    for record in CHILD_KINDS:
        documented = namespaced.get((record.group, record.plural), set())
        assert documented == record.verbs, (
            f"{PLATFORM_MD.relative_to(REPO)} documents {sorted(documented)} on {record.kubectl_name}; the "
            f"record says {sorted(record.verbs)}"
        )


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
    kinds = set(BY_KIND)
    missing = sorted(k for k in kinds if not any(_names(k, row) for row in rows))
    assert not missing, f"{OPERATIONS_MD.relative_to(REPO)} 'What the operator creates' omits {missing}"
    stray = [row for row in rows if not any(_names(k, row) for k in kinds)]
    assert not stray, f"rows of {OPERATIONS_MD.name} naming no kind the builders create: {stray}"


def test_the_design_doc_counts_the_child_kinds_by_their_cache_policy() -> None:
    design = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    words = {2: "two", 1: "one", 3: "three", 10: "ten", 11: "eleven", 9: "nine"}
    metadata = sorted(
        r.kind for r in CHILD_KINDS if r.cache in (Cache.METADATA, Cache.METADATA_READ_ON_CHANGE)
    )
    uncached = sorted(r.kind for r in CHILD_KINDS if r.cache is Cache.NONE)
    said = (
        f"of the {words[len(CHILD_KINDS)]} child kinds, {words[len(metadata)]} as metadata only\n"
        f"({', '.join(metadata)}) and {words[len(uncached)]} not at all ({', '.join(uncached)})"
    )
    assert " ".join(said.split()) in " ".join(design.split())
