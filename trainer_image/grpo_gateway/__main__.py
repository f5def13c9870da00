"""``python -m grpo_gateway``: serve the rollout gateway of the job named in $GRPO_GATEWAY_CONFIG."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from grpo_operator.api.gateway_config import GATEWAY_CONFIG_ENV, GatewayConfig
from pydantic import ValidationError

from grpo_gateway.app import make_gateway, start

log = logging.getLogger("grpo_gateway")


async def serve(config: GatewayConfig) -> None:
    gateway = make_gateway(config)
    runners = await start(gateway)
    log.info(
        "rollout gateway of job %s: client port %s (Arbor + OpenAI), internal port %s, trainer at %s, "
        "G=%s B=%s S=%s",
        gateway.state.job_id,
        config.client_port,
        config.internal_port,
        config.trainer_url,
        config.group_size,
        config.prompts_per_step,
        config.steps,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for runner in runners:
        await runner.cleanup()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    path = os.environ.get(GATEWAY_CONFIG_ENV)
    if not path:
        print(
            f"{GATEWAY_CONFIG_ENV} is not set: it names the gateway.json the operator renders",
            file=sys.stderr,
        )
        return 2
    try:
        config = GatewayConfig.load(path)
    except (OSError, ValidationError) as exc:
        print(f"cannot read {path}: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
