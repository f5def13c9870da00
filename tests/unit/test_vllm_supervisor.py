"""The program the generation pod runs `vllm serve` under (builders/vllm_supervisor.py), run here with this
python around small child programs that stand in for vLLM: an exit nobody asked for is a failure whose
termination message starts with the log's root cause, a requested stop is not, and the logs pass through
unchanged."""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from grpo_operator.builders import vllm_supervisor
from grpo_operator.builders.gang import VLLM_SUPERVISOR
from grpo_operator.reconcile.observed import PodView

ROOT_CAUSE = "(EngineCore pid=12) ValueError: head size 16 is not supported by the CPU attention backend"
DEAD = "(APIServer pid=7) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."
# vLLM's warning at every start: it names an exception without being one.
ULIMIT = "(APIServer pid=7) WARNING [system_utils.py:249] This can cause fd limit errors like `OSError: [Errno 24] Too many open files`"
# What vLLM 0.31 does when its engine dies: the traceback of the cause (logged again by another process),
# the API server's EngineDeadError, hundreds of lines of shutdown (far more than the kubelet's 2 KB
# tail), and exit code 0.
STDERR = (
    f"{ULIMIT}\n"
    'Traceback (most recent call last):\n  File "attention.py", line 3, in check\n'
    f"{ROOT_CAUSE}\n"
    f"(Worker pid=13) ERROR [multiproc_executor.py:1058] {ROOT_CAUSE.split(') ', 1)[1]}\n"
    f"{DEAD}\n"
    + "".join(
        f"(APIServer pid=7) INFO shutting down, step {i:03d} of the engine's teardown\n" for i in range(300)
    )
)
CRASH = f"""
import sys
print("INFO: Started server process", flush=True)
sys.stderr.write({STDERR!r})
"""
# A server that runs until it is told to stop, and says which signal it got.
SERVER = """
import signal, sys, time
def stop(signum, frame):
    print(f"stopping on signal {signum}", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
print("ready", flush=True)
time.sleep(30)
sys.exit(5)
"""


def supervise(log: Path, *command: str) -> list[str]:
    return [sys.executable, "-c", VLLM_SUPERVISOR, "--termination-log", str(log), "--", *command]


def run(log: Path, child: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(supervise(log, sys.executable, "-c", child), capture_output=True, timeout=10)


def test_an_exit_0_nobody_asked_for_is_a_failure_whose_message_starts_with_the_root_cause(
    tmp_path: Path,
) -> None:
    log = tmp_path / "termination-log"
    result = run(log, CRASH)

    assert result.returncode == 1
    status = "vLLM exited with code 0 without being asked to stop"
    # Both streams pass through byte for byte; the supervisor adds its one line at the end.
    assert result.stdout == b"INFO: Started server process\n"
    assert result.stderr == STDERR.encode() + f"{status}\n".encode()
    message = log.read_bytes()
    assert len(message) <= 4096
    lines = message.decode().splitlines()
    # The cause first (then the other exception lines, oldest first), then the log's end, then the exit.
    assert lines[:3] == [ROOT_CAUSE, DEAD, "--- the end of vLLM's log ---"]
    assert lines[-1] == status
    # The tail: its last whole lines, stdout's and stderr's as they came (two pipes: in either order).
    body = lines[3:-1]
    assert len(body) > 30
    assert set(body[1:]) <= set(STDERR.splitlines()) | {"INFO: Started server process"}
    assert "(APIServer pid=7) INFO shutting down, step 299 of the engine's teardown" in body[-2:]


def test_the_operator_summary_of_the_message_names_the_root_cause(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    code = run(log, CRASH).returncode
    pod = {
        "metadata": {"name": "tiny-gen-1-0", "labels": {"grpo.dev/role": "generation"}},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"state": {"terminated": {"exitCode": code, "reason": "Error", "message": log.read_text()}}}
            ],
        },
    }
    assert PodView(pod).failure_summary() == f"generation pod tiny-gen-1-0 failed: exit code 1; {ROOT_CAUSE}"


