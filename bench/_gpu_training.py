"""The GPU check's training checks at production numerics (bench/gpu_check.py): bf16 at lr 1e-6 against a
float32 run, and spec.trainer.sharding FSDP on one GPU with and without cpuOffload. Each takes the
gpu_check Checker (its work directory, sizes, metric and run helpers) and returns the check's JSON."""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

from tests.trainer.toy import REPO, read_jsonl, torchrun_command, trainer_env
from tests.trainer.weights import changed_fraction, changed_overall, load_weights, saved_dtypes, update_cosine


def production_numerics(checker: Any) -> dict[str, Any]:
    """model.dtype bfloat16 at lr 1e-6 on a model with HF's default init (the overhead check's size): the
    fraction of weight elements the first step changed, and the cosine of steps 1->3 with a float32 run."""
    from grpo_trainer.tiny import build

    model = build(
        checker.work / "numerics-model", hidden_size=checker.sizes.hidden_size, layers=checker.sizes.layers
    )
    runs: dict[str, Any] = {}
    for dtype in ("bfloat16", "float32"):
        workdir, config = checker.config(
            f"numerics_{dtype}",
            steps=3,
            every_steps=1,
            model=model,
            dtype=dtype,
            learning_rate=1e-6,
            keep_last=3,
        )
        runs[dtype] = checker.run(workdir, config)
    out: dict[str, Any] = {
        dtype: {"exit_code": run.code, "steps": len(run.records)} for dtype, run in runs.items()
    }
    if any(run.code != 0 or len(run.records) != 3 for run in runs.values()):
        out["ok"] = False
        out["log_tail"] = next(
            run.log_tail for run in runs.values() if run.code != 0 or len(run.records) != 3
        )
        return out
    bf16, fp32 = (runs[d].workdir / "ckpt" for d in ("bfloat16", "float32"))
    initial, step1 = load_weights(model), load_weights(bf16 / "step-1")
    norms = [f for name, f in changed_fraction(initial, step1).items() if "norm" in name]
    cosine, ratio = update_cosine(
        step1, load_weights(bf16 / "step-3"), load_weights(fp32 / "step-1"), load_weights(fp32 / "step-3")
    )
    out.update(
        changed_in_step_1=round(changed_overall(initial, step1), 5),
        least_changed_norm_tensor=round(min(norms), 5),
        cosine_steps_1_3_with_fp32=round(cosine, 5),
        norm_ratio_steps_1_3_with_fp32=round(ratio, 5),
        checkpoint_dtype=sorted(saved_dtypes(bf16 / "step-1")),
        median_step_seconds=median([r["step_seconds"] for r in runs["bfloat16"].records]),
        gpu_memory_peak_bytes=peak(runs["bfloat16"].records),
    )
    out["ok"] = out["changed_in_step_1"] >= 0.99 and min(norms) >= 0.99 and cosine >= 0.99
    return out


def fsdp(checker: Any, hidden_size: int, layers: int, offload: bool) -> dict[str, Any]:
    """spec.trainer.sharding FSDP on this one GPU (torchrun, one process), with and without cpuOffload, on
    a model of the given shape in bf16 at lr 1e-6: exit code (8 when the memory plan refuses it), median
    step time, peak GPU memory, what the rank holds, and the fraction of sampled masters each step moved."""
    from grpo_trainer.tiny import build

    name = f"fsdp_h{hidden_size}_l{layers}"
    model = checker.work / f"{name}-model"
    if not model.is_dir():
        build(
            model,
            hidden_size=hidden_size,
            layers=layers,
            dtype="bfloat16",
            device="cuda" if checker.cuda else "cpu",
        )
    steps = 3
    workdir, config = checker.config(
        f"{name}{'_offload' if offload else ''}",
        steps=steps,
        every_steps=steps,
        model=model,
        dtype="bfloat16",
        learning_rate=1e-6,
        completion_tokens=checker.sizes.completion_tokens,
    )
    raw = json.loads(config.read_text())
    raw["trainer"].update(sharding="FSDP", cpuOffload=offload, perDeviceBatchSize=8)
    config.write_text(json.dumps(raw, indent=2))
    log = workdir / "trainer.log"
    command = torchrun_command(1)
    with log.open("wb") as handle:
        process = subprocess.Popen(command, cwd=REPO, env=trainer_env(config), stdout=handle, stderr=handle)
        try:
            code = process.wait(timeout=checker.sizes.timeout_seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
    records = read_jsonl(workdir / "out" / "metrics.jsonl")
    out: dict[str, Any] = {
        "parameters": parameter_count(model),
        "cpu_offload": offload,
        "exit_code": code,
        "steps": len(records),
        "median_step_seconds": median([r["step_seconds"] for r in records[1:] or records]),
        "gpu_memory_peak_bytes": peak(records),
        "rank_state_bytes": records[0].get("rank_state_bytes") if records else None,
        "updated_fraction": [r.get("updated_fraction") for r in records],
    }
    # A plan that does not fit the GPU is an answer, not a failure: exit 8 says which settings would.
    out["ok"] = (code == 0 and len(records) == steps) or code == 8
    if code != 0:
        out["log_tail"] = log.read_text()[-2000:]
    return out


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def peak(records: list[dict[str, Any]]) -> int | None:
    peaks = [int(r["gpu_memory_peak_bytes"]) for r in records if r.get("gpu_memory_peak_bytes") is not None]
    return max(peaks) if peaks else None


def parameter_count(model: Path) -> int:
    """Parameters of a saved model, from its safetensors headers (one file or several)."""
    from safetensors import safe_open

    total = 0
    for shard in sorted(model.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118
                count = 1
                for dim in handle.get_slice(key).get_shape():
                    count *= int(dim)
                total += count
    return total
