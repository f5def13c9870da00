"""What `kubectl grpo check` and the chart's warnings policy tell a user before a job runs: unknown fields
with the name meant (TRL's included), and valid settings that are likely mistakes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from grpo_operator.api import GRPOJob
from grpo_operator.api.advice import TRL_NAMES, check_manifest, unknown_fields, warnings
from grpo_operator.api.crd import build_crd
from grpo_operator.kubectl_plugin import cli

from tests.unit.advice_cases import WARNING_CASES
from tests.unit.manifests import with_changes

# Large enough for the base manifest, small enough that "rollouts-above" (16.4M) crosses it and
# "rollouts-iterations-below" (8.2M) does not.
THRESHOLD = 10_000_000


@pytest.mark.parametrize(("case_id", "changes", "fields"), WARNING_CASES, ids=[c[0] for c in WARNING_CASES])
def test_warnings_name_the_field(case_id: str, changes: dict[str, Any], fields: list[str]) -> None:
    spec = GRPOJob.model_validate(with_changes(changes)).spec
    assert [w.field for w in warnings(spec, THRESHOLD)] == fields


def test_a_hub_url_is_answered_with_its_hub_id_and_the_rollouts_with_the_arithmetic() -> None:
    spec = GRPOJob.model_validate(
        with_changes({"spec.model.name": "https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct/tree/main"})
    ).spec
    (url,) = warnings(spec)
    assert url.message.endswith("give the Hub id 'Qwen/Qwen2.5-0.5B-Instruct'")
    spec = GRPOJob.model_validate(
        with_changes(
            {"spec.grpo": {"groupSize": 16, "promptsPerStep": 1024, "steps": 999, "numIterations": 2}}
        )
    ).spec
    (big,) = warnings(spec, 1_000_000)
    assert big.message.startswith(
        "the job generates 8192000 rollouts (ceil(steps 999 / numIterations 2) * promptsPerStep 1024 * "
        "groupSize 16), above this platform's warning threshold of 1000000"
    )
    assert warnings(spec, 0) == []  # 0 turns the size warning off


def test_unknown_fields_get_trl_names_and_near_misses() -> None:
    manifest = with_changes(
        {
            "spec.grpo.num_generations": 8,
            "spec.grpo.maxSteps": 100,
            "spec.grpo.learningrate": 1e-6,
            "spec.trainer.gpus": 2,
            "spec.metric.env": [{"name": "A", "valu": "x"}],
            "spec.scheduling.affinity": {"nodeAffinity": {}},
            "spec.wibble": 1,
        }
    )
    found = {a.field: a.message for a in unknown_fields(manifest)}
    assert found == {
        "spec.grpo.num_generations": "unknown field; TRL's num_generations is spec.grpo.groupSize in a GRPOJob",
        "spec.grpo.maxSteps": "unknown field; TRL's max_steps is spec.grpo.steps in a GRPOJob",
        "spec.grpo.learningrate": "unknown field; did you mean spec.grpo.learningRate?",
        "spec.trainer.gpus": "unknown field; did you mean spec.trainer.gpusPerNode?",
        "spec.metric.env[0].valu": "unknown field; did you mean spec.metric.env[0].value?",
        "spec.wibble": found["spec.wibble"],
    }
    assert found["spec.wibble"].startswith(
        "unknown field; the fields of spec are budget, checkpoints, dataset,"
    )


def test_a_manifest_with_unknown_fields_is_still_judged_on_the_rest() -> None:
    errors, advice = check_manifest(
        with_changes(
            {"spec.grpo.num_generations": 8, "spec.trainer.perDeviceBatchSize": 3, "spec.metric.image": "m"}
        )
    )
    assert errors == [
        "spec.grpo.promptsPerStep: spec.grpo.promptsPerStep * spec.grpo.groupSize (B*G completions per step) "
        "must be divisible by spec.trainer.nodes * spec.trainer.gpusPerNode * spec.trainer.perDeviceBatchSize "
        "(the data-parallel batch): change B or G, or the trainer's GPUs or perDeviceBatchSize. Here B*G = "
        "2*4 = 8 and the data-parallel batch is 1*1*3 = 3"
    ]
    assert [a.field for a in advice] == ["spec.grpo.num_generations"]  # warnings come once it is valid


def test_every_trl_name_points_at_a_real_field() -> None:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for trl, where in TRL_NAMES.items():
        path = where.split(" ")[0]
        if not path.startswith("spec."):
            continue
        node = spec
        for part in path.split(".")[1:]:
            assert part in node.get("properties", {}), f"TRL's {trl}: {path} is not a spec field"
            node = node["properties"][part]


def _check(tmp_path: Path, manifest: Any, *flags: str) -> int:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return cli.main(["check", "-f", str(path), *flags])


def test_check_prints_the_verdict_and_exits_1_when_the_api_server_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _check(tmp_path, with_changes({"spec.grpo.num_generations": 8})) == 1
    shown = capsys.readouterr().out
    assert "job: would be refused" in shown
    assert "  spec.grpo.num_generations: unknown field; TRL's num_generations is spec.grpo.groupSize" in shown

    assert _check(tmp_path, with_changes({"spec.metric.image": "metric\x1b[2J:latest"})) == 0
    shown = capsys.readouterr().out
    assert (
        "job: would be accepted, with 1 warning\n  warning: spec.metric.image 'metric\\u001b[2J:latest'"
        in shown
    )
    assert "\x1b" not in shown  # the tenant's text never reaches the terminal raw


def test_check_json_and_several_documents(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        yaml.safe_dump_all(
            [
                {"apiVersion": "v1", "kind": "ConfigMap"},
                with_changes({}, name="ok"),
                with_changes({"spec.model": {}}, name="bad"),
            ]
        )
    )
    assert cli.main(["check", "-f", str(path), "-o", "json"]) == 1
    found = json.loads(capsys.readouterr().out)
    assert found[0]["skipped"] == "not a GRPOJob (kind 'ConfigMap')"
    assert found[1] == {
        "document": 1,
        "name": "ok",
        "accepted": True,
        "errors": [],
        "unknownFields": [],
        "warnings": [],
    }
    assert found[2]["accepted"] is False and found[2]["errors"][0].startswith(
        "spec.model.name: Field required"
    )


def test_check_of_a_file_without_a_job_or_with_bad_yaml_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _check(tmp_path, {"kind": "ConfigMap"}) == 5
    assert "holds no GRPOJob" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("spec: [unclosed")
    assert cli.main(["check", "-f", str(tmp_path / "bad.yaml")]) == 5
    assert "is not valid YAML" in capsys.readouterr().err


def test_every_example_passes_check_without_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    examples = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
    assert len(examples) >= 5
    for path in examples:
        assert cli.main(["check", "-f", str(path)]) == 0, path
        assert "warning" not in capsys.readouterr().out, path
