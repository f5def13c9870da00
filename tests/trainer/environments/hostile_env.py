"""An OpenEnv environment that breaks the protocol in the ways a tenant's image can, one way per episode in
the order the sessions reset (``n % 4``, so each run of 4 episodes meets every way once): 0 plays fair
(echoes, rewards 1.0, ends after two steps), 1 raises in ``step`` (OpenEnv sends an error message), 2 hangs
in ``step`` past any reasonable timeout, 3 ends the episode with a NaN reward (which OpenEnv sends as null)."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any
from uuid import uuid4

from echo_types import EchoAction, EchoObservation
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State


class HostileEnvironment(Environment):  # type: ignore[misc]
    SUPPORTS_CONCURRENT_SESSIONS = True
    resets = itertools.count()
    lock = threading.Lock()

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.mode = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **row: Any) -> EchoObservation:
        self._state = State(episode_id=str(uuid4()), step_count=0)
        with self.lock:
            self.mode = next(self.resets) % 4
        return EchoObservation(text="", reward=None, done=False)

    def step(self, action: EchoAction, timeout_s: float | None = None, **extra: Any) -> EchoObservation:  # type: ignore[override]
        self._state.step_count += 1
        if self.mode == 1:
            raise RuntimeError("the tool crashed")
        if self.mode == 2:
            time.sleep(30)
        if self.mode == 3:
            return EchoObservation(text="nan", reward=float("nan"), done=True)
        return EchoObservation(text=str(action.message), reward=1.0, done=self._state.step_count >= 2)

    @property
    def state(self) -> State:
        return self._state


app = create_app(HostileEnvironment, EchoAction, EchoObservation, env_name="hostile", max_concurrent_envs=64)
