"""Multi-turn episodes (spec.environment) through a real vLLM server against the calculator environment of
examples/, synchronous (maxStaleness 0) against asynchronous (maxStaleness N), with an environment whose
every step takes ``--latency`` seconds more (a tool call that runs code or asks a service): per run the step
seconds, episodes per second, turns and tokens per episode, the environment step latency, how long the step
waited for its episodes and the share of the step in which episodes overlapped training.

    .venv/bin/python bench/episodes.py [--steps 10] [--latency 0.05] [--staleness 1] [--runs 1]

The latency is added inside the environment server, around the calculator's own step, so it is spent where a
real tool's would be: in the environment pod, concurrently across sessions (``--concurrency`` episodes at a
time). vLLM is PyPI's CPU build started with the operator's rendered args; the weights reach it through a
directory after every step. On 2 CPU cores vLLM, the trainer and the environment share the machine, so the
overlap can only hide time that none of them spends on a core: the environment's latency, not sampling.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run by path: `python bench/episodes.py`
    sys.path.insert(0, str(REPO))

from grpo_metric import MetricServer  # noqa: E402

from tests.harness import openenv_env, vllm_server  # noqa: E402
from tests.harness.ports import free_port  # noqa: E402
from tests.trainer.toy import fraction_of_target, read_jsonl, start_trainer  # noqa: E402
from tests.trainer.vllm_runs import environment_config, serve  # noqa: E402

CALCULATOR = REPO / "examples" / "environments" / "calculator"

# The calculator, unchanged, behind a step that first waits BENCH_STEP_LATENCY seconds.
SLOW_CALCULATOR = f"""
import os
import sys
import time

sys.path.insert(0, {str(CALCULATOR)!r})
import calculator_env as base
from openenv.core.env_server.http_server import create_app

LATENCY = float(os.environ["BENCH_STEP_LATENCY"])


class SlowCalculator(base.CalculatorEnvironment):
    def step(self, action, timeout_s=None, **extra):
        time.sleep(LATENCY)
        return super().step(action, timeout_s, **extra)


app = create_app(
    SlowCalculator, base.CalculatorAction, base.CalculatorObservation, env_name="calculator",
    max_concurrent_envs=base.MAX_SESSIONS,
)
"""


def run(
    work: Path,
    model: Path,
    server: vllm_server.VLLMProcess,
    metric: MetricServer,
    env_url: str,
    args: argparse.Namespace,
    staleness: int,
) -> dict[str, Any]:
    work.mkdir(parents=True)
    config = environment_config(
        work, model, metric, server, env_url, steps=args.steps,
        maxTurns=3, maxTurnTokens=6, maxObservationTokens=12, observationField="text",
        concurrency=args.concurrency, timeoutSeconds=30,
    )  # fmt: skip
    data = json.loads(config.read_text())
    data["grpo"].update(groupSize=args.group, promptsPerStep=args.prompts, seed=args.seed)
    data["trainer"]["perDeviceBatchSize"] = args.group
    data["checkpoints"]["everySteps"] = args.steps
    if staleness:
        data["grpo"]["maxStaleness"] = staleness
    config.write_text(json.dumps(data))
    started = time.monotonic()
    trainer = start_trainer(config, work / "trainer.log")
    code = trainer.wait(timeout=3600)
    wall = time.monotonic() - started
    if code != 0:
        raise SystemExit(
            f"maxStaleness {staleness}: trainer exited {code}:\n{(work / 'trainer.log').read_text()[-3000:]}"
        )
    rows = read_jsonl(work / "out" / "metrics.jsonl")
    if len(rows) != args.steps:
        raise SystemExit(f"maxStaleness {staleness}: {len(rows)} of {args.steps} steps trained")
    return {"staleness": staleness, "rows": rows, "wall_seconds": wall}


def report(result: dict[str, Any]) -> dict[str, Any]:
    # Step 1 loads the model and compiles nothing the others need: left out of the medians.
    rows = result["rows"][1:]

    def median(key: str) -> float | None:
        values = [float(r[key]) for r in rows if r.get(key) is not None]
        return round(statistics.median(values), 4) if values else None

    steps = sum(float(r["step_seconds"]) for r in rows)
    episodes = sum(int(r["episodes"]) for r in rows)
    return {
        "maxStaleness": result["staleness"],
        "step_seconds": median("step_seconds"),
        "steps_per_second": round(len(rows) / steps, 3) if steps else None,
        "episodes_per_second": round(episodes / steps, 2) if steps else None,
        "episodes_seconds": median("episodes_seconds"),
        "rollout_wait_seconds": median("rollout_wait_seconds"),
        "generation_overlap_ratio": median("generation_overlap_ratio"),
        "staleness_max": max((int(r.get("staleness", 0)) for r in rows), default=0),
        "episode_turns_mean": median("episode_turns_mean"),
        "episode_tokens_mean": median("episode_tokens_mean"),
        "environment_step_seconds_p50": median("environment_step_seconds_p50"),
        "environment_errors": sum(int(r["environment_errors"]) for r in rows),
        "reward_last": round(float(result["rows"][-1]["reward_mean"]), 4),
        "wall_seconds": round(result["wall_seconds"], 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--latency", type=float, default=0.05, help="seconds added to every environment step")
    parser.add_argument("--staleness", type=int, default=1, help="compared with maxStaleness 0")
    parser.add_argument("--runs", type=int, default=1, help="runs of each setting")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json", type=Path, help="also write the summaries here")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from grpo_trainer.tiny import build

    summaries = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-episodes-") as tmp_name,
        MetricServer(fraction_of_target) as metric,
    ):
        tmp = Path(tmp_name)
        model = build(tmp / "model", seed=0)
        (tmp / "env").mkdir()
        (tmp / "env" / "slow_calculator.py").write_text(SLOW_CALCULATOR)
        os.environ["BENCH_STEP_LATENCY"] = str(args.latency)
        env = openenv_env.serve(tmp / "env", free_port(), tmp / "env.log", app="slow_calculator:app")
        server = serve(model, tmp / "vllm")
        try:
            for attempt in range(args.runs):
                for staleness in (0, args.staleness):
                    result = run(
                        tmp / f"eta{staleness}-{attempt}", model, server, metric, env.url, args, staleness
                    )
                    summary = report(result)
                    print(json.dumps(summary), flush=True)
                    summaries.append(summary)
        finally:
            server.stop()
            env.stop()
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
