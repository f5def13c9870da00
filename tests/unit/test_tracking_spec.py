"""spec.tracking on the operator's side: the platform's default trackers under a job's own, the trackers'
credentials as Secret references in trainer rank 0 only, and settings that name a broken default refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from grpo_operator.api.tracking import MLFLOW_CREDENTIAL_KEYS
from grpo_operator.builders import gang_pods, job_from_object
from grpo_operator.builders.trainer_configmap import trainer_config_text
from grpo_operator.settings import OperatorSettings, SettingsError

from tests.unit.reconcile_world import job_object

PLATFORM = {
    "mlflow": {"trackingUri": "http://mlflow.mlflow.svc:5000", "credentialsSecret": "platform-mlflow"},
    "tensorBoard": {"enabled": True},
}


def _tracking(spec: dict[str, Any] | None, defaults: dict[str, Any]) -> dict[str, Any] | None:
    job = job_from_object(job_object(**({"tracking": spec} if spec is not None else {})))
    text = trainer_config_text(job, OperatorSettings(tracking_defaults=defaults))
    found: dict[str, Any] | None = json.loads(text).get("tracking")
    return found


def _env(spec: dict[str, Any], defaults: dict[str, Any], rank: int) -> list[dict[str, Any]]:
    job = job_from_object(job_object(trainer={"nodes": 2}, tracking=spec))
    pods = gang_pods(job, OperatorSettings(tracking_defaults=defaults), 1, "")
    (pod,) = [p for p in pods if p["metadata"]["labels"].get("grpo.dev/node-rank") == str(rank)]
    env: list[dict[str, Any]] = pod["spec"]["containers"][0]["env"]
    return env


def test_a_job_without_trackers_gets_the_platform_defaults_whole() -> None:
    tracking = _tracking(None, PLATFORM)
    assert tracking is not None
    assert tracking["mlflow"]["trackingUri"] == "http://mlflow.mlflow.svc:5000"
    assert tracking["tensorBoard"] == {"enabled": True}


def test_a_jobs_own_tracker_block_wins_whole_and_enabled_false_turns_the_default_off() -> None:
    own = {"mlflow": {"trackingUri": "https://mlflow.team-a.example.com"}, "tensorBoard": {"enabled": False}}
    tracking = _tracking(own, PLATFORM)
    assert tracking is not None
    # The platform's credentials never follow its server into a job that names its own.
    assert tracking["mlflow"] == {"enabled": True, "trackingUri": "https://mlflow.team-a.example.com"}
    assert tracking["tensorBoard"] == {"enabled": False}
    off = _tracking({"mlflow": {"enabled": False}}, PLATFORM)
    assert off is not None and off["mlflow"] == {"enabled": False}


def test_without_platform_defaults_trainer_json_has_exactly_the_jobs_trackers() -> None:
    assert _tracking(None, {}) is None
    assert _tracking({"wandb": {"project": "p", "mode": "offline"}}, {}) == {
        "wandb": {"enabled": True, "project": "p", "mode": "offline"}
    }


def test_tracker_credentials_are_secret_references_in_rank_0_only() -> None:
    spec = {"wandb": {"project": "p", "apiKeySecretRef": {"name": "wandb", "key": "apiKey"}}}
    rank_0 = {e["name"]: e for e in _env(spec, PLATFORM, 0)}
    assert rank_0["WANDB_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "wandb", "key": "apiKey"}}
    for key in MLFLOW_CREDENTIAL_KEYS:
        # From the platform's default block; each key optional (a password pair or a token).
        assert rank_0[key]["valueFrom"] == {
            "secretKeyRef": {"name": "platform-mlflow", "key": key, "optional": True}
        }
    assert all("value" not in rank_0[name] for name in ("WANDB_API_KEY", *MLFLOW_CREDENTIAL_KEYS))
    rank_1 = {e["name"] for e in _env(spec, PLATFORM, 1)}
    assert not rank_1 & {"WANDB_API_KEY", *MLFLOW_CREDENTIAL_KEYS}


def test_offline_wandb_and_a_turned_off_mlflow_need_no_credentials() -> None:
    spec = {"wandb": {"project": "p", "mode": "offline"}, "mlflow": {"enabled": False}}
    names = {e["name"] for e in _env(spec, PLATFORM, 0)}
    assert not names & {"WANDB_API_KEY", *MLFLOW_CREDENTIAL_KEYS}


@pytest.mark.parametrize(
    ("defaults", "says"),
    [
        ({"mlflow": {"experiment": "x"}}, "trackingUri"),
        ({"wandb": {"project": "p"}}, "apiKeySecretRef"),
        ({"comet": {}}, "comet"),
    ],
)
def test_a_broken_platform_default_is_refused_at_start_naming_the_field(
    defaults: dict[str, Any], says: str
) -> None:
    with pytest.raises(SettingsError, match=rf"jobDefaults\.tracking.*{says}"):
        OperatorSettings(tracking_defaults=defaults)
