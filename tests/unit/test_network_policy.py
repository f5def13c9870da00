"""The vLLM NetworkPolicy: the job's trainers only, plus the metrics scrapers the platform names."""

from __future__ import annotations

import json
from typing import Any

import pytest
from grpo_operator.builders import infrastructure
from grpo_operator.builders.common import ANNOTATION_HASH
from grpo_operator.builders.network import generation_network_policy, trainer_network_policy
from grpo_operator.settings import OperatorSettings, SettingsError

from tests.unit.reconcile_world import World, job_object
from tests.unit.test_builders import make_job

TRAINERS = {"podSelector": {"matchLabels": {"grpo.dev/job": "math", "grpo.dev/role": "trainer"}}}
PROMETHEUS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
SCRAPER_SUBNET = {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.5.0/24"]}}


def test_by_default_only_the_jobs_trainers_reach_vllm() -> None:
    policy = generation_network_policy(make_job(), OperatorSettings())
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "grpo.dev/job": "math",
        "grpo.dev/role": "generation",
    }
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"from": [TRAINERS]}]


def test_scrapers_get_exactly_one_extra_rule_on_the_vllm_http_port() -> None:
    settings = OperatorSettings(metrics_scrapers=(PROMETHEUS, SCRAPER_SUBNET))
    policy = generation_network_policy(make_job(), settings)
    assert settings.vllm_port == 8000
    assert policy["spec"]["ingress"] == [
        {"from": [TRAINERS]},  # unchanged: trainers on every port (NCCL)
        {"from": [PROMETHEUS, SCRAPER_SUBNET], "ports": [{"protocol": "TCP", "port": 8000}]},
    ]
    assert (
        policy["spec"]["podSelector"]
        == generation_network_policy(make_job(), OperatorSettings())["spec"]["podSelector"]
    )


def test_infrastructure_passes_the_settings_to_the_vllm_policy() -> None:
    settings = OperatorSettings(metrics_scrapers=(PROMETHEUS,))
    policies = {
        c["metadata"]["name"]: c for c in infrastructure(make_job(), settings) if c["kind"] == "NetworkPolicy"
    }
    assert policies["math-gen"]["spec"]["ingress"][1]["from"] == [PROMETHEUS]
    # The metric service stays closed to scrapers: only vLLM gets the extra rule.
    assert len(policies["math-metric"]["spec"]["ingress"]) == 1


def test_the_spec_hash_follows_the_setting_so_reconcile_reapplies_existing_policies() -> None:
    def hash_of(settings: OperatorSettings) -> str:
        return str(
            generation_network_policy(make_job(), settings)["metadata"]["annotations"][ANNOTATION_HASH]
        )

    default = hash_of(OperatorSettings())
    with_prometheus = hash_of(OperatorSettings(metrics_scrapers=(PROMETHEUS,)))
    assert with_prometheus != default
    assert hash_of(OperatorSettings(metrics_scrapers=(PROMETHEUS, SCRAPER_SUBNET))) != with_prometheus
    # Taking the setting away again returns to the original policy (and hash).
    assert hash_of(OperatorSettings(metrics_scrapers=())) == default


def test_the_policy_does_not_share_objects_with_the_settings() -> None:
    peer: dict[str, Any] = json.loads(json.dumps(PROMETHEUS))
    settings = OperatorSettings(metrics_scrapers=(peer,))
    policy = generation_network_policy(make_job(), settings)
    policy["spec"]["ingress"][1]["from"][0]["podSelector"]["matchLabels"]["x"] = "y"
    assert peer == PROMETHEUS


