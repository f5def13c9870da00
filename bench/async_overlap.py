"""Does asynchronous GRPO pay when generation and training own separate devices? This machine imitates a
GPU cluster's split: the vLLM server runs on CPU core 0 only and the trainer (and the metric service the
benchmark serves) on core 1 only, each with one compute thread, so neither can borrow the other's core.
The same job then runs at maxStaleness 0, 1 and 2, several times each (one seed per run, the same seeds
for every η):

    .venv/bin/python bench/async_overlap.py [--runs 3] [--steps 12] [--tokens 32] [--etas 0 1 2]
        [--metric-delay 0.1] [--variant NAME:VAR=VALUE,...]

Per η it prints the medians over runs of steps per second (steps 2..S: step 1 samples before anything
can overlap it), the share of each step in which sampling overlapped training, the seconds the trainer
waited for groups (trainer idle) and the seconds of each step the server sampled nothing (generation idle),
the staleness, and the reward at the end of the run (mean of the last 3 steps) with its spread over runs.

The job trains at bf16 over fp32 master weights, as a GRPOJob does by default. The tiny model needs a
learning rate above a 7B model's to learn in a dozen steps: --lr (default 1e-3) sets it.

--metric-delay makes the metric service take that many seconds per batch (time.sleep: the service's own
latency, which costs the trainer no CPU), to see whether scoring hides behind sampling and training.

--variant runs every η once per variant, the trainer with the variables given, e.g. the sampler's switches
(grpo_trainer/async_generation.py): GRPO_ASYNC_STREAMED_SCORING=0 scores each step's groups in the step
instead of as they are sampled, GRPO_ASYNC_PUSH_INTERRUPTS=0 makes a weight push wait for the groups in
flight instead of interrupting them:

    .venv/bin/python bench/async_overlap.py --etas 1 --metric-delay 0.1 \
        --variant in-step:GRPO_ASYNC_STREAMED_SCORING=0 --variant streamed:
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run by path: `python bench/async_overlap.py`
    sys.path.insert(0, str(REPO))

from generation import run, start_server  # noqa: E402
from grpo_metric import MetricServer  # noqa: E402

from tests.trainer.toy import fraction_of_target  # noqa: E402

GENERATION_CORE = 0
TRAINER_CORE = 1


@contextlib.contextmanager
def pinned(core: int) -> Iterator[None]:
    """This process (and every process it starts meanwhile: affinity is inherited) on ``core`` only, one
    OpenMP and torch thread each."""
    before = os.sched_getaffinity(0)
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    os.sched_setaffinity(0, {core})
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def slow(delay: float) -> Any:
    """The toy reward with ``delay`` seconds of service latency per request: the items of one request are
    scored concurrently on the service's event loop, so each batch takes ``delay`` whatever its size."""
    if delay <= 0:
        return fraction_of_target

    async def score(example: dict[str, Any], completion: str) -> float:
        await asyncio.sleep(delay)
        return fraction_of_target(example, completion)

    return score


def figures(rows: list[dict[str, Any]]) -> dict[str, float]:
    """One run's figures over steps 2..S."""
    later = rows[1:] or rows
    busy = [
        r.get("generation_overlap_seconds", 0.0) + r.get("rollout_wait_seconds", 0.0)
        if "staleness" in r
        else r["generation_seconds"]
        for r in later
    ]
    idle_trainer = [r.get("rollout_wait_seconds", r["generation_seconds"]) for r in later]
    return {
        "steps_per_second": len(later) / sum(r["step_seconds"] for r in later),
        "step_seconds": statistics.median(r["step_seconds"] for r in later),
        "overlap_ratio": statistics.median(r.get("generation_overlap_ratio", 0.0) for r in later),
        "trainer_idle_seconds": statistics.median(idle_trainer),
        "generation_idle_seconds": statistics.median(
            max(0.0, r["step_seconds"] - b) for r, b in zip(later, busy, strict=True)
        ),
        # metrics.jsonl's metric_seconds is the run's total so far: each step's is the difference.
        "metric_seconds": statistics.median(
            [b.get("metric_seconds", 0.0) - a.get("metric_seconds", 0.0) for a, b in itertools.pairwise(rows)]
            or [rows[0].get("metric_seconds", 0.0)]
        ),
        "push_wait_seconds": statistics.median(r.get("push_wait_seconds", 0.0) for r in later),
        "push_wait_seconds_mean": statistics.mean(r.get("push_wait_seconds", 0.0) for r in later),
        "importance_masked_ratio": statistics.mean(
            r.get("importance_sampling_masked_ratio") or 0.0 for r in later
        ),
        "groups_resampled": sum(r.get("groups_resampled", 0) for r in rows),
        "groups_scored_ahead_ratio": sum(r.get("groups_scored_ahead", 0) for r in later)
        / max(1, sum(r.get("rollouts", 0) for r in later)),
        "staleness_max": max((r.get("staleness", 0) for r in rows), default=0),
        "groups_dropped": sum(r.get("groups_dropped", 0) for r in rows),
        "reward_end": statistics.mean(r["reward_mean"] for r in rows[-3:]),
        "reward_start": statistics.mean(r["reward_mean"] for r in rows[:3]),
    }


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, assignments = text.partition(":")
    env = dict(a.split("=", 1) for a in assignments.split(",") if a)
    return name, env


