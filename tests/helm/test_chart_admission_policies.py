"""The chart's ValidatingAdmissionPolicies, rendered offline: where they are bound, whom they exempt,
and that their literals are the operator's own settings and status fields.
tests/helm/test_admission_policies.py and test_admission_job_labels.py run them on a real API server."""

from __future__ import annotations

import json

from grpo_operator.settings import OperatorSettings

from tests.helm.chart import (
    FULLNAME,
    MONITORING_APIS,
    NAMESPACE,
    VALUES_DIR,
    Doc,
    env_of,
    find,
    one,
    render,
    render_text,
)

POLICIES = ("platform-limits", "trainer-status", "job-labels")
OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:{FULLNAME}"


def test_admission_policies_are_bound_cluster_wide_and_exempt_the_operator(defaults: list[Doc]) -> None:
    for suffix in POLICIES:
        policy = one(defaults, "ValidatingAdmissionPolicy", f"{FULLNAME}-{suffix}")
        assert policy["spec"]["failurePolicy"] == "Fail"
        binding = one(defaults, "ValidatingAdmissionPolicyBinding", f"{FULLNAME}-{suffix}")
        assert binding["spec"]["policyName"] == f"{FULLNAME}-{suffix}"
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert "matchResources" not in binding["spec"], "watch.allNamespaces: every namespace"
    for suffix in ("trainer-status", "job-labels"):
        policy = one(defaults, "ValidatingAdmissionPolicy", f"{FULLNAME}-{suffix}")
        conditions = " ".join(c["expression"] for c in policy["spec"]["matchConditions"])
        assert f"!= '{OPERATOR_USER}'" in conditions, conditions
    labels = one(defaults, "ValidatingAdmissionPolicy", f"{FULLNAME}-job-labels")
    controller = next(v for v in labels["spec"]["variables"] if v["name"] == "controller")
    assert "'system:serviceaccount:kube-system:replicaset-controller'" in controller["expression"]


def test_admission_policies_cover_only_the_watched_namespaces() -> None:
    docs = render([VALUES_DIR / "namespaced.yaml"], api_versions=MONITORING_APIS)
    for suffix in POLICIES:
        binding = one(docs, "ValidatingAdmissionPolicyBinding", f"{FULLNAME}-{suffix}")
        assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
        ]


def test_admission_policies_can_be_left_out() -> None:
    docs = render(sets={"admissionPolicies.enabled": "false"})
    assert not find(docs, "ValidatingAdmissionPolicy") and not find(docs, "ValidatingAdmissionPolicyBinding")


def test_platform_limits_in_the_policy_are_the_values_the_operator_gets() -> None:
    docs = render([VALUES_DIR / "platform-policy.yaml"])
    policy = one(docs, "ValidatingAdmissionPolicy", f"{FULLNAME}-platform-limits")
    # The limits are CEL literals: JSON lists, booleans and integers read as the same values in CEL.
    literals = {v["name"]: json.loads(v["expression"]) for v in policy["spec"]["variables"][:9]}
    settings = OperatorSettings.from_env(env_of(one(docs, "Deployment")))
    assert literals == {
        "prefixes": list(settings.allowed_image_prefixes),
        "priorityClasses": list(settings.allowed_priority_classes),
        "tolerationKeys": list(settings.allowed_toleration_keys),
        "nodeSelectors": list(settings.allowed_node_selectors),
        "claimsAllowed": settings.allow_existing_claims,
        "claimNames": list(settings.allowed_existing_claims),
        "queues": list(settings.allowed_queue_names),
        # With a default queue, every job ends up in a queue: the policy need not ask for one.
        "queueRequired": settings.require_queue_name and not settings.default_queue_name,
        "maxGpus": settings.max_gpus_per_job,
    }
    assert settings.max_gpus_per_job == 16 and settings.default_queue_name == "team-default"
    assert literals["prefixes"] == ["registry.example.com/", "ghcr.io/grpo-operator/", "vllm/vllm-openai:"]
    # What counts as a GPU: the operator's names, split into exact names and "*" prefixes for CEL.
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    names = json.loads(variables["gpuNames"])
    prefixes = json.loads(variables["gpuPrefixes"])
    assert set(names) == {
        settings.gpu_resource,
        *(n for n in settings.gpu_resource_names if not n.endswith("*")),
    }
    assert prefixes == [n[:-1] for n in settings.gpu_resource_names if n.endswith("*")] == ["nvidia.com/mig-"]


def test_the_policy_judges_exactly_the_claims_the_operator_judges(defaults: list[Doc]) -> None:
    """The policy's list of mounted claims is the operator's CLAIM_FIELDS in CEL: a claim field added to
    the operator's list without the policy (or the other way round) fails here."""
    from grpo_operator.reconcile.platform_policy import claims_cel

    policy = one(defaults, "ValidatingAdmissionPolicy", f"{FULLNAME}-platform-limits")
    claims = next(v for v in policy["spec"]["variables"] if v["name"] == "claims")
    assert claims["expression"] == claims_cel()


def test_a_default_queue_outside_the_allowed_queues_fails_the_install() -> None:
    proc = render_text(
        sets={"platformPolicy.queue.default": "q", "platformPolicy.queue.allowed[0]": "r"}, check=False
    )
    assert proc.returncode != 0
    assert 'platformPolicy.queue.default "q" is not in platformPolicy.queue.allowed' in proc.stderr


def test_trainer_status_policy_freezes_exactly_the_operators_status_fields(defaults: list[Doc]) -> None:
    """Each status field is either the operator's (frozen for the trainer) or the trainer's; a field
    added to the status model without a decision here fails this test."""
    from grpo_operator.api.status import GRPOJobStatus
    from grpo_operator.reconcile import OWNED_STATUS_FIELDS
    from grpo_trainer.status import OWNED_FIELDS as TRAINER_FIELDS

    policy = one(defaults, "ValidatingAdmissionPolicy", f"{FULLNAME}-trainer-status")
    frozen = {
        message.split("not status.")[1].split(" ")[0]
        for v in policy["spec"]["validations"]
        if "not status." in (message := v.get("message", ""))
    }
    every_field = {f.alias or name for name, f in GRPOJobStatus.model_fields.items()}
    assert frozen == set(OWNED_STATUS_FIELDS)
    assert frozen | set(TRAINER_FIELDS) == every_field and not frozen & set(TRAINER_FIELDS)
