"""TEST HARNESS — a GRPOJob's statuses as `kubectl get grpo -w` shows them."""

from __future__ import annotations

import subprocess

from tests.harness.kube import Cluster, kubectl_binary


class StatusWatch:
    """Every (phase, reason, message) the job's status goes through, as `kubectl get grpo -w` shows them: a
    watch of its own, because the runner's passes can block for a minute (stopping a process that ignores
    SIGTERM) while the job moves on."""

    def __init__(self, kube: Cluster, namespace: str, job: str) -> None:
        self.proc = subprocess.Popen(
            [
                kubectl_binary(), "--kubeconfig", str(kube.kubeconfig), "get", "grpojobs", "-n", namespace,
                "--field-selector", f"metadata.name={job}", "--watch", "--output-watch-events=false",
                "-o", 'jsonpath={.status.phase} {.status.reason} {.status.message}{"\\n"}',
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip

    def stop(self) -> list[tuple[str, str, str]]:
        """The statuses seen, each change once."""
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=30)
        seen: list[tuple[str, str, str]] = []
        for line in out.splitlines():
            # Phases and reasons are single words; the message is the rest of the line.
            phase, reason, message = [*line.split(" ", 2), "", ""][:3]
            if phase and (not seen or seen[-1] != (phase, reason, message)):
                seen.append((phase, reason, message))
        return seen