Curve = list[tuple[float, float]]


def curve(rows: list[dict[str, Any]]) -> Curve:
    """(seconds since the run's first step began, reward) at the end of each step."""
    return [
        (t, r["reward_mean"])
        for t, r in zip(itertools.accumulate(r["step_seconds"] for r in rows), rows, strict=True)
    ]


def reward_at(points: Curve, seconds: float) -> float:
    """The mean reward of the last 3 steps that ended within ``seconds``."""
    within = [reward for t, reward in points if t <= seconds] or [points[0][1]]
    return statistics.mean(within[-3:])


def table(
    per_eta: dict[tuple[str, int], list[dict[str, float]]], curves: dict[tuple[str, int], list[Curve]]
) -> list[dict[str, Any]]:
    base = statistics.median(f["steps_per_second"] for f in next(iter(per_eta.values())))
    first = next(iter(curves.values()))
    out = []
    for (name, eta), runs in per_eta.items():
        # The first row's job (η = 0 first), given the seconds this one took for its S steps: its reward then.
        spent = statistics.median(c[-1][0] for c in curves[(name, eta)])
        same_time = [reward_at(c, spent) for c in first]
        ends = [f["reward_end"] for f in runs]
        sps = statistics.median(f["steps_per_second"] for f in runs)
        out.append(
            {
                **({"variant": name} if name else {}),
                "eta": eta,
                "runs": len(runs),
                "steps_per_second": round(sps, 3),
                "speedup": round(sps / base, 2),
                "steps_per_second_runs": [round(f["steps_per_second"], 3) for f in runs],
                **{
                    k: round(statistics.median(f[k] for f in runs), 3)
                    for k in (
                        "step_seconds",
                        "overlap_ratio",
                        "trainer_idle_seconds",
                        "generation_idle_seconds",
                        "metric_seconds",
                        "push_wait_seconds",
                        "push_wait_seconds_mean",
                        "importance_masked_ratio",
                        "groups_scored_ahead_ratio",
                    )
                },
                "staleness_max": max(f["staleness_max"] for f in runs),
                "groups_dropped": sum(f["groups_dropped"] for f in runs),
                "groups_resampled": sum(f["groups_resampled"] for f in runs),
                "reward_start": round(statistics.mean(f["reward_start"] for f in runs), 3),
                "reward_end": round(statistics.mean(ends), 3),
                "reward_end_spread": [round(min(ends), 3), round(max(ends), 3)],
                "seconds": round(spent, 2),
                "first_row_reward_at_these_seconds": round(statistics.mean(same_time), 3),
            }
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--etas", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--metric-delay", type=float, default=0.0)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--variant", action="append", default=[], help="NAME:VAR=VALUE,... (see above)")
    parser.add_argument("--json", type=Path, help="also write the table here")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit(
            "this benchmark pins vLLM and the trainer to two different cores; this process has one"
        )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from grpo_trainer.tiny import build

    started = time.monotonic()
    variants = [parse_variant(v) for v in args.variant] or [("", {})]
    curves: dict[tuple[str, int], list[Curve]] = {}
    per_eta: dict[tuple[str, int], list[dict[str, float]]] = {
        (n, eta): [] for n, _ in variants for eta in args.etas
    }
    with tempfile.TemporaryDirectory(prefix="bench-async-overlap-") as tmp:
        model = build(Path(tmp) / "model", seed=0, hidden_size=args.hidden_size, layers=args.layers)
        with pinned(GENERATION_CORE):
            server, startup = start_server(model, Path(tmp) / "server")
        print(f"vLLM on core {GENERATION_CORE}: /health after {startup:.0f}s", flush=True)
        try:
            with pinned(TRAINER_CORE), MetricServer(slow(args.metric_delay)) as metric:
                for run_index in range(args.runs):
                    for name, env in variants:
                        for eta in args.etas:
                            args.seed = 42 + run_index
                            overrides: dict[str, dict[str, Any]] = {
                                "model": {"dtype": "bfloat16"},
                                "grpo": {"learningRate": args.lr},
                            }
                            work = Path(tmp) / f"{name or 'run'}-eta{eta}-run{run_index}"
                            saved = {k: os.environ.get(k) for k in env}
                            os.environ.update(env)
                            try:
                                result = run("vllm", model, work, metric, args, [server], eta, overrides)
                            finally:
                                for k, v in saved.items():
                                    if v is None:
                                        os.environ.pop(k, None)
                                    else:
                                        os.environ[k] = v
                            f = figures(result["rows"])
                            per_eta[(name, eta)].append(f)
                            curves.setdefault((name, eta), []).append(curve(result["rows"]))
                            shown = json.dumps({k: round(v, 3) for k, v in f.items()})
                            print(f"{name} eta {eta} run {run_index + 1}: {shown}", flush=True)
        finally:
            server.stop()
    rows = table(per_eta, curves)
    print(f"\nvLLM pinned to core {GENERATION_CORE}, trainer and metric to core {TRAINER_CORE}; {args.steps} steps "
          f"of {args.prompts} prompts x {args.group} completions of <= {args.tokens} tokens; medians over runs")  # fmt: skip
    for row in rows:
        print(json.dumps(row))
    print(f"total {time.monotonic() - started:.0f}s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
