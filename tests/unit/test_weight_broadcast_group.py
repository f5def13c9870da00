"""The weight-broadcast group (grpo_weight_broadcast.group) between real processes over gloo: what trainer
rank 0 sends arrives bit for bit at every member, the group can be formed again on the same port (a
replica replaced), and a member that dies makes rank 0's broadcast fail at once instead of hanging until
the group's timeout."""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

import pytest

from tests.harness.ports import free_port

pytestmark = pytest.mark.unit

TIMEOUT = 120.0


def _member(
    port: int, rank: int, world: int, formation: int, results: Any, die: bool, dying: int | None
) -> None:
    import torch
    from grpo_weight_broadcast.group import open_group

    group = open_group("127.0.0.1", port, rank, world, "gloo", TIMEOUT, formation)
    if die:
        os._exit(0)  # gone without leaving the group, as a SIGKILLed vLLM worker
    received = [torch.zeros(3, 5, dtype=torch.bfloat16), torch.zeros(7, dtype=torch.float32)]
    if dying is not None:
        # The tensors rank 0 sends in the test with a dying member (gloo aborts a process whose receive
        # does not match what is sent, so every member must expect the same sizes).
        received = [torch.zeros(1 << 16) for _ in range(20)]
    try:
        for tensor in received:
            group.broadcast(tensor)
    except RuntimeError:
        return
    results.put((rank, [t.tolist() for t in received]))
    group.close()


def _form(port: int, world: int, formation: int, results: Any, dying: int | None = None) -> list[Any]:
    # Spawned, not forked: a fork of a process whose torch thread pools have started (any pytest worker that
    # ran a torch test before) can deadlock in its first torch call.
    context = multiprocessing.get_context("spawn")
    members = [
        context.Process(target=_member, args=(port, rank, world, formation, results, rank == dying, dying))
        for rank in range(1, world)
    ]
    for member in members:
        member.start()
    return members


def test_every_member_receives_rank_0s_tensors_and_the_group_forms_again_on_the_same_port() -> None:
    import torch
    from grpo_weight_broadcast.group import open_group

    port = free_port()
    sent = [torch.randn(3, 5).to(torch.bfloat16), torch.randn(7)]
    results = multiprocessing.get_context("spawn").Queue()
    for formation in (0, 1):
        members = _form(port, 3, formation, results)
        group = open_group("127.0.0.1", port, 0, 3, "gloo", TIMEOUT, formation)
        for tensor in sent:
            group.broadcast(tensor.clone())
        got = dict(results.get(timeout=60) for _ in members)
        for member in members:
            member.join(timeout=60)
        group.close()
        assert sorted(got) == [1, 2]
        assert all(tensors == [t.tolist() for t in sent] for tensors in got.values())


def test_a_member_that_dies_fails_the_broadcast_at_once() -> None:
    import torch
    from grpo_weight_broadcast.group import open_group

    port = free_port()
    results = multiprocessing.get_context("spawn").Queue()
    members = _form(port, 3, 0, results, dying=2)
    group = open_group("127.0.0.1", port, 0, 3, "gloo", TIMEOUT, 0)
    members[1].join(timeout=60)
    started = time.monotonic()
    with pytest.raises(RuntimeError):
        for _ in range(20):  # gloo may buffer the first sends to a peer that is already gone
            group.broadcast(torch.ones(1 << 16))
    assert time.monotonic() - started < TIMEOUT / 4
    group.close()
    # The surviving member's receive failed too (its process exits normally, it did not hang or abort).
    members[0].join(timeout=60)
    assert members[0].exitcode == 0


def test_an_unknown_backend_is_refused_by_name() -> None:
    from grpo_weight_broadcast.group import open_group

    with pytest.raises(ValueError, match="expected gloo or nccl"):
        open_group("127.0.0.1", free_port(), 0, 1, "mpi", 5, 0)


def test_tensors_are_packed_into_buckets_both_sides_compute_alike() -> None:
    import torch
    from grpo_weight_broadcast.group import buckets, pack, unpack

    # Consecutive tensors up to the limit; a tensor above it goes alone; nothing is left out or reordered.
    assert buckets([10, 20, 30, 100, 5, 5], limit=60) == [range(0, 3), range(3, 4), range(4, 6)]
    assert buckets([], limit=60) == []
    tensors = [torch.randn(3, 4).to(torch.bfloat16), torch.randn(5), torch.arange(6).view(2, 3)]
    buffer = pack(tensors)
    assert buffer.dtype == torch.uint8 and buffer.numel() == 3 * 4 * 2 + 5 * 4 + 6 * 8
    back = unpack(buffer, [t.dtype for t in tensors], [list(t.shape) for t in tensors])
    assert all(torch.equal(a, b) for a, b in zip(tensors, back, strict=True))
