"""Spec fields added after the upgrade baseline (the development commit released_fields.json names; no
release yet), and their defaults.

An upgraded operator finds them, at their defaults, in every job it already runs. Two things must not
change for those jobs: the gang hash (a change restarts the running gang) and trainer.json (an older
trainer image, pinned in the job's spec.trainer.image, refuses keys it does not know and would exit with
"configuration invalid"). So both leave these fields out while they hold their default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel

# What the upgrade baseline's jobs and trainer images hold: the spec's field paths and trainer.json's key
# paths (Python names, dotted) with their defaults; written by `python -m hack.released_fields --update` at
# a release, never by `make generate`.
RELEASED_FIELDS_FILE = str(Path(__file__).with_name("released_fields.json"))
SNAPSHOT_ABOUT = (
    "What jobs and trainer images of the upgrade baseline hold, for upgrade safety "
    "(tests/unit/test_compat.py): `spec` is every field path of GRPOJob.spec (Python names, dotted) with "
    "its default; `trainerJson` is every key path of trainer.json (TrainerConfig, Python names, dotted) "
    "with its default. `release` names the baseline. Written by `python -m hack.released_fields --update "
    "--release ID` at a release, never by `make generate`."
)

# (path of field names from the spec, its default). Field names are the Python ones; the camelCase
# (wire) names are derived.
LATER_FIELDS: tuple[tuple[tuple[str, ...], Any], ...] = (
    (("dataset", "apply_chat_template"), True),
    (("grpo", "validation", "score_path"), "/score"),
)


# Fields whose CRD default was removed since the baseline, with that default. The API server wrote it into
# every job it stored under the baseline CRD, so such a job holds it as its own value and keeps it: its
# gang hash and pods are unchanged by the upgrade. Only jobs created since leave the field unset and get
# the platform's default from the operator settings (builders/images.py).
FORMER_DEFAULTS: tuple[tuple[tuple[str, ...], Any], ...] = (
    (("trainer", "image"), "ghcr.io/grpo-operator/trainer:0.1.0"),
    (("generation", "image"), "vllm/vllm-openai:v0.31.0"),
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


def spec_fields(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every field of ``model`` and of the models nested in it (through Optional, lists and dicts), by path
    of Python names, with its default (``REQUIRED`` for a field without one, the factory's value for a
    ``default_factory``). Upgrade safety is judged on this list (tests/unit/test_compat.py)."""
    found: dict[tuple[str, ...], Any] = {}
    for name, info in model.model_fields.items():
        path = (*prefix, name)
        if info.default_factory is not None:
            default: Any = info.default_factory()  # type: ignore[call-arg]
        elif info.is_required():
            default = REQUIRED
        else:
            default = info.default
        found[path] = default
        for nested in models_in(info.annotation):
            found.update(spec_fields(nested, path))
    return found


REQUIRED = "<required>"


def models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in models_in(arg)]
