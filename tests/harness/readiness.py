"""TEST HARNESS — reports generation pods Ready, as a kubelet does when vLLM's readiness probe passes.

On the local cluster kwok starts a generation pod (label grpo.dev/role=generation) but leaves it not Ready
(hack/cluster/kwok-stages.yaml): on a real node it becomes Ready only once vLLM answers /health, and the
operator's start-up logic (spec.generation.startupTimeoutSeconds, the job's Running phase) waits for that.
Whatever stands in for vLLM reports the readiness:

- the local runner (tests/harness/local_runner.py), once its vLLM server answers /health, or at once for
  a job it runs without vLLM (``generation="in-process-transformers"``);
- :func:`generation_ready` for tests that run the operator without any runner: a background thread that
  reports every started generation pod of a namespace Ready at once, as if vLLM came up instantly (what
  kwok's default stages did for every pod).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from kubernetes import client, config

from tests.harness.kube import Cluster

ROLE_SELECTOR = "grpo.dev/role=generation"


def unready(pod: dict[str, Any]) -> bool:
    """A started pod (Running, not being deleted) whose Ready condition is not True."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    return not ready or ready[0].get("status") != "True"


def ready_status(pod: dict[str, Any]) -> dict[str, Any]:
    """The status a kubelet reports once the pod's readiness probe passes: conditions Ready and
    ContainersReady True since now, every container ready. Whole lists, for a merge patch (which replaces
    lists rather than merging them)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = pod.get("status") or {}
    conditions = [
        c for c in status.get("conditions") or [] if c.get("type") not in ("Ready", "ContainersReady")
    ]
    conditions += [
        {"type": "Ready", "status": "True", "lastTransitionTime": now},
        {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
    ]
    containers = [{**c, "ready": True, "started": True} for c in status.get("containerStatuses") or []]
    return {"conditions": conditions, "containerStatuses": containers}


def mark_ready(kube: Cluster, pod: dict[str, Any]) -> bool:
    """Reports ``pod`` (as read) Ready through the status subresource. Only that version of the pod: one
    changed since (exited, deleted, replaced) is left alone and False is returned, so that a readiness
    report never lands on a pod whose container has just terminated."""
    meta = pod["metadata"]
    patch = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": ready_status(pod)}
    proc = kube.kubectl(
        "patch", "pod", meta["name"], "-n", meta["namespace"], "--subresource=status", "--type=merge",
        "-p", json.dumps(patch), check=False,
    )  # fmt: skip
    if proc.returncode == 0:
        return True
    if "the object has been modified" in proc.stderr or "NotFound" in proc.stderr:
        return False
    raise AssertionError(f"could not report pod {meta['namespace']}/{meta['name']} Ready:\n{proc.stderr}")


@contextlib.contextmanager
def generation_ready(kube: Cluster, namespace: str, interval: float = 0.5) -> Iterator[None]:
    """While the block runs, every started generation pod in ``namespace`` is reported Ready within
    ``interval`` seconds: a vLLM that is up at once, for tests of the operator that run no vLLM."""
    stop = threading.Event()
    # A client of its own: the test's thread may use the Cluster's at the same time.
    api = client.CoreV1Api(config.new_client_from_config(config_file=str(kube.kubeconfig)))

    def loop() -> None:
        while not stop.wait(interval):
            try:
                listed = api.list_namespaced_pod(
                    namespace, label_selector=ROLE_SELECTOR, _preload_content=False, _request_timeout=10
                )
                for pod in json.loads(listed.data)["items"]:
                    if unready(pod):
                        mark_ready(kube, pod)
            except Exception as error:
                # A kubelet keeps probing through API errors too. Shown with a failing test's output: a
                # job that never gets Running says why here.
                print(f"[generation-ready] {namespace}: {error!r}", file=sys.stderr)

    thread = threading.Thread(target=loop, name=f"generation-ready-{namespace}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)
        api.api_client.close()
