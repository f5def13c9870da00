"""`kubectl grpo config` and `kubectl grpo compare`, the parts that need no cluster: the spec as training
uses it (defaults and the preset filled in), the settings two jobs differ in, and their curves side by side
from what each trainer wrote (read here through the host-path transport the local cluster uses)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from grpo_operator.kubectl_plugin import cli, data
from grpo_operator.kubectl_plugin.errors import BadData
from grpo_operator.kubectl_plugin.settings_view import _curve, curves_table, resolved_spec, settings_diff
from grpo_operator.kubectl_plugin.volume import HostPathTransport

from tests.unit.manifests import with_changes


def test_the_resolved_spec_has_the_presets_values_and_every_default() -> None:
    spec = resolved_spec(with_changes({"spec.grpo.preset": "dr-grpo", "spec.grpo.lossType": "grpo"}))
    grpo = spec["grpo"]
    # The preset's knob the spec left unset, the spec's own where it set one, and plain defaults.
    assert grpo["scaleRewards"] == "none" and grpo["lossType"] == "grpo" and grpo["learningRate"] == 1e-6
    assert spec["generation"]["tensorParallelSize"] == 1 and spec["checkpoints"]["everySteps"] == 50


def test_a_spec_the_plugin_cannot_read_is_bad_data() -> None:
    with pytest.raises(BadData, match=r"the job's spec does not validate .*spec.grpo.groupSize"):
        resolved_spec(
            {"spec": {**with_changes({})["spec"], "grpo": {"groupSize": 1, "promptsPerStep": 2, "steps": 3}}}
        )


def test_settings_diff_names_each_field_that_differs() -> None:
    a = resolved_spec(with_changes({"spec.grpo.learningRate": 1e-6}))
    b = resolved_spec(with_changes({"spec.grpo.learningRate": 3e-6, "spec.grpo.preset": "dapo"}))
    diff = {row["field"]: (row["a"], row["b"]) for row in settings_diff(a, b)}
    assert diff["spec.grpo.learningRate"] == (1e-6, 3e-6)
    assert diff["spec.grpo.preset"] == (None, "dapo")
    assert diff["spec.grpo.dynamicSampling"] == (False, True)  # the preset's value, resolved
    assert "spec.grpo.groupSize" not in diff
    assert settings_diff(a, a) == []


def test_curves_come_from_each_jobs_metrics_and_line_up_by_step(tmp_path: Path) -> None:
    volumes = {}
    for name, rewards in (("a", [0.1, 0.2, 0.4]), ("b", [0.1, 0.3])):
        output = tmp_path / name / "output"
        output.mkdir(parents=True)
        lines = [{"step": i + 1, "reward_mean": r} for i, r in enumerate(rewards)]
        lines[-1]["validation_mean"] = 0.5
        (output / "metrics.jsonl").write_text(
            "".join(json.dumps(x) + "\n" for x in lines) + '{"step": "x"}\n'
        )
        volumes[name] = _curve(HostPathTransport(tmp_path / name))
    assert volumes["a"][3] == {"reward": 0.4, "validation": 0.5} and set(volumes["b"]) == {1, 2}
    table = curves_table("a", "b", volumes["a"], volumes["b"]).splitlines()
    assert table[0].split() == ["STEP", "REWARD", "a", "REWARD", "b", "VALID", "a", "VALID", "b"]
    assert table[3].split() == ["3", "0.4000", "-", "0.5000", "-"]
    assert data.METRICS_FILE.endswith("output/metrics.jsonl")


def test_help_lists_config_and_compare(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 0
    shown = capsys.readouterr().out
    assert "config" in shown and "compare" in shown and "check" in shown
