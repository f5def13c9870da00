"""Reconcile's restart decisions follow the restart-policy table, row by row, and the docs show the table.

Every row of ``RULES`` has a scenario here that makes a real reconcile meet its trigger; the test then
checks that the job ends up as the row says: the reason, restarted or failed, counted or not. A row
added without a scenario fails ``test_every_row_has_a_scenario``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import pytest
from grpo_operator.reconcile import Plan, reconcile
from grpo_operator.reconcile.conditions import format_time
from grpo_operator.reconcile.restart_policy import (
    BACKOFF_LIMIT_EXCEEDED,
    CANCELLED_BY_CLIENT,
    CHECKPOINT_MISMATCH,
    CHILD_DRIFTED,
    DEADLINE_EXCEEDED,
    DEFAULT_PERMANENT_EXIT_CODES,
    DRIVER_TOO_OLD,
    EVICTED,
    EVICTED_BY_KUEUE,
    GENERATION_FAILED,
    GENERATION_REPLACED,
    GENERATION_REPLACEMENTS_PER_ATTEMPT,
    GENERATION_STARTUP_TIMEOUT,
    MEMORY_PLAN_EXCEEDED,
    NODE_LOST,
    NODE_SHUTDOWN,
    NON_FINITE_TRAINING,
    NOT_LEARNING,
    OOM_KILLED,
    OTHER_DISRUPTION,
    OUT_OF_MEMORY,
    PERMANENT_FAILURE,
    POD_DELETED,
    PREEMPTED,
    PROGRESS_DEADLINE_EXCEEDED,
    RULES,
    SPEC_CHANGED,
    STARTUP_DEADLINE_EXCEEDED,
    TRAINER_FAILED,
    RestartRule,
    Trigger,
)
from grpo_operator.settings import OperatorSettings

from hack import restart_table
from hack.generated_section import MarkersMissing
from tests.unit.reconcile_world import SETTINGS, World, events, job_object, running_world

TRAINER = "math-trainer-1-0"
GEN = "math-gen-1-0"


def _exit(code: int) -> Callable[[], tuple[World, Plan]]:
    def scenario() -> tuple[World, Plan]:
        world = running_world()
        world.terminate(TRAINER, code, f"the trainer exited {code}")
        return world, world.step()

    return scenario


def _oom_killed() -> tuple[World, Plan]:
    world = running_world()
    world.terminate(TRAINER, 137, "", reason="OOMKilled")
    return world, world.step()


def _driver_too_old() -> tuple[World, Plan]:
    world = running_world()
    world.terminate(
        TRAINER,
        128,
        "error running prestart hook #0: exit status 1, stdout: , stderr: nvidia-container-cli: requirement "
        "error: unsatisfied condition: cuda>=13.0, please update your driver to a newer version, or use an "
        "earlier cuda container: unknown",
        reason="StartError",
    )
    return world, world.step()


def _generation_replaced() -> tuple[World, Plan]:
    world = running_world()
    world.terminate(GEN, 1, "vLLM crashed", phase="Failed")
    return world, world.step()


def _generation_failed() -> tuple[World, Plan]:
    """The vLLM pod fails once more after the attempt's last allowed replacement."""
    world = running_world()
    for n in range(GENERATION_REPLACEMENTS_PER_ATTEMPT):
        world.terminate(f"math-gen-1-{n}", 1, "vLLM crashed", phase="Failed")
        world.step()
        world.run_all()
        world.settle()
    world.terminate(f"math-gen-1-{GENERATION_REPLACEMENTS_PER_ATTEMPT}", 1, "vLLM crashed", phase="Failed")
    return world, world.step()


def _generation_startup_timeout() -> tuple[World, Plan]:
    world = World(job_object(generation={"startupTimeoutSeconds": 600}))
    world.settle()
    world.run_all()
    pod = world.pod(GEN)
    pod["status"]["conditions"] = [c for c in pod["status"]["conditions"] if c["type"] != "Ready"]
    world.step()
    world.advance(601)
    return world, world.step()


def _stalled() -> tuple[World, Plan]:
    world = running_world(runPolicy={"progressDeadlineSeconds": 900})
    world.advance(901)
    return world, world.step()


def _disruption_condition(reason: str | None) -> Callable[[], tuple[World, Plan]]:
    def scenario() -> tuple[World, Plan]:
        world = running_world()
        pod = world.pod("math-trainer-1-1")
        pod["metadata"]["deletionTimestamp"] = format_time(world.now)
        condition = {"type": "DisruptionTarget", "status": "True"}
        if reason is not None:
            condition["reason"] = reason
        pod["status"]["conditions"].append(condition)
        return world, world.step()

    return scenario


def _pod_status_reason(reason: str) -> Callable[[], tuple[World, Plan]]:
    def scenario() -> tuple[World, Plan]:
        world = running_world()
        world.pod(TRAINER)["status"].update({"phase": "Failed", "reason": reason})
        return world, world.step()

    return scenario