def test_a_non_zero_exit_keeps_its_code(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    result = run(
        log, "import sys; sys.stderr.write('RuntimeError: Engine core initialization failed\\n'); sys.exit(3)"
    )
    assert result.returncode == 3
    assert log.read_text().splitlines() == [
        "RuntimeError: Engine core initialization failed",
        "--- the end of vLLM's log ---",
        "RuntimeError: Engine core initialization failed",
        "vLLM exited with code 3 without being asked to stop",
    ]


def test_a_server_killed_by_a_signal_exits_as_a_container_runtime_reports_it(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    result = run(log, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert result.returncode == 128 + 9
    assert log.read_text() == "vLLM was killed by signal 9 without being asked to stop"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda sig: sig.name)
def test_a_stop_is_forwarded_to_the_server_and_its_exit_is_no_failure(
    tmp_path: Path, sig: signal.Signals
) -> None:
    log = tmp_path / "termination-log"
    proc = subprocess.Popen(
        supervise(log, sys.executable, "-c", SERVER), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    assert stdout == f"stopping on signal {int(sig)}\n".encode()
    assert stderr == b""
    assert not log.exists()


@pytest.mark.parametrize("command", [["/nonexistent/vllm", "serve"], []])
def test_a_server_that_cannot_be_started_exits_127_saying_so(tmp_path: Path, command: list[str]) -> None:
    log = tmp_path / "termination-log"
    result = subprocess.run(supervise(log, *command), capture_output=True, timeout=10)
    assert result.returncode == 127
    message = log.read_text()
    assert message.startswith("cannot run vLLM: ") and "python3 and vllm on PATH" in message
    assert ("/nonexistent/vllm" in message) == bool(command)
    assert result.stderr.decode() == message + "\n"


def test_a_failure_stays_a_failure_when_the_message_cannot_be_written(tmp_path: Path) -> None:
    result = run(tmp_path / "missing" / "termination-log", "pass")
    assert result.returncode == 1
    assert b"cannot write" in result.stderr


def test_the_pod_runs_this_file_and_it_fits_in_a_termination_message_sized_budget() -> None:
    # The pod runs the module's own source; it is shown by `kubectl describe`, so it stays short, and it
    # runs under the vLLM image's python3, so it must parse as Python 3.9.
    source = Path(vllm_supervisor.__file__).read_text()
    assert source == VLLM_SUPERVISOR
    assert len(source.encode()) < 5500
    ast.parse(source, feature_version=(3, 9))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_keep_log_copies_both_streams_to_the_volume_file_and_the_pod_log_is_unchanged(tmp_path: Path) -> None:
    kept = tmp_path / "output" / "logs" / "attempt-2" / "vllm-0.log"
    child = "import sys; print('INFO engine started', flush=True); sys.stderr.write('Traceback: boom\\n'); sys.exit(0)"
    command = [sys.executable, "-c", VLLM_SUPERVISOR, "--termination-log", str(tmp_path / "t"), "--keep-log"]
    result = subprocess.run(
        [*command, str(kept), "--", sys.executable, "-c", child], capture_output=True, timeout=10
    )
    assert result.returncode == 1  # vLLM exited without being asked to
    assert b"INFO engine started" in result.stdout and b"Traceback: boom" in result.stderr
    assert set(kept.read_text().splitlines()) == {"INFO engine started", "Traceback: boom"}


def test_the_kept_log_is_bounded_and_keeps_the_newest_lines(tmp_path: Path) -> None:
    path = tmp_path / "vllm-0.log"
    kept = vllm_supervisor.Kept(str(path), limit=100)
    for i in range(30):
        kept.write(f"line {i:02d}\n".encode())
    newest, older = path.read_text().splitlines(), Path(f"{path}.1").read_text().splitlines()
    assert newest[-1] == "line 29" and older[-1] == f"line {int(newest[0][5:]) - 1:02d}"
    assert path.stat().st_size <= 100 and Path(f"{path}.1").stat().st_size <= 100


def test_a_kept_log_that_cannot_be_written_is_given_up_not_the_server(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    command = [sys.executable, "-c", VLLM_SUPERVISOR, "--termination-log", str(tmp_path / "t"), "--keep-log"]
    child = "print('serving', flush=True)"
    result = subprocess.run(
        [*command, str(tmp_path / "file" / "vllm-0.log"), "--", sys.executable, "-c", child],
        capture_output=True,
        timeout=10,
    )
    assert b"serving" in result.stdout and b"not keeping vLLM's log in" in result.stderr


def test_a_vllm_pod_that_mounts_the_jobs_volume_keeps_its_log_there_per_attempt_and_replica() -> None:
    from grpo_operator.builders import job_from_object
    from grpo_operator.builders.gang import generation_pod
    from grpo_operator.settings import OperatorSettings

    from tests.unit.reconcile_world import job_object

    shared = job_from_object(
        job_object(
            generation={"replicas": 2, "weightSync": "Volume"},
            checkpoints={"volume": {"accessMode": "ReadWriteMany"}},
        )
    )
    command = generation_pod(shared, OperatorSettings(), attempt=3, replica=1)["spec"]["containers"][0][
        "command"
    ]
    assert command[command.index("--keep-log") + 1] == "/workspace/output/logs/attempt-3/vllm-1.log"
    # A ReadWriteOnce volume is the trainer's node's alone: the vLLM pod cannot mount it.
    alone = job_from_object(
        job_object(trainer={"nodes": 1}, checkpoints={"volume": {"accessMode": "ReadWriteOnce"}})
    )
    assert (
        "--keep-log"
        not in generation_pod(alone, OperatorSettings(), attempt=3)["spec"]["containers"][0]["command"]
    )
