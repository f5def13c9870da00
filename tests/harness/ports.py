"""TEST HARNESS — ports for local servers that stay free until the server binds them.

A local pod or test server learns its port long before it binds it: a trainer is told its /metrics port
when it starts and serves it only once vLLM answers, a minute or two later. A port the kernel hands out
for a bind to port 0 comes from the ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by
default), which the kernel also hands to every outgoing connection and every other bind to port 0 on the
machine (vLLM's ZMQ sockets, torch's rendezvous, an HTTP client's local end). One of those can take the
port in the meantime, and the server then dies with "Address already in use": a failure of the harness,
not of the code under test.

The ports here come from below the ephemeral range, where only an explicit bind takes a port. Each
pytest-xdist worker draws from a slice of its own, a process never hands out one port twice (until it has
gone round its whole slice), and a port another process has bound is skipped."""

from __future__ import annotations

import functools
import os
import random
import socket
import threading
from pathlib import Path

# Below this, ports are often assigned to well-known services (and some CI hosts block them).
LOWEST = 20000
# Fewer ports than this between LOWEST and the ephemeral range: fall back to the kernel's choice.
MIN_SPAN = 2000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")

_lock = threading.Lock()
_next: int | None = None


@functools.cache
def ephemeral_floor() -> int:
    """The lowest port the kernel hands out for port 0 (32768 where /proc does not say); read once."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def worker_slice(low: int, high: int) -> range:
    """This pytest-xdist worker's share of [low, high): gwN of K workers gets the N-th of K equal slices;
    a process outside xdist gets the whole span."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not (name.startswith("gw") and name[2:].isdigit()):
        return range(low, high)
    index = int(name[2:])
    if count <= 1 or index >= count:
        return range(low, high)
    size = (high - low) // count
    return range(low + index * size, low + (index + 1) * size)


def kernel_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now and that no bind to port 0 will take later."""
    global _next
    floor = ephemeral_floor()
    if floor - LOWEST < MIN_SPAN:
        return kernel_port()
    ports = worker_slice(LOWEST, floor)
    with _lock:
        if _next is None:
            # Processes of one worker (a test and the scripts it starts) begin at different places.
            _next = random.Random(os.getpid()).randrange(len(ports))
        for _ in range(len(ports)):
            port = ports[_next % len(ports)]
            _next += 1
            if bindable(port):
                return port
    return kernel_port()
