"""DDP against FSDP2 at two ranks on the CPU (gloo): median step time, per-rank peak resident memory and the
training state rank 0 holds, for the real trainer (``python -m grpo_trainer`` under torchrun, in-process
generation, the toy metric over HTTP).

    .venv/bin/python bench/sharding.py                          # hidden 512, 8 layers (~19M parameters)
    .venv/bin/python bench/sharding.py --hidden 1024 --layers 8 --steps 6 --dtype float32

Prints one line per mode and a JSON summary. Peak memory is the largest VmHWM (resident high-water mark) of
each rank process, polled while it runs: the whole process (torch, Python, the model's activations), not
only parameters, gradients and optimizer state, which ``rank_state_bytes`` (metrics.jsonl) counts exactly.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grpo_metric import MetricServer

from tests.trainer.toy import (
    REPO,
    fraction_of_target,
    read_jsonl,
    torchrun_command,
    trainer_config,
    trainer_env,
)


def _peak_rss(root: Any) -> dict[int, int]:
    """VmHWM of every descendant of ``root`` (the torchrun agent's rank processes), by pid."""
    peaks: dict[int, int] = {}
    for child in root.children(recursive=True):
        try:
            for line in Path(f"/proc/{child.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peaks[child.pid] = int(line.split()[1]) * 1024
        except OSError:
            continue
    return peaks


def run_mode(
    work: Path, model: Path, metric_url: str, sharding: str, options: argparse.Namespace
) -> dict[str, Any]:
    import psutil

    workdir = work / sharding
    config = trainer_config(
        workdir, model, metric_url, steps=options.steps, every_steps=options.steps, learning_rate=1e-6
    )
    body = json.loads(config.read_text())
    body["model"]["dtype"] = options.dtype
    body["trainer"].update(perDeviceBatchSize=4, gpusPerNode=2, sharding=sharding)
    config.write_text(json.dumps(body))
    command = torchrun_command(2)
    log = (workdir / "trainer.log").open("wb")
    process = subprocess.Popen(command, cwd=REPO, env=trainer_env(config), stdout=log, stderr=log)
    agent = psutil.Process(process.pid)
    peaks: dict[int, int] = {}
    while process.poll() is None:
        for pid, peak in _peak_rss(agent).items():
            peaks[pid] = max(peak, peaks.get(pid, 0))
        time.sleep(0.2)
    if process.returncode != 0:
        raise SystemExit(f"{sharding} run failed: {(workdir / 'trainer.log').read_text()[-3000:]}")
    records = read_jsonl(workdir / "out" / "metrics.jsonl")
    # The first step pays for start-up work (compilation of kernels, first allocations).
    steps = [r["step_seconds"] for r in records[1:]] or [r["step_seconds"] for r in records]
    return {
        "median_step_seconds": round(statistics.median(steps), 4),
        "peak_rss_bytes_per_rank": sorted(peaks.values(), reverse=True)[:2],
        "rank0_state_bytes": records[0].get("rank_state_bytes"),
        "losses": [r["loss"] for r in records],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    options = parser.parse_args(argv)
    from grpo_trainer.tiny import build

    results: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="grpo-sharding-") as tmp,
        MetricServer(fraction_of_target) as metric,
    ):
        work = Path(tmp)
        model = build(work / "model", hidden_size=options.hidden, layers=options.layers)
        for sharding in ("DDP", "FSDP"):
            results[sharding] = run_mode(work, model, metric.url, sharding, options)
            r = results[sharding]
            state = r["rank0_state_bytes"] or {}
            print(
                f"{sharding}: median step {r['median_step_seconds']:.3f} s; peak RSS per rank "
                f"{', '.join(f'{b / 2**20:.0f} MiB' for b in r['peak_rss_bytes_per_rank'])}; rank 0 holds "
                + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in state.items()),
                flush=True,
            )
    print(json.dumps({"model": {"hidden": options.hidden, "layers": options.layers}, **results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
