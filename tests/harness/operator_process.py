"""A `grpo-operator run` process for tests (test harness): started against a test cluster, its log in
a file the tests read, stoppable gracefully or with kill -9."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.kube import Cluster, wait_for


def operator_binary() -> str:
    candidate = Path(sys.executable).with_name("grpo-operator")
    if not candidate.exists():
        raise RuntimeError(f"{candidate} is missing: install the project with `pip install -e .`")
    return str(candidate)


@dataclass
class Operator:
    """One `grpo-operator run -n <namespace>` process; its log goes to a file the tests can read."""

    kube: Cluster
    namespace: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    extra_args: list[str] = field(default_factory=list)
    # Settings given as the chart gives them: GRPO_OPERATOR_<FIELD> variables (operator settings.py).
    extra_env: dict[str, str] = field(default_factory=dict)

    def start(self) -> None:
        self.starts += 1
        log = self.log_path.open("ab")
        log.write(f"\n===== start {self.starts} =====\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            [
                operator_binary(),
                "run",
                "--namespace",
                self.namespace,
                "--http-port",
                "0",
                "--resync-seconds",
                "2",
                *self.extra_args,
            ],
            env={**self.kube.env(), **self.extra_env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        wait_for("the operator to start", lambda: "grpo-operator started" in self.log_tail(), timeout=60)

    def log_tail(self) -> str:
        text = self.log_path.read_text(errors="replace")
        return text.split(f"===== start {self.starts} =====")[-1]

    @property
    def http_port(self) -> int:
        match = re.search(r"/readyz on http://[^:]+:(\d+)", self.log_tail())
        assert match, f"no HTTP port in the operator log:\n{self.log_tail()}"
        return int(match.group(1))

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
