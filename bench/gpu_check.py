"""The trainer on a real GPU, end to end, in one JSON file.

    make gpu-check                                  # or: .venv/bin/python -m bench.gpu_check [--out PATH]
    .venv/bin/python -m bench.gpu_check --cpu-smoke # tiny sizes, few steps: the code paths, on the CPU

Checks, each a real ``python -m grpo_trainer`` process (the toy metric served over HTTP by the metric SDK):

* ``learning``: the toy task of tests/trainer/toy.py; the mean reward must rise to >= 0.8;
* ``kill_resume``: SIGKILL after the first checkpoint, start again: every step logged once;
* ``dtype_<d>``: full fine-tuning in bfloat16, float16 (fp32 master weights under fp16 autocast) and
  float32: exit 0, every loss finite, and the dtype the checkpoint's weights were saved in;
* ``production_numerics``: ``model.dtype: bfloat16`` at lr 1e-6 on a model with Hugging Face's default
  init (the overhead model's size): at least 99 % of the weight elements (every norm weight included) change
  in step 1, and the update from step 1 to 3 has a cosine of at least 0.99 with a float32 run's;
* ``fsdp_<size>[_offload]``: spec.trainer.sharding FSDP on one GPU (torchrun, one process), without and with
  cpuOffload, for a ~1B and a ~7B-shaped model in bf16 at lr 1e-6: step time, peak GPU memory, the state the
  rank holds and the fraction of sampled masters each step moved (exit 8, the memory plan refusing a shape
  that does not fit, is reported as such);
* ``lora``: LoRA adapters train and are checkpointed;
* ``overhead``: step time and peak GPU memory of this trainer against bare TRL (bench/trainer_overhead.py)
  on a ~150M-parameter model, runs interleaved (bare, ours, bare, ours), warm-up steps left out;
* ``served_weights_<transport>``: the trainer against a real vLLM server started with the args the
  operator renders, for a few steps: after every weight sync the served model's log-probabilities must
  equal the trained model's (the trainer's own probe, output/weight_syncs.jsonl); the sync's duration and
  its bytes (parameters x the served dtype's size) are reported. ``volume``: vLLM and the trainer share one
  GPU. ``nccl`` (TRL's transport): vLLM on GPU 0 and the trainer on GPU 1, because the two are ranks of one
  NCCL group and NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); with fewer than 2 GPUs it is
  not run, saying why. ``broadcast_2`` (bench/_gpu_broadcast.py): weightSync Broadcast to two replicas on
  GPUs 0 and 1, the trainer on GPU 2 (NCCL), not run with fewer than 3 GPUs. --cpu-smoke: Volume and
  Broadcast (gloo) through vLLM's CPU build. Without the vllm package these are not run, saying so.
* ``async_overlap``: maxStaleness 0 against 1, vLLM on GPU 0, the trainer on GPU 1 (bench/_gpu_async.py).

A check that cannot run is "not run: <reason>" (``not_run``), not a failure. ``--only a,b``; exit 1 on failure.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grpo_metric import MetricServer

if __package__ in (None, ""):
    # Run as `python bench/gpu_check.py`: Python puts bench/ first on the path, not the repository root that
    # holds the `bench` and `tests` packages this script imports.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _gpu_async as gpu_async
from bench import _gpu_broadcast as gpu_broadcast
from bench import _gpu_training as gpu_training
from bench._gpu_training import median, parameter_count, peak
from bench.trainer_overhead import bare_trl
from tests.harness.ports import free_port
from tests.trainer.toy import (
    REPO,
    fraction_of_target,
    read_jsonl,
    start_trainer,
    trainer_config,
    write_dataset,
)

DEFAULT_OUT = REPO / "out" / "gpu-check.json"
# GPUs the NCCL weight-sync check needs: vLLM's worker and trainer rank 0 are two ranks of one NCCL group,
# and NCCL refuses two ranks of a group on the same device.
NCCL_GPUS = 2


@dataclass(frozen=True)
class Sizes:
    learn_steps: int
    resume_steps: int
    dtype_steps: int
    measured_steps: int
    warmup_steps: int
    rounds: int
    # The overhead model: tiny.build(hidden_size, layers) with the character tokenizer.
    hidden_size: int
    layers: int
    completion_tokens: int
    timeout_seconds: float
    # The FSDP checks' models: label -> (hidden_size, layers) of tiny.build (MLP 2x hidden, heads of 32).
    fsdp_models: dict[str, tuple[int, int]]


# hidden 1024 x 16 layers: ~151M parameters (tiny.build: MLP 2x hidden, heads of 32, half as many KV heads).
GPU = Sizes(
    learn_steps=30,
    resume_steps=8,
    dtype_steps=6,
    measured_steps=20,
    warmup_steps=3,
    rounds=2,
    hidden_size=1024,
    layers=16,
    completion_tokens=64,
    timeout_seconds=900,
    # ~0.9B and ~6.6B parameters.
    fsdp_models={"1b": (2048, 24), "7b": (4096, 44)},
)
SMOKE = Sizes(
    learn_steps=3,
    resume_steps=4,
    dtype_steps=2,
    measured_steps=2,
    warmup_steps=1,
    rounds=1,
    hidden_size=64,
    layers=2,
    completion_tokens=8,
    timeout_seconds=600,
    fsdp_models={"tiny": (64, 2)},
)


@dataclass
class Run:
    code: int
    records: list[dict[str, Any]]
    log_tail: str
    workdir: Path

    def manifest(self) -> dict[str, Any] | None:
        path = self.workdir / "ckpt" / "latest.json"
        return json.loads(path.read_text()) if path.is_file() else None


class Checker:
    def __init__(self, work: Path, model: Path, metric_url: str, sizes: Sizes, cuda: bool):
        self.work, self.model, self.metric_url, self.sizes, self.cuda = work, model, metric_url, sizes, cuda
        self.default_dtype = "bfloat16" if cuda else "float32"

    def config(
        self,
        name: str,
        *,
        steps: int,
        every_steps: int,
        model: Path | None = None,
        dtype: str | None = None,
        lora: bool = False,
        completion_tokens: int = 8,
        learning_rate: float = 0.02,
        keep_last: int = 2,
    ) -> tuple[Path, Path]:
        workdir = self.work / name
        workdir.mkdir(parents=True, exist_ok=True)
        path = trainer_config(
            workdir,
            model or self.model,
            self.metric_url,
            steps=steps,
            every_steps=every_steps,
            keep_last=keep_last,
            learning_rate=learning_rate,
            max_completion_length=completion_tokens,
            job=("gpu-check", name.replace("_", "-")),
        )
        raw = json.loads(path.read_text())
        raw["model"]["dtype"] = dtype or self.default_dtype
        if lora:
            raw["grpo"]["lora"] = {
                "enabled": True,
                "r": 8,
                "alpha": 16,
                "targetModules": ["q_proj", "v_proj"],
            }
        path.write_text(json.dumps(raw, indent=2))
        return workdir, path

    def run(self, workdir: Path, config: Path, name: str = "trainer", **env: str) -> Run:
        log = workdir / f"{name}.log"
        process = start_trainer(config, log, **env)
        try:
            code = process.wait(timeout=self.sizes.timeout_seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        return Run(code, read_jsonl(workdir / "out" / "metrics.jsonl"), log.read_text()[-2000:], workdir)

    # -- checks ------------------------------------------------------------------------------------------

    def learning(self) -> dict[str, Any]:
        steps = self.sizes.learn_steps
        workdir, config = self.config("learning", steps=steps, every_steps=steps, dtype="float32")
        run = self.run(workdir, config)
        rewards = [r["reward_mean"] for r in run.records]
        learned = bool(rewards) and rewards[0] < 0.3 and max(rewards[-5:]) >= 0.8
        out: dict[str, Any] = {"exit_code": run.code, "steps": len(rewards), "rewards": rewards}
        out["learned"] = learned
        # A few CPU smoke steps cannot learn the task; there the check is that the run completes.
        out["ok"] = run.code == 0 and len(rewards) == steps and (learned or self.sizes is SMOKE)
        if not out["ok"]:
            out["log_tail"] = run.log_tail
        return out

    def kill_resume(self) -> dict[str, Any]:
        steps = self.sizes.resume_steps
        workdir, config = self.config("kill_resume", steps=steps, every_steps=2)
        process = start_trainer(config, workdir / "killed.log")
        manifest = workdir / "ckpt" / "latest.json"
        deadline = time.monotonic() + self.sizes.timeout_seconds
        while time.monotonic() < deadline and not manifest.is_file() and process.poll() is None:
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait()
        killed_at = json.loads(manifest.read_text())["step"] if manifest.is_file() else None
        run = self.run(workdir, config, "resumed")
        logged = [r["step"] for r in run.records]
        final = run.manifest()
        out: dict[str, Any] = {
            "killed_after_checkpoint_step": killed_at,
            "exit_code": run.code,
            "steps_logged": logged,
            "final_checkpoint_step": final["step"] if final else None,
        }
        out["ok"] = (
            killed_at is not None
            and run.code == 0
            and logged == list(range(1, steps + 1))
            and out["final_checkpoint_step"] == steps
        )
        if not out["ok"]:
            out["log_tail"] = run.log_tail
        return out

    def full_fine_tuning(self, dtype: str) -> dict[str, Any]:
        steps = self.sizes.dtype_steps
        workdir, config = self.config(f"dtype_{dtype}", steps=steps, every_steps=steps, dtype=dtype)
        run = self.run(workdir, config)
        losses = [r["loss"] for r in run.records]
        manifest = run.manifest()
        out: dict[str, Any] = {
            "exit_code": run.code,
            "steps": len(run.records),
            "losses": losses,
            "median_step_seconds": median([r["step_seconds"] for r in run.records]),
            "saved_weights_dtype": _weights_dtype(Path(manifest["path"])) if manifest else None,
            "gpu_memory_peak_bytes": peak(run.records),
        }
        out["ok"] = run.code == 0 and len(losses) == steps and all(v is not None for v in losses)
        if not out["ok"]:
            out["log_tail"] = run.log_tail
        return out

    def production_numerics(self) -> dict[str, Any]:
        return gpu_training.production_numerics(self)

    def fsdp(self, hidden_size: int, layers: int, offload: bool) -> dict[str, Any]:
        return gpu_training.fsdp(self, hidden_size, layers, offload)

    def lora(self) -> dict[str, Any]:
        steps = self.sizes.dtype_steps
        workdir, config = self.config("lora", steps=steps, every_steps=steps, lora=True)
        run = self.run(workdir, config)
        manifest = run.manifest()
        adapter = bool(manifest) and (Path(manifest["path"]) / "adapter_model.safetensors").is_file()  # type: ignore[index]
        out: dict[str, Any] = {
            "exit_code": run.code,
            "steps": len(run.records),
            "adapter_in_checkpoint": adapter,
            "median_step_seconds": median([r["step_seconds"] for r in run.records]),
            "gpu_memory_peak_bytes": peak(run.records),
        }
        out["ok"] = run.code == 0 and len(run.records) == steps and adapter
        if not out["ok"]:
            out["log_tail"] = run.log_tail
        return out

    def served_weights(self, transport: str) -> dict[str, Any]:
        from tests.harness import vllm_server

        steps = 3
        nccl = transport == "nccl"
        workdir, config = self.config(f"served_{transport}", steps=steps, every_steps=steps)
        container = vllm_server.rendered_container(
            str(self.model),
            weightSync="NCCL" if nccl else "Volume",
            # NCCL: vLLM has GPU 0 to itself (the trainer is on GPU 1); Volume: the trainer shares its GPU.
            gpuMemoryUtilization=0.9 if nccl else 0.3,
        )
        env = {**vllm_server.container_env(container), "HF_HOME": str(workdir / "hf")}
        trainer_env: dict[str, str] = {}
        if nccl:
            env["CUDA_VISIBLE_DEVICES"], trainer_env["CUDA_VISIBLE_DEVICES"] = "0", "1"
        python = sys.executable if self.cuda else None  # on the CPU: the vLLM CPU build's own venv
        server = vllm_server.start(container, env, free_port(), workdir / "vllm.log", python=python)
        try:
            startup = server.wait_healthy(self.sizes.timeout_seconds)
            raw = json.loads(config.read_text())
            raw["generation"] = {
                "backend": "vllm-server",
                "serverHost": "127.0.0.1",
                "serverPort": server.port,
                "startupTimeoutSeconds": 60,
                **(
                    {"weightSyncPort": free_port()}
                    if transport == "nccl"
                    else {"weightSync": "volume", "weightSyncDir": str(workdir / "weight-sync")}
                ),
            }
            config.write_text(json.dumps(raw, indent=2))
            run = self.run(workdir, config, **trainer_env)
        finally:
            server.stop()
        syncs = read_jsonl(workdir / "out" / "weight_syncs.jsonl")
        out: dict[str, Any] = {
            "exit_code": run.code,
            "vllm_startup_seconds": round(startup, 1),
            "syncs": len(syncs),
            "median_sync_seconds": median([s["seconds"] for s in syncs]),
            # Every parameter once, in the dtype vLLM serves (never the fp32 masters).
            "bytes_per_sync": parameter_count(self.model) * _dtype_bytes(raw["model"]["dtype"]),
            "largest_logprob_diff": max((s.get("logprob_diff", 0.0) for s in syncs), default=None),
            "median_generation_seconds": median([r["generation_seconds"] for r in run.records]),
        }
        out["ok"] = run.code == 0 and len(syncs) >= steps and all(s.get("in_sync") for s in syncs)
        if not out["ok"]:
            out["log_tail"] = run.log_tail
            out["vllm_log_tail"] = server.log_tail(20)
        return out

    def overhead(self) -> dict[str, Any]:
        from grpo_trainer.tiny import build

        s = self.sizes
        model = build(self.work / "overhead-model", hidden_size=s.hidden_size, layers=s.layers)
        parameters = parameter_count(model)
        steps = s.warmup_steps + s.measured_steps
        data = write_dataset(self.work / "overhead-data.jsonl")
        bare: list[float] = []
        ours: list[float] = []
        bare_peak: list[int] = []
        ours_peak: list[int] = []
        codes: list[int] = []
        for round_ in range(s.rounds):  # interleaved, so drift (clocks, thermals) hits both alike
            result = _bare_worker(
                model, data, self.work / f"bare-{round_}", steps, self.cuda, self.default_dtype, s
            )
            bare += result["durations"][s.warmup_steps :]
            if result["peak_bytes"] is not None:
                bare_peak.append(result["peak_bytes"])
            workdir, config = self.config(
                f"overhead_{round_}",
                steps=steps,
                every_steps=1_000_000,  # only the final step checkpoints, after the measurement
                model=model,
                completion_tokens=s.completion_tokens,
            )
            run = self.run(workdir, config)
            codes.append(run.code)
            ours += [r["step_seconds"] for r in run.records][s.warmup_steps :]
            run_peak = peak(run.records)
            if run_peak is not None:
                ours_peak.append(run_peak)
        bare_median, ours_median = median(bare), median(ours)
        out: dict[str, Any] = {
            "parameters": parameters,
            "completion_tokens": s.completion_tokens,
            "rounds": s.rounds,
            "warmup_steps_left_out": s.warmup_steps,
            "measured_steps": {"bare_trl": len(bare), "this_trainer": len(ours)},
            "median_step_seconds": {"bare_trl": bare_median, "this_trainer": ours_median},
            "step_time_ratio": ours_median / bare_median if bare_median and ours_median else None,
            "gpu_memory_peak_bytes": {
                "bare_trl": max(bare_peak) if bare_peak else None,
                "this_trainer": max(ours_peak) if ours_peak else None,
            },
            "exit_codes": codes,
        }
        out["ok"] = all(c == 0 for c in codes) and len(ours) == len(bare) == s.rounds * s.measured_steps
        return out


def _dtype_bytes(dtype: str) -> int:
    import torch

    return int(torch.empty(0, dtype=getattr(torch, dtype)).element_size())


def not_run_reason(name: str, cuda: bool, gpus: int, smoke: bool) -> str | None:
    """Why check ``name`` cannot run on this machine (None: it can). Decided before anything is built, so a
    machine without CUDA or vLLM lists every check with its reason instead of failing."""
    import importlib.util

    if name == "served_weights_broadcast_2" and cuda and gpus < gpu_broadcast.BROADCAST_GPUS:
        return (
            f"needs {gpu_broadcast.BROADCAST_GPUS} GPUs, this machine has {gpus}: two vLLM replicas and the "
            "trainer, each on its own GPU (NCCL refuses two ranks on one GPU)"
        )
    if name == "async_overlap" and (not cuda or gpus < NCCL_GPUS or importlib.util.find_spec("vllm") is None):
        return (
            "needs 2 GPUs (vLLM and the trainer apart) and vLLM; bench/async_overlap.py compares on 2 cores"
        )
    if not cuda and not smoke:
        return "no CUDA device here (--cpu-smoke runs the code paths on the CPU with tiny sizes)"
    if name == "served_weights_nccl":
        if not cuda:
            return "needs CUDA: NCCL has no CPU transport (--cpu-smoke checks the Volume transport only)"
        if gpus < NCCL_GPUS:
            return (
                f"needs {NCCL_GPUS} GPUs, this machine has {gpus}: vLLM and trainer rank 0 are two ranks of one "
                "NCCL group, and NCCL refuses two ranks on the same GPU ('Duplicate GPU detected')"
            )
    if name.startswith("served_weights_") and cuda and importlib.util.find_spec("vllm") is None:
        return (
            "the vllm package is not installed in this environment: the served-weights checks need a vLLM "
            "server beside the trainer"
        )
    return None


def check_plan(sizes: Sizes) -> list[tuple[str, Callable[[Checker], dict[str, Any]]]]:
    """Every check by name, in the order they run."""
    plan: list[tuple[str, Callable[[Checker], dict[str, Any]]]] = [
        ("learning", Checker.learning),
        ("kill_resume", Checker.kill_resume),
        *[
            (f"dtype_{dtype}", lambda c, d=dtype: c.full_fine_tuning(d))
            for dtype in ("bfloat16", "float16", "float32")
        ],
        ("production_numerics", Checker.production_numerics),
        *[
            (f"fsdp_{label}{'_offload' if offload else ''}", lambda c, h=h, n=n, o=offload: c.fsdp(h, n, o))
            for label, (h, n) in sizes.fsdp_models.items()
            for offload in (False, True)
        ],
        ("lora", Checker.lora),
        ("overhead", Checker.overhead),
    ]
    for transport in ("nccl", "volume"):
        plan.append(
            (f"served_weights_{transport}", functools.partial(Checker.served_weights, transport=transport))
        )
    plan.append(("served_weights_broadcast_2", gpu_broadcast.served_weights_broadcast_2))
    plan.append(("async_overlap", gpu_async.async_overlap))
    return plan


def _weights_dtype(checkpoint: Path) -> str | None:
    from safetensors import safe_open

    path = checkpoint / "model.safetensors"
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as handle:
        dtypes = {str(handle.get_slice(key).get_dtype()) for key in handle.keys()}  # noqa: SIM118
    return ",".join(sorted(dtypes))


def _bare_worker(
    model: Path, data: Path, out: Path, steps: int, cuda: bool, dtype: str, sizes: Sizes
) -> dict[str, Any]:
    """Bare TRL in its own process, so its peak GPU memory is its own."""
    request = {
        "model": str(model),
        "data": str(data),
        "out": str(out),
        "steps": steps,
        "cuda": cuda,
        "dtype": dtype,
        "completion_tokens": sizes.completion_tokens,
    }
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "KUBECONFIG")}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--bare-worker", json.dumps(request)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=sizes.timeout_seconds,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"bare TRL failed (exit {result.returncode}): {result.stderr[-2000:]}")
    answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return answer


def bare_worker_main(request_json: str) -> None:
    import torch

    request = json.loads(request_json)
    torch.set_num_threads(1)
    durations = bare_trl(
        Path(request["model"]),
        Path(request["data"]),
        Path(request["out"]),
        int(request["steps"]),
        cuda=bool(request["cuda"]),
        dtype=str(request["dtype"]),
        completion_tokens=int(request["completion_tokens"]),
    )
    peak_bytes = int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else None
    print(json.dumps({"durations": durations, "peak_bytes": peak_bytes}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON result (default {DEFAULT_OUT})")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes and few steps, on the CPU")
    parser.add_argument("--only", default="", help="comma-separated check names to run (default: all)")
    parser.add_argument("--bare-worker", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.bare_worker:
        bare_worker_main(options.bare_worker)
        return 0

    import torch

    cuda = torch.cuda.is_available() and not options.cpu_smoke
    gpus = torch.cuda.device_count() if cuda else 0
    sizes = GPU if cuda or not options.cpu_smoke else SMOKE
    plan = check_plan(sizes)
    only = {name.strip() for name in options.only.split(",") if name.strip()}
    unknown = sorted(only - {name for name, _ in plan})
    if unknown:
        parser.error(f"--only names unknown checks {unknown}: use some of {', '.join(n for n, _ in plan)}")
    plan = [(name, check) for name, check in plan if not only or name in only]
    started = time.monotonic()
    result: dict[str, Any] = {
        "mode": "gpu" if cuda else "cpu-smoke" if options.cpu_smoke else "no-cuda",
        "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or platform.machine(),
        "gpus": gpus,
        "versions": _versions(),
        "sizes": asdict(sizes),
        "checks": {},
    }
    checks: dict[str, dict[str, Any]] = result["checks"]
    runnable = []
    for name, check in plan:
        reason = not_run_reason(name, cuda, gpus, options.cpu_smoke)
        if reason is None:
            runnable.append((name, check))
        else:
            checks[name] = {"ok": True, "not_run": reason}
            print(f"gpu-check: {name}: not run: {reason}", flush=True)
    if runnable:
        _run_checks(runnable, checks, sizes, cuda)
    result["ok"] = all(c["ok"] for c in checks.values())
    result["seconds"] = round(time.monotonic() - started, 1)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    ran = sum(1 for c in checks.values() if "not_run" not in c)
    summary = "all checks that ran passed" if result["ok"] else "some checks FAILED"
    print(f"gpu-check: {summary} ({ran} ran, {len(checks) - ran} not run); wrote {options.out}")
    return 0 if result["ok"] else 1


def _run_checks(
    plan: list[tuple[str, Callable[[Checker], dict[str, Any]]]],
    checks: dict[str, dict[str, Any]],
    sizes: Sizes,
    cuda: bool,
) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="grpo-gpu-check-") as tmp,
        MetricServer(fraction_of_target) as metric,
    ):
        from grpo_trainer.tiny import build

        work = Path(tmp)
        checker = Checker(work, build(work / "toy-model"), metric.url, sizes, cuda)
        for name, check in plan:
            began = time.monotonic()
            try:
                checks[name] = check(checker)
            except Exception as exc:  # one broken check must not hide the others' results
                checks[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            checks[name]["seconds"] = round(time.monotonic() - began, 1)
            print(f"gpu-check: {name}: {'ok' if checks[name]['ok'] else 'FAILED'}", flush=True)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("torch", "transformers", "trl", "accelerate", "peft"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "absent"
    return out


if __name__ == "__main__":
    sys.exit(main())
