"""TEST HARNESS — the rollout gateway on real local ports, in a background thread, plus the trainer side
of its contract: trainer rank 0's calls to the internal routes, and a policy server answering completions
in OpenAI's shape (the trainer's is built by the trainer; here the answer text comes from the test).

Everything goes over real HTTP, so the gateway is exercised exactly as in its pod: the real client (DSPy,
Arbor's provider) on one side, the contract's trainer calls on the other.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import requests
from aiohttp import web
from grpo_gateway.app import Gateway, make_gateway, start
from grpo_operator.api.gateway_config import GatewayConfig
from grpo_operator.api.trainer_config import JobRef

from tests.harness.ports import free_port

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def gateway_config(**changes: Any) -> GatewayConfig:
    policy_port = changes.pop("policy_port", free_port())
    values: dict[str, Any] = {
        "job": JobRef(namespace="team-a", name="dspy", uid="uid-1"),
        "served_model": MODEL,
        "group_size": 4,
        "prompts_per_step": 2,
        "steps": 3,
        "client_port": free_port(),
        "internal_port": free_port(),
        "trainer_url": f"http://127.0.0.1:{policy_port}",
        "completion_wait_seconds": 5.0,
    }
    values.update(changes)
    return GatewayConfig(**values)


Answer = Callable[[dict[str, Any]], str]


class PolicyServer:
    """Trainer rank 0's policy server as the contract describes it: POST /v1/chat/completions and
    /v1/completions in OpenAI's shapes. ``answer`` decides the completion text."""

    def __init__(self, port: int, answer: Answer) -> None:
        self.port = port
        self.answer = answer
        self.requests: list[dict[str, Any]] = []
        self.runner: web.AppRunner | None = None

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        text = self.answer(body)
        return web.json_response(
            {
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    async def _text(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        return web.json_response(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "model": body.get("model"),
                "choices": [{"index": 0, "text": self.answer(body), "finish_reason": "stop"}],
            }
        )

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._text)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


class RunningGateway:
    """The gateway serving ``config`` on 127.0.0.1 from a thread of its own."""

    def __init__(self, config: GatewayConfig, internal_token: str | None = None) -> None:
        self.config = config
        # The job's internal secret, sent by the trainer-side calls below (the gateway needs
        # config.internal_token_env set to that value in its environment to require it).
        self.internal_token = internal_token
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="gateway", daemon=True)
        self.gateway: Gateway | None = None
        self.runners: list[web.AppRunner] = []
        self.policy: PolicyServer | None = None

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.config.client_port}"

    @property
    def internal_url(self) -> str:
        return f"http://127.0.0.1:{self.config.internal_port}"

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __enter__(self) -> RunningGateway:
        self.thread.start()

        async def boot() -> None:
            self.gateway = make_gateway(self.config)
            self.runners = await start(self.gateway, host="127.0.0.1")

        self.run(boot())
        return self

    def __exit__(self, *_: object) -> None:
        async def down() -> None:
            for runner in self.runners:
                await runner.cleanup()
            if self.policy is not None:
                await self.policy.stop()

        self.run(down())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    # --- the trainer's side -------------------------------------------------------------------------------

    @property
    def internal_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.internal_token}"} if self.internal_token else {}

    def start_policy(self, answer: Answer) -> PolicyServer:
        port = int(self.config.trainer_url.rsplit(":", 1)[1])
        self.policy = PolicyServer(port, answer)
        self.run(self.policy.start())
        return self.policy

    def stop_policy(self) -> None:
        if self.policy is not None:
            self.run(self.policy.stop())

    def groups(self, step: int, attempt: int = 1, wait_seconds: float = 5.0) -> dict[str, Any]:
        body = {
            "step": step,
            "count": self.config.prompts_per_step,
            "attempt": attempt,
            "wait_seconds": wait_seconds,
        }
        response = requests.post(
            f"{self.internal_url}/internal/v1/groups",
            json=body,
            headers=self.internal_headers,
            timeout=wait_seconds + 30,
        )
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer

    def progress(
        self,
        step: int,
        *,
        attempt: int = 1,
        checkpoint: int | None = None,
        state: str = "training",
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"attempt": attempt, "step": step, "state": state, "checkpoint": None}
        if checkpoint is not None:
            body["checkpoint"] = {
                "name": f"step-{checkpoint}",
                "dir": f"/workspace/checkpoints/step-{checkpoint}",
                "step": checkpoint,
                "time": "2026-12-01T03:00:00Z",
            }
        response = requests.post(
            f"{self.internal_url}/internal/v1/progress", json=body, headers=self.internal_headers, timeout=30
        )
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer

    # --- the client's side (raw protocol) ----------------------------------------------------------------

    def arbor(
        self, route: str, body: dict[str, Any], prefix: str = "/v1", token: str | None = None
    ) -> requests.Response:
        """One fine-tuning route; ``token`` is sent the way Arbor's provider can: basic auth from api_base."""
        auth = ("dspy", token) if token is not None else None
        return requests.post(
            f"{self.client_url}{prefix}/fine_tuning/grpo/{route}", json=body, auth=auth, timeout=60
        )
