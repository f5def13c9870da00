"""The harness's free ports: below the kernel's ephemeral range (where a bind to port 0 or an outgoing
connection never takes them between the choice and the bind), one slice per pytest-xdist worker, never
handed out twice by a process, and never one that is bound."""

from __future__ import annotations

import socket

import pytest

from tests.harness import ports

pytestmark = pytest.mark.unit


def test_ports_come_from_below_the_ephemeral_range_and_are_not_repeated() -> None:
    floor = ports.ephemeral_floor()
    if floor - ports.LOWEST < ports.MIN_SPAN:
        pytest.fail(
            f"this machine's ephemeral range starts at {floor}: the harness would use the kernel's ports"
        )
    handed = [ports.free_port() for _ in range(200)]
    assert all(ports.LOWEST <= p < floor for p in handed), handed
    assert len(set(handed)) == len(handed)


def test_each_xdist_worker_draws_from_its_own_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    first = ports.worker_slice(20000, 32768)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    second = ports.worker_slice(20000, 32768)
    assert first.start == 20000 and first.stop == second.start and second.stop <= 32768
    assert len(first) == len(second) == 6384
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert ports.worker_slice(20000, 32768) == range(20000, 32768)


def test_a_bound_port_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_next", None)
    following = ports.free_port()
    monkeypatch.setattr(ports, "_next", None)  # the same start again: the port it gave is now taken
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", following))
        taken.listen()
        assert ports.free_port() != following
