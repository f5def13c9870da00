"""docs/concepts.md "When a job does not learn" is generated from the one learning-health table
(api/learning_health.py) by hack/learning_health_table.py: it is current, lists every reason and every
threshold with the built-in default the trainer uses, and names the Helm value that sets platform defaults."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from grpo_operator.api.learning_health import (
    LEARNING_REASONS,
    REASONS,
    LearningHealthSpec,
    Thresholds,
)

from hack import generate, learning_health_table
from hack.generated_section import MarkersMissing

REPO = Path(__file__).resolve().parents[2]


def doc() -> str:
    return learning_health_table.OUTPUT.read_text(encoding="utf-8")


def test_the_section_is_current_and_make_generate_writes_it() -> None:
    text = doc()
    assert learning_health_table.render_reasons() in text, "docs/concepts.md is stale: run `make generate`"
    assert learning_health_table.render_thresholds() in text, "docs/concepts.md is stale: run `make generate`"
    assert learning_health_table.render(text) == text
    assert "learning_health_table.OUTPUT" in (REPO / "hack" / "generate.py").read_text(encoding="utf-8")
    assert generate.__doc__ and "hack/learning_health_table.py" in generate.__doc__


def test_the_generated_parts_sit_under_the_heading_others_link_to() -> None:
    # The chart's values.yaml and api/learning_health.py send readers to this heading by name.
    text = doc()
    heading = text.index("\n## When a job does not learn\n")
    following = text.find("\n## ", heading + 1)
    for marker in (learning_health_table.REASONS_BEGIN, learning_health_table.THRESHOLDS_END):
        assert heading < text.index(marker) < (following if following >= 0 else len(text))


def test_every_reason_has_a_row_with_its_words_and_no_placeholder_left() -> None:
    section = learning_health_table.render_reasons()
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(LEARNING_REASONS)
    for row, info in zip(rows, REASONS.values(), strict=True):
        assert ("| yes |" if info.healthy else "| **no** |") in row
        assert (f"`{info.alert}`" if info.alert else "| — |") in row
        assert "{" not in row and "}" not in row, row
    no_signal = rows[LEARNING_REASONS.index("NoSignal")]
    assert "*tiedGroupRatio* of groups tied" in no_signal and "mostly *tiedReward*" in no_signal
    assert "make the reward graded" in no_signal and "`spec.grpo.dynamicSampling`" in no_signal


def test_placeholders_become_the_names_of_the_figures() -> None:
    words = learning_health_table.seen_in_words("over {window} steps: {tiedGroupRatio:.0%} at {kl:.3g} nats")
    assert words == "over *windowSteps* steps: *tiedGroupRatio* at *kl* nats"


def test_every_threshold_has_a_row_with_the_default_the_trainer_uses() -> None:
    section = learning_health_table.render_thresholds()
    spec_fields = LearningHealthSpec.model_fields
    assert [f.name for f in fields(Thresholds)] == list(spec_fields)
    for field in fields(Thresholds):
        alias = spec_fields[field.name].alias
        default = learning_health_table.default_text(getattr(Thresholds(), field.name))
        assert f"| `{alias}` | `{default}` |" in section, alias


def test_each_field_description_states_the_built_in_default_of_thresholds() -> None:
    # The CRD and docs/api.md show the description's "Unset: X"; the trainer judges with Thresholds.
    for name, info in LearningHealthSpec.model_fields.items():
        match = re.search(r"Unset: ([^\s(]+?)\.?(?: \(|$)", info.description or "")
        assert match, f"{name}: its description does not say its default"
        assert match.group(1) == learning_health_table.default_text(getattr(Thresholds(), name)), name


def test_the_helm_value_the_doc_names_is_the_charts() -> None:
    assert "Helm value `jobDefaults.learningHealth`" in doc()
    values = yaml.safe_load((REPO / "helm" / "grpo-operator" / "values.yaml").read_text(encoding="utf-8"))
    assert "learningHealth" in values["jobDefaults"]


def test_a_doc_without_the_markers_is_refused_with_where_they_go() -> None:
    with pytest.raises(MarkersMissing, match="When a job does not learn"):
        learning_health_table.render("# Concepts\n\nno table here\n")
