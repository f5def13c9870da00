"""An OpenEnv environment whose groups tie by the dataset row: a row whose ``row`` number is not a multiple
of 4 ends its episode after one step with reward 0.5 whatever the model did (every episode of its group
ties: nothing to learn), any other row rewards each episode with a value no other episode gets (its group is
never tied). A job with dynamicSampling then has tied groups to replace in most steps, and the rows the
seeded samplers pick decide which, the same in every run."""

from __future__ import annotations

import itertools
import threading
from typing import Any
from uuid import uuid4

from echo_types import EchoAction, EchoObservation
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State


class TiedEnvironment(Environment):  # type: ignore[misc]
    SUPPORTS_CONCURRENT_SESSIONS = True
    distinct = itertools.count(1)
    lock = threading.Lock()

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.tied = True

    def reset(self, seed: int | None = None, episode_id: str | None = None, **row: Any) -> EchoObservation:
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.tied = int(row.get("row", 1)) % 4 != 0
        return EchoObservation(text="", reward=None, done=False)

    def step(self, action: EchoAction, timeout_s: float | None = None, **extra: Any) -> EchoObservation:  # type: ignore[override]
        self._state.step_count += 1
        if self.tied:
            return EchoObservation(text=str(action.message), reward=0.5, done=True)
        with self.lock:
            reward = next(self.distinct) / 100
        return EchoObservation(text=str(action.message), reward=reward, done=True)

    @property
    def state(self) -> State:
        return self._state


app = create_app(TiedEnvironment, EchoAction, EchoObservation, env_name="tied", max_concurrent_envs=64)
