"""Shared fixtures. Tests that use ``kube`` run against a real API server (see tests/harness/kube.py);
if that cluster cannot be reached or started, they fail loudly rather than skip.

With ``GRPO_NO_SKIPS=1`` (set by .ci/run) a skipped test or module fails instead: a developer without
the trainer or dspy extra may skip what needs them, CI must not silently run less than the whole suite."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator

import pytest

from tests.harness.kube import Cluster

NO_SKIPS = os.environ.get("GRPO_NO_SKIPS") == "1"


def _forbid_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if NO_SKIPS and report.skipped:
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, but GRPO_NO_SKIPS=1 (CI) runs every test: {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _forbid_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    _forbid_skip(report)
    return report


def pytest_configure(config: pytest.Config) -> None:
    # Registered here rather than in pyproject.toml: an edit there re-keys the wheel cache (Makefile DEPS_KEY).
    config.addinivalue_line(
        "markers", "unit: pure tests under tests/unit, needing neither a cluster nor torch (`make check`)"
    )
    config.addinivalue_line(
        "markers", "vllm: starts a real vLLM server (minutes of CPU); such modules are collected first"
    )


UNIT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unit")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Modules that start vLLM servers are the longest by far: run first, the pytest-xdist workers take
    # them at the start and share out the short modules after, instead of one worker starting a
    # ten-minute module when the other has nothing left. A stable sort: the order is otherwise kept.
    heavy = {item.path for item in items if item.get_closest_marker("vllm") is not None}
    items.sort(key=lambda item: item.path not in heavy)
    for item in items:
        if "kube" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)
        # The first feedback tier (`make check`): pure tests that need neither a cluster nor torch.
        in_unit_dir = str(item.path).startswith(UNIT_DIR + os.sep)
        if (
            in_unit_dir
            and item.get_closest_marker("cluster") is None
            and item.get_closest_marker("trainer") is None
        ):
            item.add_marker(pytest.mark.unit)


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
    kube.delete_namespace(name)
