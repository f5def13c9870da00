"""Spec fields added after the first release, and their defaults.

An upgraded operator finds them, at their defaults, in every job it already runs. Two things must not
change for those jobs: the gang hash (a change restarts the running gang) and trainer.json (an older
trainer image, pinned in the job's spec.trainer.image, refuses keys it does not know and would exit with
"configuration invalid"). So both leave these fields out while they hold their default.
"""

from __future__ import annotations

from typing import Any

# (path of field names from the spec, its default). Field names are the Python ones; the camelCase
# (wire) names are derived.
LATER_FIELDS: tuple[tuple[tuple[str, ...], Any], ...] = (
    (("dataset", "apply_chat_template"), True),
    (("grpo", "validation", "score_path"), "/score"),
)


def wire_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def drop_later_defaults(wire: dict[str, Any]) -> None:
    """Remove, in place, each later field that holds its default from a camelCase spec dict."""
    for path, default in LATER_FIELDS:
        holder: Any = wire
        for name in path[:-1]:
            holder = holder.get(wire_name(name)) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and holder.get(wire_name(path[-1]), object()) == default:
            del holder[wire_name(path[-1])]


def later_defaults_exclude(model: Any) -> dict[str, Any]:
    """A pydantic ``exclude`` mapping of the later fields that hold their default in ``model``."""
    exclude: dict[str, Any] = {}
    for path, default in LATER_FIELDS:
        value: Any = model
        for name in path:
            value = getattr(value, name, None)
        if value == default:
            node = exclude
            for name in path[:-1]:
                node = node.setdefault(name, {})
            node[path[-1]] = True
    return exclude