def _kueue_stops(message: str) -> Callable[[], tuple[World, Plan]]:
    def scenario() -> tuple[World, Plan]:
        world = running_world()
        for pod in world.pods():
            pod["status"]["conditions"].append(
                {
                    "type": "TerminationTarget",
                    "status": "True",
                    "reason": "WorkloadEvicted",
                    "message": message,
                }
            )
            pod["metadata"]["deletionTimestamp"] = format_time(world.now)
        return world, world.step()

    return scenario


def _node_gone() -> tuple[World, Plan]:
    world = running_world()
    node = world.pod(TRAINER)["spec"]["nodeName"]
    assert world.nodes is not None
    world.nodes = world.nodes - {node}
    return world, world.step()


def _pod_vanished() -> tuple[World, Plan]:
    world = running_world()
    del world.objects[("Pod", "math-trainer-1-1")]
    return world, world.step()


def _spec_changed() -> tuple[World, Plan]:
    world = running_world()
    world.job["spec"]["generation"] = {"image": "vllm/vllm-openai:v0.30.0"}
    world.job["metadata"]["generation"] = 2
    return world, world.step()


def _image_set_by_hand() -> tuple[World, Plan]:
    world = running_world()
    world.pod(TRAINER)["spec"]["containers"][0]["image"] = "registry.example/theirs:1"
    return world, world.step()


def _never_scheduled() -> tuple[World, Plan]:
    world = World(job_object(runPolicy={"startupDeadlineSeconds": 600}))
    world.step()
    world.pod("math-trainer-1-1")["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}
    ]
    world.step()
    world.advance(601)
    return world, world.step()


def _active_deadline() -> tuple[World, Plan]:
    world = running_world(runPolicy={"activeDeadlineSeconds": 3600})
    world.advance(3601)
    return world, world.step()


def _backoff_spent() -> tuple[World, Plan]:
    world = running_world(runPolicy={"backoffLimit": 0})
    world.terminate(TRAINER, 1, "boom")
    return world, world.step()


def _exit_scenario(rule: RestartRule) -> Callable[[], tuple[World, Plan]]:
    assert rule.exit_code is not None
    return _exit(rule.exit_code)


SCENARIOS: dict[str, Callable[[], tuple[World, Plan]]] = {
    PERMANENT_FAILURE.reason: _exit_scenario(PERMANENT_FAILURE),
    CHECKPOINT_MISMATCH.reason: _exit_scenario(CHECKPOINT_MISMATCH),
    NON_FINITE_TRAINING.reason: _exit_scenario(NON_FINITE_TRAINING),
    OUT_OF_MEMORY.reason: _exit_scenario(OUT_OF_MEMORY),
    MEMORY_PLAN_EXCEEDED.reason: _exit_scenario(MEMORY_PLAN_EXCEEDED),
    NOT_LEARNING.reason: _exit_scenario(NOT_LEARNING),
    CANCELLED_BY_CLIENT.reason: _exit_scenario(CANCELLED_BY_CLIENT),
    TRAINER_FAILED.reason: _exit(1),
    OOM_KILLED.reason: _oom_killed,
    DRIVER_TOO_OLD.reason: _driver_too_old,
    GENERATION_REPLACED.reason: _generation_replaced,
    GENERATION_FAILED.reason: _generation_failed,
    GENERATION_STARTUP_TIMEOUT.reason: _generation_startup_timeout,
    PROGRESS_DEADLINE_EXCEEDED.reason: _stalled,
    EVICTED.reason: _disruption_condition("EvictionByEvictionAPI"),
    PREEMPTED.reason: _kueue_stops("Preempted to accommodate a workload of higher priority"),
    EVICTED_BY_KUEUE.reason: _kueue_stops("Evicted by PodsReadyTimeout"),
    NODE_LOST.reason: _node_gone,
    NODE_SHUTDOWN.reason: _pod_status_reason("Shutdown"),
    POD_DELETED.reason: _pod_vanished,
    OTHER_DISRUPTION.reason: _disruption_condition(None),
    SPEC_CHANGED.reason: _spec_changed,
    CHILD_DRIFTED.reason: _image_set_by_hand,
    STARTUP_DEADLINE_EXCEEDED.reason: _never_scheduled,
    DEADLINE_EXCEEDED.reason: _active_deadline,
    BACKOFF_LIMIT_EXCEEDED.reason: _backoff_spent,
}


def assert_follows(rule: RestartRule, world: World, plan: Plan) -> None:
    status = world.status()
    assert status["reason"] == rule.reason, status.get("message")
    if not rule.replaces_gang:
        assert status["phase"] == "Running"
        assert plan.restart is None and plan.deletes == []
        assert status.get("restarts", 0) == 0 and status["trainerAttempt"] == 1
        assert "not counted against backoffLimit" in status["message"]
    elif rule.permanent:
        assert status["phase"] == "Failed"
        assert plan.restart is None and status.get("restarts", 0) == 0
    else:
        assert status["phase"] == "Restarting"
        assert plan.restart is not None
        assert (plan.restart.reason, plan.restart.counted) == (rule.reason, rule.counted)
        assert status["restarts"] == (1 if rule.counted else 0)
        assert status["trainerAttempt"] == 2
        budget = "restart 1/" if rule.counted else "not counted against backoffLimit"
        assert budget in status["message"]


