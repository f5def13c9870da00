"""A local process's log served as its pod's container log, so that `kubectl logs` and `kubectl grpo logs`
read it as they would on a real cluster (test harness).

kwok plays the kubelet of the local cluster and answers the API server's log requests for its pods from
files named by kwok ``Logs`` objects (one per pod, named like it; hack/cluster.sh enables them). kwok
reads the container runtime's (CRI) log format, one ``<RFC 3339 time> <stream> F <line>`` per line, so a
thread copies what the process writes into a file of that format as it comes.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from tests.harness.kube import Cluster


def cri_line(line: bytes) -> bytes:
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ").encode()
    return stamp + b" stdout F " + line.rstrip(b"\n") + b"\n"


@dataclass
class PodLog:
    """Copies ``source`` (the process's stdout and stderr) to ``<source>.cri`` and names that file in a kwok
    Logs object for ``pod``'s ``container``; ``stop()`` copies what is left and ends the thread."""

    kube: Cluster
    namespace: str
    pod: str
    container: str
    source: Path
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def cri(self) -> Path:
        return self.source.with_name(self.source.name + ".cri")

    def start(self) -> bool:
        """False where the cluster has no kwok Logs (another kind of cluster): its own kubelets log."""
        self.cri.write_bytes(b"")
        logs = {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Logs",
            "metadata": {"name": self.pod, "namespace": self.namespace},
            "spec": {"logs": [{"containers": [self.container], "logsFile": str(self.cri), "follow": True}]},
        }
        applied = self.kube.kubectl("apply", "-f", "-", input=json.dumps(logs), check=False)
        if applied.returncode != 0:
            return False
        self._thread = threading.Thread(target=self._copy, name=f"pod-log-{self.pod}", daemon=True)
        self._thread.start()
        return True

    def _copy(self) -> None:
        pending = b""
        with self.cri.open("ab") as out:
            while not self.source.exists() and not self._stop.wait(0.2):
                pass
            if not self.source.exists():
                return
            with self.source.open("rb") as src:
                while True:
                    chunk = src.read(65536)
                    if chunk:
                        pending += chunk
                        *lines, pending = pending.split(b"\n")
                        out.writelines(cri_line(line) for line in lines)
                        out.flush()
                        continue
                    if self._stop.is_set():
                        break
                    self._stop.wait(0.2)
                if pending:
                    out.write(cri_line(pending))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
