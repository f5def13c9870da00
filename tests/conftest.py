"""Shared fixtures. Tests that use ``kube`` run against a real API server (see tests/harness/kube.py);
if that cluster cannot be reached or started, they fail loudly rather than skip."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.kube import Cluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "kube" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def kube() -> Iterator[Cluster]:
    cluster = Cluster.connect()
    try:
        cluster.apply_crds()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def namespace(kube: Cluster) -> Iterator[str]:
    name = kube.new_namespace()
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", check=False)
