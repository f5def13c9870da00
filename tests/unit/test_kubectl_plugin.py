"""The pure parts of `kubectl grpo`: parsing what the trainer writes, choosing samples, the reader pod's
manifest, and the text a user reads. The plugin against a cluster is tested in
tests/integration/test_kubectl_plugin.py."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from grpo_operator.kubectl_plugin import cli, data, render
from grpo_operator.kubectl_plugin.volume import HostPathTransport, reader_pod, running_trainer

REPO = Path(__file__).resolve().parents[2]


def test_the_package_installs_the_kubectl_grpo_executable() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-grpo"] == "grpo_operator.kubectl_plugin.cli:main"


def test_sparkline_scales_between_min_and_max_and_fits_the_width() -> None:
    assert render.sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert render.sparkline([0.2, None, 0.4]) == "▁ █"
    assert render.sparkline([0.0, 0.0]) == "▁▁"  # flat, e.g. no format failures: not a middle bar
    long = render.sparkline([float(i) for i in range(500)], width=40)
    assert len(long) <= 40 and long[0] == "▁" and long[-1] == "█"
    assert render.sparkline([]) == ""


def test_a_half_written_last_line_is_left_for_the_next_read() -> None:
    chunk = '{"step": 1}\n{"step": 2}\n{"ste'
    head, used = data.complete_lines(chunk)
    assert data.parse_jsonl(head) == [{"step": 1}, {"step": 2}]
    assert used == len('{"step": 1}\n{"step": 2}\n')
    assert data.parse_jsonl(chunk) == [{"step": 1}, {"step": 2}]


def sample(step: int, prompt: str, reward: float | None, split: str = "train") -> dict[str, Any]:
    return {"step": step, "split": split, "prompt": prompt, "completion": f"c{reward}", "reward": reward}


SAMPLES = [
    sample(1, "p1", 0.1),
    sample(1, "p1", 0.9),
    sample(2, "p2", 0.4),
    sample(2, "p2", None),
    sample(2, "p2", -1.0),
    sample(2, "v", 0.7, "validation"),
]


def test_samples_default_to_the_newest_step_of_the_split() -> None:
    chosen = data.select_samples(SAMPLES, split="train", step=None, order=None, limit=None)
    assert [s["reward"] for s in chosen] == [0.4, None, -1.0]
    val = data.select_samples(SAMPLES, split="validation", step=None, order=None, limit=None)
    assert [s["prompt"] for s in val] == ["v"]


def test_best_and_worst_rank_every_step_unless_one_is_given_and_keep_unscored_last() -> None:
    best = data.select_samples(SAMPLES, split="train", step=None, order="best", limit=2)
    assert [s["reward"] for s in best] == [0.9, 0.4]
    worst = data.select_samples(SAMPLES, split="train", step=2, order="worst", limit=None)
    assert [s["reward"] for s in worst] == [-1.0, 0.4, None]


def test_checkpoints_list_step_dirs_in_order_and_mark_the_manifests() -> None:
    found = data.checkpoints(["step-10", ".partial", "step-5", "latest.json", "step-x"], {"step": 10})
    assert [(c.step, c.latest, c.path) for c in found] == [
        (5, False, "/workspace/checkpoints/step-5"),
        (10, True, "/workspace/checkpoints/step-10"),
    ]


def test_samples_text_groups_completions_under_their_prompt_with_rewards() -> None:
    text = render.samples_text(
        [
            {**sample(3, "What is 2+2?", 1.0), "completion": "4\nbecause", "advantage": 1.2},
            {**sample(3, "What is 2+2?", -1.0), "completion": "four?", "formatFailure": True},
        ]
    )
    assert text.splitlines() == [
        "── step 3 · train ──",
        "PROMPT",
        "  │ What is 2+2?",
        "  reward +1.0000  advantage +1.200",
        "    │ 4",
        "    │ because",
        "  reward -1.0000  FORMAT FAILURE",
        "    │ four?",
    ]


def test_status_text_without_a_trend_says_why() -> None:
    report = {
        "name": "j",
        "namespace": "ns",
        "status": {
            "phase": "Pending",
            "reason": "Unschedulable",
            "progress": {"step": 0, "totalSteps": 10, "display": "0/10"},
            "restarts": 1,
            "conditions": [
                {"type": "Scheduled", "status": "False", "reason": "Unschedulable", "message": "no GPU"}
            ],
        },
        "trendUnavailable": "you may not create pods/exec",
        "restartEvents": [
            {"time": "2026-01-01T00:00:00Z", "reason": "Restarting", "message": "rank 0 exited 137"}
        ],
        "waiting": ["pod j-trainer-1-0: Unschedulable: 0/3 nodes have free nvidia.com/gpu"],
    }
    text = render.status_text(report)
    assert "Phase           Pending (Unschedulable)" in text
    assert "Step            0/10" in text
    assert "(no trend: you may not create pods/exec)" in text
    assert "Restarts        1\n  2026-01-01T00:00:00Z  Restarting: rank 0 exited 137" in text
    assert "Waiting on\n  pod j-trainer-1-0: Unschedulable: 0/3 nodes have free nvidia.com/gpu" in text
    assert "  Scheduled   False    Unschedulable   no GPU" in text
    assert "Checkpoint      none yet" in text


JOB = {"metadata": {"name": "tiny", "namespace": "ns", "uid": "u-1"}, "spec": {}}


def trainer_pod(node: str | None, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": "tiny-trainer-1-0", "labels": {"grpo.dev/node-rank": "0"}},
        "spec": {"nodeName": node, "securityContext": {"runAsUser": 1234, "runAsGroup": 55, "fsGroup": 77}},
        "status": {"phase": phase},
    }


def test_reader_pod_mounts_the_claim_read_only_beside_a_running_trainer() -> None:
    trainer = running_trainer([trainer_pod("gpu-node-1")])
    pod = reader_pod(JOB, "busybox:1.37.0", 600, trainer)
    spec = pod["spec"]
    assert spec["nodeName"] == "gpu-node-1"
    assert spec["volumes"] == [
        {"name": "workspace", "persistentVolumeClaim": {"claimName": "tiny-ckpt", "readOnly": True}}
    ]
    assert spec["containers"][0]["volumeMounts"][0] == {
        "name": "workspace",
        "mountPath": "/workspace",
        "readOnly": True,
    }
    assert spec["securityContext"]["runAsUser"] == 1234 and spec["securityContext"]["supplementalGroups"] == [
        77
    ]
    assert spec["activeDeadlineSeconds"] == 600 and spec["containers"][0]["command"] == ["sleep", "600"]
    # The operator treats pods labelled grpo.dev/job as the job's children; the reader must not be one.
    assert "grpo.dev/job" not in pod["metadata"]["labels"]
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_reader_pod_of_a_finished_job_is_left_to_the_scheduler_and_uses_an_existing_claim() -> None:
    assert running_trainer([trainer_pod("gpu-node-1", "Succeeded"), trainer_pod(None, "Pending")]) is None
    job = {**JOB, "spec": {"checkpoints": {"volume": {"existingClaim": "shared"}}}}
    pod = reader_pod(job, "img", 60, None)
    assert "nodeName" not in pod["spec"]
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "shared"
    assert pod["spec"]["securityContext"]["runAsUser"] == 65532


def test_host_path_transport_reads_from_an_offset_and_copies_trees(tmp_path: Path) -> None:
    (tmp_path / "output" / "model").mkdir(parents=True)
    (tmp_path / "output" / "samples.jsonl").write_text("abcdef")
    (tmp_path / "output" / "model" / "config.json").write_text("{}")
    volume = HostPathTransport(tmp_path)
    assert volume.read("/workspace/output/samples.jsonl", 2) == b"cdef"
    assert volume.read("/workspace/output/none") is None
    assert volume.list_dir("/workspace/output") == ["model", "samples.jsonl"]
    volume.copy_out("/workspace/output/model", tmp_path / "out")
    assert (tmp_path / "out" / "config.json").read_text() == "{}"


def pod(name: str, attempt: int, rank: int | None = None) -> dict[str, Any]:
    labels = {"grpo.dev/attempt": str(attempt)}
    if rank is not None:
        labels["grpo.dev/node-rank"] = str(rank)
    return {"metadata": {"name": name, "labels": labels}}


def test_logs_pick_the_current_attempts_pod_of_the_rank() -> None:
    pods = [pod("t-1-0", 1, 0), pod("t-2-1", 2, 1), pod("t-2-0", 2, 0)]
    assert cli.pick_pod(pods, "trainer", 0)["metadata"]["name"] == "t-2-0"  # type: ignore[index]
    assert cli.pick_pod(pods, "trainer", 3) is None
    assert cli.pick_pod([pod("m-b", 0), pod("m-a", 0)], "metric", 1)["metadata"]["name"] == "m-b"  # type: ignore[index]


def test_bad_arguments_exit_2_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["samples", "j", "--best", "--worst"])
    assert exit_.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_an_unreadable_kubeconfig_is_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "j", "--kubeconfig", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err
    assert "cannot load the kubeconfig" in err and "--kubeconfig" in err


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from grpo_operator.kubectl_plugin.plot import plot_rows

    rows = [
        {"step": 1, "reward_mean": 0.1, "reward_std": 0.05},
        {"step": 2, "reward_mean": 0.3, "validation_mean": 0.2},
    ]
    out = plot_rows(rows, tmp_path / "r.png", "t")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_status_text_draws_the_trends_from_the_per_step_record() -> None:
    report = {
        "name": "j",
        "namespace": "ns",
        "status": {"phase": "Running", "progress": {"display": "4/10"}},
        "trend": {
            "steps": [1, 2, 3, 4],
            "reward": [0.0, 0.25, 0.5, 1.0],
            "formatFailureRatio": [0.5, 0.25, 0.0, 0.0],
            "validation": [None, 0.2, None, 0.4],
        },
    }
    lines = render.status_text(report).splitlines()
    assert "Reward          1.0000  ▁▃▅█  (first 0.0000, min 0.0000, max 1.0000)" in lines
    assert "Format failures 0.0%  █▅▁▁  (first 50.0%, min 0.0%, max 50.0%)" in lines
    # Validation runs every few steps: its points side by side, without the gaps between them.
    assert "Validation      0.4000  ▁█  (first 0.2000, min 0.2000, max 0.4000)" in lines
