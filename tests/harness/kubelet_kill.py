"""Killing a trainer the way a node does it (test harness): SIGKILL to the local trainer process the runner
started for a pod, and the pod reported Failed with exit code 137, as a kubelet reports an OOM kill."""

from __future__ import annotations

import signal

from tests.harness.kube import Cluster
from tests.harness.local_runner import LocalJobRunner


def kill_like_a_kubelet(kube: Cluster, runner: LocalJobRunner, pod_name: str) -> None:
    """SIGKILL the trainer and report the pod Failed with exit 137, as a kubelet would after an OOM kill."""
    proc = runner.trainers.pop(pod_name)
    proc.popen.send_signal(signal.SIGKILL)
    proc.popen.wait(timeout=30)
    proc.handle.close()
    runner.finished.add(pod_name)
    kube.terminate_pod(runner.namespace, pod_name, 137, reason="OOMKilled")
    # The container is gone: the pod may leave the API once deleted (the runner held it while it ran).
    runner.release(pod_name, proc.uid)
