"""The local runner reports a trainer's exit into its pod as a kubelet would: a process killed by a signal
shows as 128 + the signal (137 for SIGKILL, as `kubectl describe pod` shows for a killed container), not
as Popen's negative return code."""

from __future__ import annotations

import signal
import subprocess
import sys

from tests.harness.local_process import container_exit_code


def test_a_sigkilled_trainer_is_reported_with_exit_code_137() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=10) == -9
    assert container_exit_code(proc.returncode) == 137


def test_a_trainer_exit_code_is_reported_unchanged() -> None:
    proc = subprocess.run([sys.executable, "-c", "raise SystemExit(7)"], check=False)
    assert container_exit_code(proc.returncode) == 7
    assert container_exit_code(0) == 0