def test_scrapers_from_the_environment_as_json() -> None:
    raw = json.dumps([PROMETHEUS, SCRAPER_SUBNET])
    settings = OperatorSettings.from_env({"GRPO_OPERATOR_METRICS_SCRAPERS": raw})
    assert settings.metrics_scrapers == (PROMETHEUS, SCRAPER_SUBNET)
    assert OperatorSettings.from_env({"GRPO_OPERATOR_METRICS_SCRAPERS": "[]"}).metrics_scrapers == ()
    assert OperatorSettings.from_env({}).metrics_scrapers == ()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            '[{"podSelectr": {}}]',
            "has unknown keys ['podSelectr'] (allowed: podSelector, namespaceSelector, ipBlock)",
        ),
        ('["prometheus"]', "is str, not an object"),
        ("[{}]", "is empty"),
        (
            '[{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]',
            "combines ipBlock with a selector",
        ),
        # A misspelt matchLabels must not turn into an empty selector, which would select every pod.
        ('[{"podSelector": {"matchLabel": {"a": "b"}}}]', "has unknown keys ['matchLabel'] in podSelector"),
        ('[{"namespaceSelector": "monitoring"}]', "has namespaceSelector 'monitoring', not an object"),
        ('[{"ipBlock": {"except": ["10.0.0.0/8"]}}]', "has an ipBlock without a cidr"),
    ],
)
def test_bad_scrapers_are_rejected_with_the_setting_and_what_to_do(raw: str, message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        OperatorSettings.from_env({"GRPO_OPERATOR_METRICS_SCRAPERS": raw})
    text = str(caught.value)
    assert message in text
    assert text.startswith("metrics_scrapers[0] (GRPO_OPERATOR_METRICS_SCRAPERS, Helm: ")
    assert "metrics.podMonitors.generation.allowFrom" in text
    assert "give each entry as a NetworkPolicyPeer" in text


@pytest.mark.parametrize("raw", ['{"podSelector": {}}', "not json"])
def test_scrapers_must_be_a_json_list(raw: str) -> None:
    with pytest.raises(SettingsError, match="GRPO_OPERATOR_METRICS_SCRAPERS="):
        OperatorSettings.from_env({"GRPO_OPERATOR_METRICS_SCRAPERS": raw})


# --- the trainer policy ---------------------------------------------------------------------------------

VLLM = {"podSelector": {"matchLabels": {"grpo.dev/job": "math", "grpo.dev/role": "generation"}}}


def test_trainers_admit_only_the_jobs_own_vllm_and_trainer_pods_by_default() -> None:
    policies = {
        c["metadata"]["name"]: c
        for c in infrastructure(make_job(), OperatorSettings())
        if c["kind"] == "NetworkPolicy"
    }
    policy = policies["math-trainer"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "grpo.dev/job": "math",
        "grpo.dev/role": "trainer",
    }
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    # All ports: the weight-sync store and rendezvous first, then NCCL on ephemeral ports.
    assert policy["spec"]["ingress"] == [{"from": [VLLM, TRAINERS]}]
    assert policy["metadata"]["labels"]["grpo.dev/role"] == "trainer"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-1234"


def test_scrapers_reach_trainers_on_the_metrics_port_only() -> None:
    settings = OperatorSettings(
        metrics_scrapers=(PROMETHEUS,),
        trainer_metrics_scrapers=(PROMETHEUS, SCRAPER_SUBNET),
        trainer_metrics_port=9400,
    )
    policy = trainer_network_policy(make_job(), settings)
    assert policy["spec"]["ingress"] == [
        {"from": [VLLM, TRAINERS]},
        # Scrapers of vLLM may scrape trainers too; one entry per peer.
        {"from": [PROMETHEUS, SCRAPER_SUBNET], "ports": [{"protocol": "TCP", "port": 9400}]},
    ]
    only_trainer = trainer_network_policy(
        make_job(), OperatorSettings(trainer_metrics_scrapers=(PROMETHEUS,))
    )
    assert only_trainer["spec"]["ingress"][1]["from"] == [PROMETHEUS]
    # A trainer-only scraper does not open vLLM's API.
    assert generation_network_policy(make_job(), OperatorSettings(trainer_metrics_scrapers=(PROMETHEUS,)))[
        "spec"
    ]["ingress"] == [{"from": [TRAINERS]}]


def test_bad_trainer_scrapers_name_their_own_setting() -> None:
    with pytest.raises(SettingsError) as caught:
        OperatorSettings.from_env({"GRPO_OPERATOR_TRAINER_METRICS_SCRAPERS": "[{}]"})
    text = str(caught.value)
    assert text.startswith("trainer_metrics_scrapers[0] (GRPO_OPERATOR_TRAINER_METRICS_SCRAPERS, Helm: ")
    assert "metrics.podMonitors.trainer.allowFrom" in text


def test_reconcile_creates_the_trainer_policy_and_restores_it_when_deleted() -> None:
    world = World(job_object())
    plan = world.step()
    assert ("NetworkPolicy", "math-trainer") in {(m["kind"], m["metadata"]["name"]) for m in plan.applies}
    world.settle()
    del world.objects[("NetworkPolicy", "math-trainer")]
    again = world.reconcile()
    assert [m["metadata"]["name"] for m in again.applies if m["kind"] == "NetworkPolicy"] == ["math-trainer"]
