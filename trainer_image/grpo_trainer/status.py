"""Rank 0 reports progress to its GRPOJob: a JSON merge patch of the status subresource with only the
trainer's sections (api.status.TRAINER_STATUS_FIELDS: progress, rewards, checkpoint, servedModel, cost;
phase, conditions and restarts belong to the operator). Patches are rate-limited, sent from a background thread so a slow API server never stalls a
training step, and failures are logged, never fatal."""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from typing import Any

from grpo_operator.api.status import TRAINER_STATUS_FIELDS

log = logging.getLogger("grpo_trainer.status")

GROUP, VERSION, PLURAL = "grpo.dev", "v1alpha1", "grpojobs"
OWNED_FIELDS = TRAINER_STATUS_FIELDS


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def load_api_client(kubeconfig: str | None = None) -> Any:
    """In-cluster config when KUBERNETES_SERVICE_HOST is set (the pod's ServiceAccount), else KUBECONFIG."""
    from kubernetes import client, config

    if os.environ.get("KUBERNETES_SERVICE_HOST") and kubeconfig is None:
        config.load_incluster_config()
        return client.ApiClient()
    return config.new_client_from_config(config_file=kubeconfig or os.environ.get("KUBECONFIG"))


class StatusReporter:
    def __init__(
        self,
        namespace: str,
        name: str,
        interval_seconds: float,
        *,
        uid: str | None = None,
        api_client: Any = None,
        request_timeout_seconds: float = 10.0,
    ):
        from kubernetes import client

        self.namespace, self.name, self.uid = namespace, name, uid
        self.interval = interval_seconds
        self.timeout = request_timeout_seconds
        self._api = client.CustomObjectsApi(api_client or load_api_client())
        self._pending: dict[str, Any] = {}
        self._force = False
        self._last_sent = 0.0
        self._cond = threading.Condition()
        self._closed = False
        self.patches_sent = 0
        self.failures = 0
        self._thread = threading.Thread(target=self._loop, name="status-patcher", daemon=True)
        self._thread.start()

    def update(self, status: dict[str, Any], *, force: bool = False) -> None:
        """Queue ``status`` (a partial status object); sent at most once per interval unless ``force``."""
        unknown = set(status) - set(OWNED_FIELDS)
        if unknown:
            raise ValueError(f"the trainer may only patch {OWNED_FIELDS}, not {sorted(unknown)}")
        with self._cond:
            _merge(self._pending, copy.deepcopy(status))
            self._force = self._force or force
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not (
                    self._pending and (self._force or time.monotonic() - self._last_sent >= self.interval)
                ):
                    wait = (
                        None
                        if not self._pending
                        else max(0.0, self.interval - (time.monotonic() - self._last_sent))
                    )
                    self._cond.wait(timeout=wait)
                if self._closed and not self._pending:
                    return
                body, self._pending, self._force = self._pending, {}, False
                self._last_sent = time.monotonic()
            self._send(body)
            with self._cond:
                self._cond.notify_all()

    def _send(self, status: dict[str, Any]) -> None:
        patch: dict[str, Any] = {"status": status}
        if self.uid:
            # A uid in a patch is a precondition: a recreated job of the same name is left alone (409).
            patch["metadata"] = {"uid": self.uid}
        try:
            self._api.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                self.name,
                patch,
                _content_type="application/merge-patch+json",
                _request_timeout=self.timeout,
            )
            self.patches_sent += 1
        except Exception as exc:  # the API server being away must never stop training
            self.failures += 1
            log.warning("status patch of grpojob %s/%s failed: %s", self.namespace, self.name, exc)

    def read(self) -> dict[str, Any] | None:
        """The job as the API server has it (the Role's `get` on the status subresource returns the whole
        object), or None when it cannot be read or is another job of the same name."""
        try:
            job = self._api.get_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, PLURAL, self.name, _request_timeout=self.timeout
            )
        except Exception as exc:  # reading back is a convenience: training goes on without it
            log.warning("reading grpojob %s/%s failed: %s", self.namespace, self.name, exc)
            return None
        if not isinstance(job, dict):
            return None
        if self.uid and (job.get("metadata") or {}).get("uid") != self.uid:
            return None
        return job

    def flush(self, timeout_seconds: float = 30.0) -> None:
        """Send whatever is queued now and wait for it (used at checkpoints' end and at exit)."""
        deadline = time.monotonic() + timeout_seconds
        with self._cond:
            self._force = True
            self._cond.notify_all()
            while self._pending and time.monotonic() < deadline:
                self._cond.wait(timeout=0.1)
        # Give an in-flight send the chance to finish before the process exits.
        time.sleep(0)

    def close(self, timeout_seconds: float = 30.0) -> None:
        self.flush(timeout_seconds)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=timeout_seconds)
