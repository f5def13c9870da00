"""Renders the child kinds' records (operator/grpo_operator/builders/child_kinds.py) into docs/scaling.md,
between the markers of its "What the operator watches" section; ``make generate`` writes it and
tests/unit/test_generated.py fails while the doc differs from the records.
"""

from __future__ import annotations

from pathlib import Path

from grpo_operator.builders.child_kinds import CHILD_KINDS, Cache, ChildKind, Wake, watched
from grpo_operator.runtime.wakeups import CHILD_SELECTOR

from hack.generated_section import replace_section

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "docs" / "scaling.md"
BEGIN = (
    "<!-- BEGIN generated child-kinds table: `make generate` writes it from "
    "operator/grpo_operator/builders/child_kinds.py; edit the records there -->"
)
END = "<!-- END generated child-kinds table -->"
# The verbs in the order the RBAC tables of docs/platform.md give them.
VERB_ORDER = ("get", "list", "watch", "create", "patch", "delete")


def _builders(record: ChildKind) -> str:
    return ", ".join(f"`{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}`" for fn in record.builders)


def _wake(record: ChildKind) -> str:
    if record.wake is Wake.BATCHED:
        return "batched (`childEventBatchSeconds`)"
    return str(record.wake.value)


def _row(record: ChildKind) -> str:
    resource = f"`{record.kubectl_name}` {record.version}" + ("" if record.namespaced else " (cluster)")
    verbs = ", ".join(v for v in VERB_ORDER if v in record.verbs)
    cells = (record.kind, resource, _builders(record), record.cache.value, _wake(record), record.reads, verbs)
    return "| " + " | ".join(cells) + " |"


def render_section() -> str:
    """The table and its note, markers included."""
    partial = ", ".join(r.kind for r in CHILD_KINDS if watched(r) and r.cache is not Cache.WHOLE)
    unwatched = ", ".join(r.kind for r in CHILD_KINDS if not watched(r))
    lines = [
        BEGIN,
        "",
        "| Kind | Resource | Built by (`builders/`) | Cached | Wakes its job | On a change to | RBAC verbs |",
        "|---|---|---|---|---|---|---|",
        *(_row(record) for record in CHILD_KINDS),
        "",
        f"{sum(watched(r) for r in CHILD_KINDS)} kinds, each watched once per namespace (or once cluster-wide) "
        f"with the label selector `{CHILD_SELECTOR}`; {partial} as metadata only "
        "(`PartialObjectMetadata`). A change anywhere else in an object updates the cache and wakes nobody. "
        f"Not watched and never read: {unwatched} (created once under a name the API server picks, "
        "recorded in the job's status).",
        "",
        END,
    ]
    return "\n".join(lines)


def render(text: str) -> str:
    """``text`` with its generated section replaced by the table as it is now."""
    return replace_section(text, BEGIN, END, render_section(), OUTPUT, "What the operator watches")


def render_text() -> str:
    return render(OUTPUT.read_text(encoding="utf-8"))
