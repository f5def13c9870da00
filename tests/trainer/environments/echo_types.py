"""The action and observation of the test environments in this folder: a text message, and the text
answered. Each environment is served from this folder (uvicorn's working directory), so they import it."""

from __future__ import annotations

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class EchoAction(Action):  # type: ignore[misc]
    message: str = Field(...)


class EchoObservation(Observation):  # type: ignore[misc]
    text: str = ""
