"""The deadline on TRL's NCCL weight push (grpo_trainer.push_deadline): a push that finishes in time returns
its result and leaves nothing behind; one that overruns ends the process with exit 1 (TRANSIENT: the gang
restarts from its checkpoint) and a reason naming the server and the deadline. The overrunning push here is
a call that blocks, standing for an NCCL broadcast whose peer is gone, which needs two GPUs to produce."""

from __future__ import annotations

import threading
import time

import pytest

pytestmark = pytest.mark.unit


def test_a_push_in_time_returns_and_its_deadline_never_fires() -> None:
    from grpo_trainer.push_deadline import with_deadline

    exits: list[int] = []
    guarded = with_deadline(lambda x: x * 2, 0.2, "http://gen:8000", exit_process=exits.append)
    assert guarded(21) == 42
    time.sleep(0.4)
    assert exits == []


def test_a_push_that_overruns_ends_the_process_with_a_reason(capsys: pytest.CaptureFixture[str]) -> None:
    from grpo_trainer.push_deadline import with_deadline

    exits: list[int] = []
    released = threading.Event()

    def exit_process(code: int) -> None:
        exits.append(code)
        released.set()  # the real exit never returns; here it lets the blocked push go

    guarded = with_deadline(lambda: released.wait(10), 0.2, "http://gen:8000", exit_process=exit_process)
    started = time.monotonic()
    guarded()
    assert exits == [1] and time.monotonic() - started < 5
    err = capsys.readouterr().err
    assert "http://gen:8000 did not finish within 0.2s" in err
    assert "restarts the gang from the newest checkpoint" in err
