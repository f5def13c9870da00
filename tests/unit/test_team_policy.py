"""Per-team policy (issue 48, item 1): a job in a team's namespace is built and judged with the team's values
in place of the global settings, and the messages name the team's Helm value; everything else keeps the
global settings; bad teams stop the operator at start with what to fix."""

from __future__ import annotations

from typing import Any

import pytest
from grpo_operator.settings import OperatorSettings, SettingsError

from tests.unit.reconcile_world import World, job_object

pytestmark = pytest.mark.unit

RESEARCH: dict[str, Any] = {
    "name": "research",
    "namespaces": ["ns", "ns-dev"],
    "maxGpusPerJob": 2,
    "queue": {"default": "research", "allowed": ["research"]},
    "images": {"trainer": "registry.example.com/r/trainer:1", "generation": "registry.example.com/r/vllm:1"},
    "allowedImagePrefixes": ["registry.example.com/r/", "ghcr.io/grpo-operator/metric-math"],
    "gpuNodeSelector": {"pool": "research"},
    "budget": {"default": {"gpuHours": 5}},
}
SETTINGS = OperatorSettings(max_gpus_per_job=64, allowed_queue_names=("shared",), team_policies=(RESEARCH,))


def test_a_team_namespace_gets_the_teams_values_and_the_others_the_global_ones() -> None:
    team = SETTINGS.for_namespace("ns-dev")
    assert (team.max_gpus_per_job, team.default_queue_name, team.allowed_queue_names) == (
        2,
        "research",
        ("research",),
    )
    assert team.trainer_image == "registry.example.com/r/trainer:1"
    assert dict(team.gpu_node_selector) == {"pool": "research"}
    assert team.limit_name("maxGpusPerJob") == "teams.research.maxGpusPerJob"
    assert team.limit_name("allowedTolerationKeys") == "platformPolicy.allowedTolerationKeys", (
        "not the team's"
    )
    budget = team.namespace_budget("ns-dev")
    assert budget is not None and budget.default is not None and budget.default.gpu_hours == 5
    other = SETTINGS.for_namespace("elsewhere")
    assert other is SETTINGS and other.max_gpus_per_job == 64 and other.namespace_budget("elsewhere") is None


def test_the_teams_job_runs_its_images_on_its_nodes_and_is_held_to_its_limits() -> None:
    world = World(job_object(), settings=SETTINGS)  # namespace ns: team research
    world.step()
    status = world.status()
    assert status["phase"] == "Pending" and world.condition("PlatformPolicy")["status"] == "False"
    # 2 trainer GPUs and 1 vLLM GPU, over the team's 2; the queue is the team's default, allowed.
    assert "platform limit teams.research.maxGpusPerJob: 2" in status["message"]
    assert "queue" not in status["message"]

    fits = World(job_object(trainer={"nodes": 1, "gpusPerNode": 1}), settings=SETTINGS)
    fits.settle()
    pods = [o for (kind, _), o in fits.objects.items() if kind == "Pod"]
    assert pods, fits.status()
    for pod in pods:
        image = pod["spec"]["containers"][0]["image"]
        assert image.startswith("registry.example.com/r/"), image
        assert pod["spec"]["nodeSelector"]["pool"] == "research"


@pytest.mark.parametrize(
    ("teams", "words"),
    [
        (
            (RESEARCH, {"name": "other", "namespaces": ["ns"]}),
            "namespace ns is in team research and in team other",
        ),
        (({"name": "x", "namespaces": ["a"], "maxGpusPerJob": -1},), "maxGpusPerJob"),
        (({"name": "x", "namespaces": ["a"], "maxGpus": 1},), "maxGpus"),
        (({"name": "x", "namespaces": ["*"]},), "name each namespace"),
        (
            (
                {
                    "name": "x",
                    "namespaces": ["a"],
                    "images": {"trainer": "docker.io/x:1"},
                    "allowedImagePrefixes": ["r/"],
                },
            ),
            "team x (Helm teams): trainer_image 'docker.io/x:1'",
        ),
        (
            ({"name": "x", "namespaces": ["a"], "queue": {"default": "q", "allowed": ["p"]}},),
            "team x (Helm teams): default_queue_name 'q' is not in allowed_queue_names ['p']: add it there "
            "(Helm: teams.x.queue.allowed)",
        ),
    ],
)
def test_a_bad_team_stops_the_operator_at_start_with_what_to_fix(teams: tuple[Any, ...], words: str) -> None:
    with pytest.raises(SettingsError) as caught:
        OperatorSettings(team_policies=teams)
    assert words in str(caught.value), str(caught.value)
