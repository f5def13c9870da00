"""What the operator's REST client sends: deletes carry a uid precondition, and every request is counted by
verb and resource (a real HTTP round trip to a local server that records each request, so the test sees
the bytes the API server would)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from grpo_operator.runtime.kube_client import GRPOJOB, POD, CountingApiClient, Kube, classify_request
from kubernetes import client

Request = tuple[str, str, dict[str, Any]]


@pytest.fixture
def server() -> Iterator[tuple[Kube, list[Request]]]:
    seen: list[Request] = []

    class Handler(BaseHTTPRequestHandler):
        def do_DELETE(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            seen.append(("DELETE", self.path, json.loads(self.rfile.read(length) or b"{}")))
            body = b'{"kind":"Status","status":"Success"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield Kube(CountingApiClient(configuration), field_manager="test", timeout=5), seen
    finally:
        httpd.shutdown()


def test_a_delete_names_the_uid_it_may_remove(server: tuple[Kube, list[Request]]) -> None:
    kube, seen = server
    kube.delete(POD, "ns", "math-trainer-1-0", uid="uid-pod")
    kube.delete(GRPOJOB, "ns", "math", uid="uid-job")
    assert seen == [
        (
            "DELETE",
            "/api/v1/namespaces/ns/pods/math-trainer-1-0",
            {
                "kind": "DeleteOptions",
                "apiVersion": "v1",
                "propagationPolicy": "Background",
                "preconditions": {"uid": "uid-pod"},
            },
        ),
        (
            "DELETE",
            "/apis/grpo.dev/v1alpha1/namespaces/ns/grpojobs/math",
            {
                "kind": "DeleteOptions",
                "apiVersion": "v1",
                "propagationPolicy": "Background",
                "preconditions": {"uid": "uid-job"},
            },
        ),
    ]


def test_every_request_is_counted_by_verb_and_resource(server: tuple[Kube, list[Request]]) -> None:
    kube, _ = server
    counted: list[tuple[str, str]] = []
    kube.count_requests(lambda verb, resource: counted.append((verb, resource)))
    kube.delete(POD, "ns", "math-trainer-1-0", uid="uid-pod")
    watcher = kube.watch_client(streams=1)
    assert isinstance(watcher, CountingApiClient) and watcher.on_request is kube.on_request
    assert counted == [("delete", "pods")]


@pytest.mark.parametrize(
    ("method", "url", "expected"),
    [
        ("GET", "https://h:6443/api/v1/namespaces/a/pods?labelSelector=x", ("list", "pods")),
        ("GET", "https://h:6443/api/v1/namespaces/a/pods?watch=true&resourceVersion=5", ("watch", "pods")),
        ("GET", "https://h:6443/api/v1/nodes?limit=500", ("list", "nodes")),
        ("GET", "https://h:6443/apis/grpo.dev/v1alpha1/namespaces/a/grpojobs/j", ("get", "grpojobs")),
        (
            "PATCH",
            "https://h/apis/grpo.dev/v1alpha1/namespaces/a/grpojobs/j/status",
            ("patch", "grpojobs/status"),
        ),
        ("POST", "https://h/apis/apps/v1/namespaces/a/deployments", ("create", "deployments")),
        ("POST", "https://h/api/v1/namespaces/a/events", ("create", "events")),
        ("DELETE", "https://h/proxy/api/v1/namespaces/a/pods/p", ("delete", "pods")),
        ("GET", "https://h/api/v1/namespaces/a", ("get", "namespaces")),
    ],
)
def test_requests_are_classified_as_the_api_server_names_them(
    method: str, url: str, expected: tuple[str, str]
) -> None:
    assert classify_request(method, url) == expected