def test_every_row_has_a_scenario() -> None:
    reasons = [rule.reason for rule in RULES]
    assert len(reasons) == len(set(reasons)), "each reason has one row"
    assert set(SCENARIOS) == set(reasons)


@pytest.mark.parametrize("rule", RULES, ids=[rule.reason for rule in RULES])
def test_reconcile_follows_the_row(rule: RestartRule) -> None:
    world, plan = SCENARIOS[rule.reason]()
    assert_follows(rule, world, plan)
    if rule.trigger in (Trigger.EXIT_CODE, Trigger.POD_FAILURE):
        assert (("Warning", rule.reason) in events(plan)) == (rule.event is not None)
    if rule.permanent and rule.trigger is Trigger.EXIT_CODE:
        assert f"exit code {rule.exit_code} means {rule.meaning}" in world.status()["message"]


DISRUPTION_CAUSES = [
    (kind, name, rule)
    for rule in RULES
    for kind, names in (("condition", rule.condition_reasons), ("status", rule.status_reasons))
    for name in names
]


@pytest.mark.parametrize(
    ("kind", "name", "rule"), DISRUPTION_CAUSES, ids=[f"{k}-{n}" for k, n, _ in DISRUPTION_CAUSES]
)
def test_each_listed_disruption_cause_gives_its_rows_reason(kind: str, name: str, rule: RestartRule) -> None:
    scenario = _disruption_condition(name) if kind == "condition" else _pod_status_reason(name)
    world, plan = scenario()
    assert_follows(rule, world, plan)


def test_an_unlisted_disruption_reason_is_reported_under_its_own_name_uncounted() -> None:
    world, plan = _disruption_condition("DeletionByNewController")()
    assert_follows(dataclasses.replace(OTHER_DISRUPTION, reason="DeletionByNewController"), world, plan)


def _decide_exit(code: int, permanent: tuple[int, ...]) -> tuple[World, Plan]:
    world = running_world()
    world.terminate(TRAINER, code, f"the trainer exited {code}")
    settings = OperatorSettings(permanent_exit_codes=permanent)
    plan = reconcile(copy.deepcopy(world.job), world.observed(), world.now, settings)
    world.apply(plan)
    return world, plan


@pytest.mark.parametrize(
    ("code", "permanent", "rule"),
    [
        (6, (2, 4), dataclasses.replace(OUT_OF_MEMORY, permanent=False)),
        (4, (2, 6), dataclasses.replace(CHECKPOINT_MISMATCH, permanent=False)),
        (2, (4, 6), TRAINER_FAILED),
        (3, (2, 3, 4, 6), dataclasses.replace(PERMANENT_FAILURE, exit_code=3)),
        (5, (2, 4, 5, 6), dataclasses.replace(NON_FINITE_TRAINING, permanent=True)),
    ],
    ids=[
        "6-made-restartable",
        "4-made-restartable",
        "2-made-restartable",
        "3-made-permanent",
        "5-made-permanent",
    ],
)
def test_the_operator_setting_decides_which_exit_codes_are_permanent(
    code: int, permanent: tuple[int, ...], rule: RestartRule
) -> None:
    world, plan = _decide_exit(code, permanent)
    assert_follows(rule, world, plan)
    if rule.permanent:
        assert f"exit code {code} means {rule.meaning}" in world.status()["message"]


def test_the_settings_default_permanent_exit_codes_are_the_tables() -> None:
    assert SETTINGS.permanent_exit_codes == DEFAULT_PERMANENT_EXIT_CODES
    assert DEFAULT_PERMANENT_EXIT_CODES == (2, 4, 6, 7, 8, 9)


def test_the_operations_doc_shows_the_table_as_it_is() -> None:
    text = restart_table.OUTPUT.read_text(encoding="utf-8")
    assert restart_table.render_section() in text, "docs/operations.md is stale: run `make generate`"
    for rule in RULES:
        assert f"| `{rule.reason}` |" in text


def test_a_doc_without_the_markers_is_refused_with_what_to_do() -> None:
    with pytest.raises(MarkersMissing, match="put them back"):
        restart_table.render("# Operating GRPOJobs\n\nno table here\n")


def test_the_operations_guide_states_the_default_permanent_exit_codes() -> None:
    from pathlib import Path

    table = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    codes = ",".join(str(c) for c in DEFAULT_PERMANENT_EXIT_CODES)
    assert f"| `GRPO_OPERATOR_PERMANENT_EXIT_CODES` | `{codes}` |" in table
