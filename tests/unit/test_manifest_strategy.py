"""The property test's manifests (tests/unit/manifest_strategy.py) come from the models: every field of the
spec's schema is drawn, from its own schema unless OVERRIDES tunes it, and both verdicts stay common."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pydantic
from grpo_operator.api import GRPOJob
from hypothesis import HealthCheck, given, settings

from tests.unit.manifest_strategy import OVERRIDES, SPEC_SCHEMA, WHOLE_LISTS, job_manifests


def _paths(schema: dict[str, Any], path: str = "") -> list[str]:
    """Every field path of ``schema`` (wire names, dotted; "[]" for a list's items)."""
    out = [path] if path else []
    if schema.get("type") == "object" and "properties" in schema:
        for name, prop in schema["properties"].items():
            out += _paths(prop, f"{path}.{name}".lstrip("."))
    elif schema.get("type") == "array":
        out += _paths(schema["items"], f"{path}.[]")
    return out


def test_every_field_of_the_spec_is_drawn_from_its_schema_or_a_named_override() -> None:
    paths = set(_paths(SPEC_SCHEMA))
    assert not set(OVERRIDES) - paths, f"overrides of no spec field: {sorted(set(OVERRIDES) - paths)}"
    assert set(WHOLE_LISTS) <= set(OVERRIDES) and all(WHOLE_LISTS.values())
    hidden = sorted(
        p
        for p in paths
        if any(p.startswith(f"{o}.") for o in OVERRIDES)
        and not any(p.startswith(f"{w}.") for w in WHOLE_LISTS)
    )
    assert not hidden, (
        f"spec fields below an override, never drawn: {hidden}. Draw the parent from the schema (override "
        "the leaves instead), or list it in WHOLE_LISTS with the reason"
    )


def test_about_half_of_the_manifests_are_valid() -> None:
    verdicts: Counter[bool] = Counter()

    @settings(
        max_examples=200,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    @given(manifest=job_manifests())
    def draw(manifest: dict[str, Any]) -> None:
        try:
            GRPOJob.model_validate(manifest)
        except pydantic.ValidationError:
            verdicts[False] += 1
        else:
            verdicts[True] += 1

    draw()
    # The property (tests/integration/test_crd_property.py) says little about a verdict that is rare.
    assert verdicts[True] >= 20 and verdicts[False] >= 20, verdicts
