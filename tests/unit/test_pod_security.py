"""Pod Security of every pod the operator creates, and how refused children show in the job's status.

The pod checks below are those of the Kubernetes "restricted" Pod Security Standard (the policies of
k8s.io/pod-security-admission, level restricted, version latest) that the builders could violate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from grpo_operator.builders import gang_pods, job_from_object, metric_workload
from grpo_operator.builders.security import HOME_DIR, TMP_DIR, secure_pod_spec
from grpo_operator.reconcile import Observed, Plan, Refusal
from grpo_operator.settings import OperatorSettings, SettingsError

from tests.unit.reconcile_world import World, events, job_object

RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
QUOTA_REFUSAL = (
    'pods "math-trainer-1-0" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=2, '
    "used: requests.nvidia.com/gpu=15, limited: requests.nvidia.com/gpu=16"
)
PSA_REFUSAL = (
    'pods "math-metric-7d9f8c6b5-x2k4q" is forbidden: violates PodSecurity "restricted:latest": '
    'runAsNonRoot != true (pod or container "metric" must set securityContext.runAsNonRoot=true)'
)


def pod_specs(job_obj: dict[str, Any], settings: OperatorSettings) -> dict[str, dict[str, Any]]:
    """Every pod spec the operator creates for a job, by pod (or Deployment) name."""
    job = job_from_object(job_obj)
    out = {p["metadata"]["name"]: p["spec"] for p in gang_pods(job, settings, 1, "")}
    for deployment in metric_workload(job, settings):
        out[deployment["metadata"]["name"]] = deployment["spec"]["template"]["spec"]
    return out


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """What the restricted Pod Security Standard would refuse in a pod spec ([] when nothing)."""
    problems: list[str] = []
    pod_ctx = spec.get("securityContext") or {}
    containers = [*spec.get("initContainers", []), *spec.get("containers", [])]
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            problems.append(key)
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            problems.append(f"volume {volume['name']} of type {sorted(kinds)}")
    if pod_ctx.get("runAsUser") == 0:
        problems.append("pod runAsUser 0")
    for c in containers:
        ctx = c.get("securityContext") or {}
        name = c["name"]
        if ctx.get("privileged"):
            problems.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation != false")
        caps = ctx.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"{name}: capabilities not dropping ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds capabilities")
        if not (
            ctx.get("runAsNonRoot") is True
            or (pod_ctx.get("runAsNonRoot") is True and "runAsNonRoot" not in ctx)
        ):
            problems.append(f"{name}: runAsNonRoot != true")
        if ctx.get("runAsUser") == 0:
            problems.append(f"{name}: runAsUser 0")
        seccomp = (ctx.get("seccompProfile") or pod_ctx.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile {seccomp}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            problems.append(f"{name}: hostPort")
    return problems


VARIANTS = {
    "shared RWX volume": job_object(),
    "RWO volume, vLLM on its own cache": job_object(
        checkpoints={"volume": {"accessMode": "ReadWriteOnce"}}, trainer={"nodes": 1}
    ),
    "existing claim, one trainer node": job_object(
        checkpoints={"volume": {"existingClaim": "team-ckpt"}}, trainer={"nodes": 1}
    ),
    # The Broadcast group needs ports between the pods, never host ports, host network or capabilities.
    "Broadcast to two vLLM replicas": job_object(generation={"replicas": 2}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_pod_meets_the_restricted_standard_by_default(variant: str) -> None:
    specs = pod_specs(VARIANTS[variant], OperatorSettings())
    assert {name.split("-")[1] for name in specs} == {"gen", "trainer", "metric"}
    for name, spec in specs.items():
        assert restricted_violations(spec) == [], name
        assert spec["securityContext"]["runAsUser"] == 65532
        assert spec["securityContext"]["runAsGroup"] == 65532


def test_the_checkpoint_volume_is_writable_by_the_pods_group() -> None:
    settings = OperatorSettings(pod_run_as_user=1001, pod_run_as_group=1002, pod_fs_group=2000)
    for name, spec in pod_specs(job_object(), settings).items():
        ctx = spec["securityContext"]
        assert (ctx["runAsUser"], ctx["runAsGroup"], ctx["fsGroup"]) == (1001, 1002, 2000), name
        # No recursive chown of a volume full of checkpoints at every pod start.
        assert ctx["fsGroupChangePolicy"] == "OnRootMismatch"


def test_every_container_has_a_writable_home_and_tmp_and_a_user_name() -> None:
    """Images run as a uid they were not built for (stock vLLM runs as root) need somewhere to write
    their caches, and getpass.getuser() (called by some torch versions) needs USER for a uid missing from
    /etc/passwd."""
    for name, spec in pod_specs(job_object(), OperatorSettings()).items():
        volumes = {v["name"]: v for v in spec["volumes"]}
        for container in spec["containers"]:
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["HOME"] == HOME_DIR and env["USER"], name
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            for path in (HOME_DIR, TMP_DIR):
                assert "emptyDir" in volumes[mounts[path]], f"{name}: {path} is not an emptyDir"


def test_a_users_own_home_wins() -> None:
    job = job_object(
        trainer={"env": [{"name": "HOME", "value": "/workspace/home"}]},
        metric={"env": [{"name": "HOME", "value": "/srv"}]},
    )
    specs = pod_specs(job, OperatorSettings())
    for name, spec in specs.items():
        homes = [e["value"] for e in spec["containers"][0]["env"] if e["name"] == "HOME"]
        expected = {"trainer": "/workspace/home", "metric": "/srv", "gen": HOME_DIR}[name.split("-")[1]]
        assert homes == [expected], name


def test_init_containers_get_the_same_context() -> None:
    spec: dict[str, Any] = {
        "initContainers": [{"name": "fetch", "image": "busybox"}],
        "containers": [{"name": "main", "image": "busybox"}],
    }
    secured = secure_pod_spec(spec, OperatorSettings())
    assert restricted_violations(secured) == []
    assert secured["initContainers"][0]["securityContext"]["allowPrivilegeEscalation"] is False


def test_baseline_runs_images_as_their_own_user_and_is_not_restricted() -> None:
    settings = OperatorSettings.from_env({"GRPO_OPERATOR_POD_SECURITY": "baseline"})
    for name, spec in pod_specs(job_object(), settings).items():
        ctx = spec["securityContext"]
        assert "runAsUser" not in ctx and "runAsNonRoot" not in ctx, name
        assert ctx["fsGroup"] == 65532 and ctx["seccompProfile"] == {"type": "RuntimeDefault"}
        # Everything but the non-root requirement still holds: that is what a restricted namespace refuses.
        assert {p.split(": ")[-1] for p in restricted_violations(spec)} == {"runAsNonRoot != true"}


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"GRPO_OPERATOR_POD_SECURITY": "unconfined"}, "restricted, baseline, privileged"),
        ({"GRPO_OPERATOR_POD_RUN_AS_USER": "0"}, "non-root id"),
        ({"GRPO_OPERATOR_POD_FS_GROUP": "-1"}, "GRPO_OPERATOR_POD_FS_GROUP"),
    ],
)
def test_unusable_pod_security_settings_are_refused_at_start_up(env: dict[str, str], words: str) -> None:
    with pytest.raises(SettingsError, match=words):
        OperatorSettings.from_env(env)


# --- refusals in the job's status ---------------------------------------------------------------------------


@dataclass
class AdmittingWorld(World):
    """A World whose API server refuses some pod creates, as a ResourceQuota or Pod Security would: the
    refused pods are not created, and the refusals reach the next reconcile, as the controller passes
    them on."""

    refuse: Callable[[dict[str, Any]], str | None] = lambda manifest: None
    refusals: tuple[Refusal, ...] = ()

    def observed(self) -> Observed:
        return dataclasses.replace(super().observed(), refusals=self.refusals)

    def apply(
        self, plan: Plan, *, status: bool = True, deletes: bool = True, creates: int | None = None
    ) -> None:
        refused = [(m, self.refuse(m)) for m in plan.creates]
        self.refusals = tuple(
            Refusal(m["kind"], m["metadata"]["name"], 403, why) for m, why in refused if why
        )
        admitted = dataclasses.replace(plan, creates=[m for m, why in refused if not why])
        super().apply(admitted, status=status, deletes=deletes, creates=creates)


def refuse_trainer_rank_0(manifest: dict[str, Any]) -> str | None:
    return QUOTA_REFUSAL if manifest["metadata"]["name"] == "math-trainer-1-0" else None


def test_refused_gang_pods_make_the_job_pending_with_the_refusal_in_its_own_words() -> None:
    world = AdmittingWorld(job_object(), refuse=refuse_trainer_rank_0)
    world.step()  # creates the gang; rank 0 is refused
    world.step()  # the refusal is now observed
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Pending", "ChildRejected")
    assert QUOTA_REFUSAL in status["message"] and "Pod math-trainer-1-0" in status["message"]
    scheduled = world.condition("Scheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "ChildRejected")
    assert QUOTA_REFUSAL in scheduled["message"]
    assert QUOTA_REFUSAL in world.condition("Running")["message"]
    # The operator keeps asking (the refused pod is in every plan) and says the same thing each time.
    plan = world.step()
    assert [m["metadata"]["name"] for m in plan.creates] == ["math-trainer-1-0"]
    assert plan.status is None

    # The quota is raised: the pod is created and the job goes on to run.
    world.refuse = lambda manifest: None
    world.step()
    world.step()
    assert world.status()["reason"] != "ChildRejected"
    world.run_all()
    world.settle()
    assert world.status()["phase"] == "Running"
    assert world.condition("Scheduled")["reason"] == "AllPodsScheduled"


def test_refusals_of_another_attempts_pods_do_not_count() -> None:
    world = AdmittingWorld(job_object())
    world.settle()
    world.refusals = (Refusal("Pod", "math-trainer-0-0", 403, QUOTA_REFUSAL),)
    world.step()
    assert world.status()["reason"] != "ChildRejected"


def test_a_refused_metric_replicaset_shows_in_metric_ready_and_one_warning() -> None:
    world = World(job_object())
    world.settle()
    world.objects[("Deployment", "math-metric")]["status"] = {
        "conditions": [
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetCreated"},
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": PSA_REFUSAL},
        ]
    }
    plan = world.step()
    cond = world.condition("MetricReady")
    assert (cond["status"], cond["reason"]) == ("False", "FailedCreate")
    assert PSA_REFUSAL in cond["message"] and "math-metric" in cond["message"]
    warnings = [e for e in plan.events if e.reason == "MetricNotReady"]
    assert len(warnings) == 1 and PSA_REFUSAL in warnings[0].message
    assert ("Warning", "MetricNotReady") not in events(world.step())


def test_the_message_does_not_depend_on_the_order_of_concurrent_refusals() -> None:
    """Pods are created concurrently and refused in any order; the status must not flap with it."""
    refusals = [
        Refusal("Pod", name, 403, f'pods "{name}" is forbidden: exceeded quota: gpus')
        for name in ("math-trainer-1-1", "math-gen-1-0", "math-trainer-1-0")
    ]
    messages = set()
    for order in (refusals, refusals[::-1]):
        world = AdmittingWorld(job_object(), refuse=lambda manifest: "exceeded quota: gpus")
        world.step()
        world.refusals = tuple(order)
        world.step()
        messages.add(world.status()["message"])
    (message,) = messages
    assert message.startswith("the API server refused Pod math-gen-1-0 (2 more refused): ")


def test_a_refused_vllm_replacement_is_not_retried_but_restarts_the_gang() -> None:
    """The quota refuses the replacement of a failed vLLM pod: the operator does not create it again on every
    pass (with a GenerationReplaced event each time); the gang restarts, counted, and the new gang's pods
    wait with the refusal's words."""
    world = AdmittingWorld(job_object())
    world.settle()
    world.run_all()
    world.settle()
    world.refuse = lambda m: QUOTA_REFUSAL if m["metadata"]["name"] == "math-gen-1-1" else None
    world.terminate("math-gen-1-0", 1, "boom", phase="Failed")
    first = world.step()
    assert ("Warning", "GenerationReplaced") in events(first)
    second = world.step()
    assert ("Warning", "GenerationReplaced") not in events(second)
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Restarting", "GenerationFailed")
    assert status["restarts"] == 1
