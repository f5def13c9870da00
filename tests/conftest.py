"""Shared fixtures. Tests that use ``kube`` run against a real API server (see tests/harness/kube.py);
if that cluster cannot be reached or started, they fail loudly rather than skip.

With ``GRPO_NO_SKIPS=1`` (set by .ci/run) a skipped test or module fails instead: a developer without
the trainer or dspy extra may skip what needs them, CI must not silently run less than the whole suite."""

from __future__ import annotations

import functools
import os
from collections.abc import Generator, Iterator
from typing import Any

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


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VLLM_MARK = "pytest.mark.vllm"
# The scheduling unit of every module that starts vLLM servers (`--dist loadgroup`, the Makefile).
VLLM_GROUP = "vllm-servers"


@functools.cache
def starts_vllm(module: str) -> bool:
    """Whether a test module (a path from the repository root, as in a node id) carries the vllm mark.
    The xdist controller sees node ids only, never the collected items, so it reads the module's text;
    pytest_collection_modifyitems checks the two agree."""
    try:
        with open(os.path.join(REPO, module), encoding="utf-8") as handle:
            return VLLM_MARK in handle.read()
    except OSError:
        return False


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With `--dist loadgroup`: each module is one unit of work on one worker (a module's shared vLLM
    server or operator starts once), and every module that starts vLLM servers is in one unit: they run
    one after the other on one worker while the other worker takes the rest. Two vLLM servers starting
    and generating at once on two cores stretched each test past its timeouts and starved the operators
    of the other tests. (pytest-xdist's own loadgroup reads xdist_group marks into node ids, which
    pytest 9 no longer lets it rewrite, so the grouping is made here.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # Units in collection order, where the vLLM modules come first (below), rather than the largest first:
    # the longest unit must start at once, not after the other worker has run out.
    config.option.loadscopereorder = False

    class ModulesWithVLLMTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return VLLM_GROUP if starts_vllm(module) else module

    return ModulesWithVLLMTogether(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Modules that start vLLM servers are the longest by far: run first. A stable sort: the order is
    # otherwise kept.
    heavy = {item.path for item in items if item.get_closest_marker("vllm") is not None}
    items.sort(key=lambda item: item.path not in heavy)
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if (item.path in heavy) != starts_vllm(module):
            raise pytest.UsageError(
                f"{module}: mark the whole module with pytestmark = [..., {VLLM_MARK}] or not at all: the "
                "scheduler (tests/conftest.py) groups the modules that start vLLM servers by their text"
            )
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
