"""The controller posts a job's Events in the background: the worker that decided them does not wait.

The Kubernetes client here is a stand-in whose Event creates block until the test releases them, so that
what the worker waits for can be told apart from what is still being posted. The real API server's side is
covered by the integration tests, which read the Events a running operator posted.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from grpo_operator.runtime import apply_plan
from grpo_operator.runtime import events as events_module
from grpo_operator.runtime.controller import Controller
from grpo_operator.settings import OperatorSettings
from kubernetes.client.exceptions import ApiException

JOB = {"metadata": {"namespace": "team-a", "name": "math", "uid": "uid-1"}}


class HeldEvents:
    """Event creates wait until ``release`` is set; every posted Event is kept, a failing one raises."""

    def __init__(self, fail_with: Exception | None = None) -> None:
        self.release = threading.Event()
        self.posted: list[dict[str, Any]] = []
        self.fail_with = fail_with

    def count_requests(self, hook: Any) -> None:
        pass

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.release.wait(10)
        if self.fail_with is not None:
            raise self.fail_with
        self.posted.append(manifest)
        return manifest


def controller(kube: HeldEvents) -> Controller:
    return Controller(OperatorSettings(), kube)  # type: ignore[arg-type]


def test_a_reconcile_does_not_wait_for_its_events_and_they_are_all_posted() -> None:
    async def scenario() -> None:
        kube = HeldEvents()
        ctl = controller(kube)
        events = [
            ("Normal", "Created", "gang attempt 1 created"),
            ("Normal", "Running", "gang attempt 1 runs"),
        ]
        await asyncio.wait_for(ctl.emit_events(JOB, events), timeout=1)
        assert kube.posted == [], "the worker went on while the Events were still being posted"
        kube.release.set()
        await ctl.flush_events(timeout=5)
        assert sorted(e["reason"] for e in kube.posted) == ["Created", "Running"]
        assert all(e["involvedObject"]["uid"] == "uid-1" for e in kube.posted)

    asyncio.run(scenario())


def test_beyond_the_in_flight_limit_a_reconcile_posts_its_own_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events_module, "MAX_EVENTS_IN_FLIGHT", 1)

    async def scenario() -> None:
        kube = HeldEvents()
        ctl = controller(kube)
        await ctl.emit_events(JOB, [("Normal", "Created", "first")])
        second = asyncio.create_task(ctl.emit_events(JOB, [("Normal", "Running", "second")]))
        await asyncio.sleep(0.2)
        assert not second.done(), "with the limit reached, the reconcile waits for its Event"
        kube.release.set()
        await asyncio.wait_for(second, timeout=5)
        assert "Running" in {e["reason"] for e in kube.posted}
        await ctl.flush_events(timeout=5)
        assert sorted(e["reason"] for e in kube.posted) == ["Created", "Running"]

    asyncio.run(scenario())


def test_stopping_the_controller_posts_the_events_in_flight() -> None:
    async def scenario() -> None:
        kube = HeldEvents()
        ctl = controller(kube)
        await ctl.emit_events(JOB, [("Warning", "BackoffLimitExceeded", "3 restarts")])
        threading.Timer(0.2, kube.release.set).start()
        await ctl.stop()
        assert [e["reason"] for e in kube.posted] == ["BackoffLimitExceeded"]

    asyncio.run(scenario())


def test_an_event_that_cannot_be_posted_is_counted_and_never_raised() -> None:
    async def scenario() -> None:
        kube = HeldEvents(fail_with=ConnectionResetError("connection reset by peer"))
        kube.release.set()
        ctl = controller(kube)
        await ctl.emit_events(JOB, [("Normal", "Created", "gang attempt 1 created")])
        await ctl.flush_events(timeout=5)
        assert kube.posted == []
        errors = ctl.metrics.registry.get_sample_value(
            "grpo_operator_api_errors_total", {"verb": "create", "kind": "Event", "code": "0"}
        )
        assert errors == 1.0

    asyncio.run(scenario())


class RoleNotCachedYet:
    """A RoleBinding create answers 404 ``misses`` times (the API server's cache of Roles behind), then
    succeeds; every other create succeeds at once."""

    def __init__(self, misses: int) -> None:
        self.misses = misses
        self.calls = 0

    def count_requests(self, hook: Any) -> None:
        pass

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if manifest["kind"] == "RoleBinding" and self.calls <= self.misses:
            raise ApiException(status=404, reason="Not Found")
        return {**manifest, "metadata": {**manifest["metadata"], "resourceVersion": "1"}}

    apply = create_for_apply = create


BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "RoleBinding",
    "metadata": {"namespace": "team-a", "name": "math-trainer", "labels": {"grpo.dev/job": "math"}},
}


@pytest.mark.parametrize("misses, refused", [(2, False), (9, True)])
def test_a_rolebinding_whose_role_the_server_has_not_cached_yet_is_tried_again_before_it_is_reported(
    monkeypatch: pytest.MonkeyPatch, misses: int, refused: bool
) -> None:
    monkeypatch.setattr(apply_plan, "ROLE_CACHE_RETRY_SECONDS", (0.01, 0.01, 0.01))

    async def scenario() -> None:
        kube = RoleNotCachedYet(misses)
        ctl = controller(kube)  # type: ignore[arg-type]
        failures: list[Any] = []
        await ctl.executor._write("create-for-apply", BINDING, failures, [])
        # A 404 the cache explains does not become a ChildRejected; one that persists still does.
        assert [f.kind for f in failures] == (["RoleBinding"] if refused else [])
        assert kube.calls == (4 if refused else 3)

    asyncio.run(scenario())
