"""``spec.grpo.preset``: named, vetted groups of GRPO knobs from the papers that introduced them.

A preset fills each knob it names that the spec leaves unset; a knob the spec sets wins. "Unset" means
absent from the manifest: the knobs a preset names that have a default of their own (``lossType``,
``scaleRewards``, ``epsilon``, ``dynamicSampling``) therefore carry no default in the CRD (the API server
would otherwise write it into every stored spec and a preset could never tell it from a value the user
chose); the models apply the default where neither the spec nor a preset sets one.

The one table below is the source of the resolution (``GRPOSpec.effective``), of the CEL expressions that
check the resolved values at apply time (:func:`cel_effective`) and of the preset table in docs/api.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from grpo_operator.api.compat import wire_name

PresetName = Literal["dapo", "dr-grpo", "gspo"]


@dataclass(frozen=True)
class Preset:
    """The knobs one preset sets (GRPOSpec's Python field names). Why each does so is in docs/concepts.md
    (Presets), whose table tests/unit/test_grpo_presets.py keeps in step with this one."""

    knobs: dict[str, Any]
    # Knobs about how the trainer samples: left out for client rollouts (spec.rollouts.source: Client),
    # where the client samples and the trainer only trains on what it is sent.
    trainer_sampling: frozenset[str] = field(default_factory=frozenset)


PRESETS: dict[str, Preset] = {
    # DAPO, arXiv 2503.14476 (epsilon stays at its 0.2: the paper's lower bound).
    "dapo": Preset(
        knobs={
            "loss_type": "dapo",
            "epsilon_high": 0.28,
            "mask_truncated_completions": True,
            "dynamic_sampling": True,
        },
        trainer_sampling=frozenset({"dynamic_sampling"}),
    ),
    # Dr. GRPO, arXiv 2503.20783.
    "dr-grpo": Preset(
        knobs={"loss_type": "dr_grpo", "scale_rewards": "none"},
    ),
    # GSPO, arXiv 2507.18071, with the values TRL documents for it (its beta 0 is already the default).
    "gspo": Preset(
        knobs={
            "importance_sampling_level": "sequence",
            "loss_type": "grpo",
            "epsilon": 3e-4,
            "epsilon_high": 4e-4,
        },
    ),
}

# Every knob some preset sets. Those with a default of their own carry no default in the CRD (see the
# module docstring); tests/unit/test_grpo_presets.py checks that the models mark exactly those.
PRESET_KNOBS = frozenset(name for preset in PRESETS.values() for name in preset.knobs)


def cel_literal(value: Any) -> str:
    """A Python value as a CEL literal of the type the API server gives the field."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value + "'"
    if isinstance(value, float):
        text = repr(value)
        return text if any(c in text for c in ".e") else text + ".0"
    return json.dumps(value)


def cel_effective(name: str, otherwise: str, obj: str = "self") -> str:
    """CEL for the value the trainer uses for ``name`` of the grpo object ``obj``: the spec's when set,
    else the preset's, else ``otherwise`` (a CEL expression: the default). For the rules on spec.grpo;
    the dynamic-sampling exception for client rollouts is not expressed (no rule needs it)."""
    expr = otherwise
    for preset_name, preset in reversed(PRESETS.items()):
        if name in preset.knobs:
            expr = (
                f"((has({obj}.preset) && {obj}.preset == '{preset_name}') ? "
                f"{cel_literal(preset.knobs[name])} : {expr})"
            )
    return f"(has({obj}.{wire_name(name)}) ? {obj}.{wire_name(name)} : {expr})"


def describe(name: str, values: dict[str, Any], explicit: set[str], sampled_by_client: bool) -> str:
    """One line naming what preset ``name`` resolved to: each knob's value, and where it came from when
    not from the preset (the spec set it, or it does not apply to client rollouts)."""
    preset = PRESETS[name]
    parts = []
    for knob in preset.knobs:
        value = values[knob]
        text = f"{wire_name(knob)}={cel_literal(value) if isinstance(value, bool) else value}"
        if knob in explicit:
            text += " (set in the spec)"
        elif sampled_by_client and knob in preset.trainer_sampling:
            text += " (the client samples)"
        parts.append(text)
    return f"preset {name}: " + ", ".join(parts)


__all__ = ["PRESETS", "PRESET_KNOBS", "Preset", "PresetName", "cel_effective", "cel_literal", "describe"]
