"""``kubectl grpo``: one function per subcommand, and ``main``, which dispatches to them and maps every
error to one line and an exit code. The command line is in ``arguments``, printing in ``output``,
reading the trainer's JSON-lines files in ``tail``."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import urllib3

from grpo_operator.api.event_reasons import RESTART_OR_FAILURE_REASONS
from grpo_operator.api.status import TERMINAL_PHASES
from grpo_operator.api.tracking import TENSORBOARD_SUBDIR, WANDB_SUBDIR
from grpo_operator.api.trainer_config import TRAINER_LOGS_SUBDIR, generation_log_path, trainer_log_path
from grpo_operator.builders.common import (
    LABEL_ATTEMPT,
    LABEL_GENERATION_REPLICA,
    LABEL_JOB,
    LABEL_NODE_RANK,
    LABEL_ROLE,
)
from grpo_operator.kubectl_plugin import data, episodes_view, render
from grpo_operator.kubectl_plugin.arguments import PROG, parser
from grpo_operator.kubectl_plugin.check import cmd_check
from grpo_operator.kubectl_plugin.cluster_access import LOGS, PATCH_JOB, READER, Kube
from grpo_operator.kubectl_plugin.errors import (
    EXIT_BAD_DATA,
    EXIT_ERROR,
    EXIT_FORBIDDEN,
    EXIT_NOT_FOUND,
    EXIT_OK,
    BadData,
    NotFound,
    PluginError,
    matplotlib_missing,
)
from grpo_operator.kubectl_plugin.forecast_view import budget_of
from grpo_operator.kubectl_plugin.output import emit, out, where
from grpo_operator.kubectl_plugin.rewards_view import cmd_rewards
from grpo_operator.kubectl_plugin.settings_view import cmd_compare, cmd_config
from grpo_operator.kubectl_plugin.tail import Tail
from grpo_operator.kubectl_plugin.volume import VolumeTransport, reader

# The events `status` lists as restarts: those the operator posts when a gang restarts or the job fails.
RESTART_REASONS = RESTART_OR_FAILURE_REASONS


def open_reader(kube: Kube, job: dict[str, Any], args: argparse.Namespace, lifetime: int = 900) -> Any:
    kube.require(READER)
    return reader(kube, job, args.reader_image, args.reader_timeout, lifetime)


# -- subcommands --------------------------------------------------------------------------------


def _trend(report: dict[str, Any], volume: VolumeTransport) -> None:
    rows = Tail(volume, data.METRICS_FILE).first(complete=True) or []
    report["trend"] = {
        "steps": [data.step_of(r) for r in rows],
        "reward": data.series(rows, "reward_mean"),
        "formatFailureRatio": data.series(rows, "format_failure_ratio"),
        "validation": data.series(rows, "validation_mean"),
    }
    if not rows:
        report["trendUnavailable"] = "no step finished yet"


def status_report(
    kube: Kube, job: dict[str, Any], args: argparse.Namespace, volume: VolumeTransport | None = None
) -> dict[str, Any]:
    """What ``status`` shows; the trend is read through ``volume`` when given (``--watch`` keeps one reader
    pod for all its reports), else through a reader pod of its own."""
    name = job["metadata"]["name"]
    status = job.get("status") or {}
    report: dict[str, Any] = {"name": name, "namespace": kube.namespace, "status": status}
    # The budget the forecast is shown against (spec.budget.gpuHours; absent without one).
    budget = budget_of(job)
    if budget is not None:
        report["budgetGpuHours"] = budget
    amount = budget_of(job, "amount")
    if amount is not None:
        report["budgetAmount"] = amount
    # The learning-health diagnosis as validated data with its one-line summary (None when status.learning
    # is absent or malformed): what `status` prints first.
    report["learning"] = data.learning_report(status)
    if not args.no_trend:
        absent = kube.missing(READER) if volume is None else []
        if absent:
            report["trendUnavailable"] = "you may not " + ", ".join(p.text() for p in absent)
        else:
            try:
                if volume is not None:
                    _trend(report, volume)
                else:
                    with reader(kube, job, args.reader_image, args.reader_timeout, 300) as own:
                        _trend(report, own)
            except PluginError as exc:
                report["trendUnavailable"] = str(exc)
    events = kube.events(job["metadata"]["uid"])
    restarts = [
        {
            "time": e.get("lastTimestamp")
            or e.get("eventTime")
            or (e.get("metadata") or {}).get("creationTimestamp"),
            "reason": e.get("reason"),
            "message": e.get("message"),
            "count": e.get("count") or 1,
        }
        for e in events
        if e.get("reason") in RESTART_REASONS
    ]
    report["restartEvents"] = sorted(restarts, key=lambda e: e["time"] or "")
    waiting: list[str] = []
    if status.get("phase") not in ("Running", *TERMINAL_PHASES, "Suspended"):
        for pod in kube.pods(f"{LABEL_JOB}={name}"):
            pod_name = pod["metadata"]["name"]
            pstatus = pod.get("status") or {}
            for cond in pstatus.get("conditions") or []:
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                    waiting.append(
                        f"pod {pod_name}: {cond.get('reason')}: {cond.get('message', '')}".rstrip()
                    )
            for cs in pstatus.get("containerStatuses") or []:
                state = (cs.get("state") or {}).get("waiting")
                if state and state.get("reason") not in (None, "ContainerCreating"):
                    waiting.append(
                        f"pod {pod_name}: {state.get('reason')}: {state.get('message', '')}".rstrip()
                    )
            if pstatus.get("phase") == "Pending" and not any(
                w.startswith(f"pod {pod_name}:") for w in waiting
            ):
                waiting.append(f"pod {pod_name}: Pending")
    report["waiting"] = waiting
    return report


def cmd_status(kube: Kube, args: argparse.Namespace) -> int:
    job = kube.job(args.job)
    if args.watch:
        if not args.interval > 0:
            raise PluginError(f"--interval must be more than 0 seconds, got {args.interval:g}")
        if args.no_trend or kube.missing(READER):
            return watch_status(kube, args, None)
        with open_reader(kube, job, args, lifetime=24 * 3600) as volume:
            return watch_status(kube, args, volume)
    report = status_report(kube, job, args)
    if args.output:
        emit(report, args.output)
    else:
        out(render.status_text(report))
    return EXIT_OK


def watch_status(
    kube: Kube,
    args: argparse.Namespace,
    volume: VolumeTransport | None,
    pause: Callable[[float], None] = time.sleep,
) -> int:
    """``status --watch``: the status again every --interval seconds until the job has finished (one JSON or
    YAML document each with -o). Without a volume to read (--no-trend, or no permission for the reader
    pod) the reports carry no trend."""
    if volume is None:
        args.no_trend = True
    while True:
        job = kube.job(args.job)
        report = status_report(kube, job, args, volume)
        if args.output:
            emit(report, args.output)
        else:
            out(
                f"--- {time.strftime('%H:%M:%S')} (every {args.interval:g}s until the job finishes; Ctrl-C stops)"
            )
            out(render.status_text(report))
        if (job.get("status") or {}).get("phase") in TERMINAL_PHASES:
            return EXIT_OK
        pause(args.interval)


def cmd_samples(kube: Kube, args: argparse.Namespace) -> int:
    job = kube.job(args.job)
    lifetime = 24 * 3600 if args.follow else 900
    with open_reader(kube, job, args, lifetime) as volume:
        return print_samples(
            volume,
            job,
            args,
            lambda: (kube.job(args.job).get("status") or {}).get("phase") in TERMINAL_PHASES,
        )


def print_samples(
    volume: VolumeTransport, job: dict[str, Any], args: argparse.Namespace, finished: Callable[[], bool]
) -> int:
    """``samples`` once the volume can be read; with ``--follow`` until ``finished()``. A job with
    spec.environment (or ``--episodes``) shows episodes.jsonl's episodes instead of samples.jsonl."""
    limit = args.limit if args.limit is not None else (3 if args.order else None)
    episodes = episodes_view.wanted(job, getattr(args, "episodes", None))
    if episodes:
        if args.split != "train":
            raise PluginError(
                "episodes are train only (an environment job is not validated); drop --split, or add "
                "--no-episodes for samples.jsonl"
            )
        path, what, line_limit = data.EPISODES_FILE, "episodes", data.EPISODE_LINE_LIMIT
        text: Callable[[list[dict[str, Any]]], str] = episodes_view.episodes_text
        who = (
            "; rank 0 writes it after each step of a job with spec.environment "
            "(--no-episodes shows the transcripts in samples.jsonl)"
        )
    else:
        path, what, line_limit = data.SAMPLES_FILE, f"{args.split} samples", data.LINE_LIMIT
        text, who = render.samples_text, ""
    # Only the split asked for is kept, so the record cap applies to what can be shown.
    tail = Tail(
        volume,
        path,
        lambda s: s.get("split", "train") == args.split and data.step_of(s) is not None,
        line_limit,
    )
    samples = tail.first(complete=not args.follow)
    if samples is None and not args.follow:
        noun = "episodes" if episodes else "samples"
        raise NotFound(f"no {noun} yet: {path} does not exist on the job's volume ({where(job)}){who}")
    samples = samples or []
    chosen = data.select_samples(
        samples, split=args.split, step=args.step, order=args.order, limit=limit, recent=args.recent
    )
    if not chosen and not args.follow:
        steps = sorted({data.step_of(s) or 0 for s in samples})
        raise NotFound(
            f"no {what}"
            + (f" at step {args.step}" if args.step is not None else "")
            + f" ({where(job)}; steps with {what}: {steps or 'none'})"
        )
    show(chosen, args, follow=False, text=text)
    if not args.follow:
        return EXIT_OK
    while True:
        terminal = finished()
        new = tail.more()
        for step in sorted({data.step_of(s) or 0 for s in new}):
            of_step = [s for s in new if data.step_of(s) == step]
            show(
                data.select_samples(of_step, split=args.split, step=step, order=args.order, limit=limit),
                args,
                True,
                text,
            )
        if terminal:
            return EXIT_OK
        time.sleep(args.interval)


def show(
    samples: list[dict[str, Any]],
    args: argparse.Namespace,
    follow: bool,
    text: Callable[[list[dict[str, Any]]], str] = render.samples_text,
) -> None:
    if args.output and (args.follow or follow):
        for s in samples:  # one JSON document per line, so a stream can be piped to jq
            out(json.dumps(s, ensure_ascii=False))
    elif args.output:
        emit(samples, args.output)
    elif samples:
        out(("\n" if follow else "") + text(samples))


def checkpoint_listing(volume: VolumeTransport) -> dict[str, Any]:
    raw = volume.read(data.MANIFEST_FILE, limit=data.MANIFEST_LIMIT)
    manifest, problem = data.manifest_step(raw, data.MANIFEST_FILE)
    if problem:
        raise BadData(
            f"{problem}: the trainer publishes each checkpoint through it, and a restart could not "
            f"resume either; see the trainer's log (kubectl grpo logs JOB), or list the files with "
            f"kubectl grpo export --step N"
        )
    entries = volume.list_dir(data.CHECKPOINT_DIR) or []
    model = data.MODEL_DIR if volume.list_dir(data.MODEL_DIR) else None
    items = [c.to_json() for c in data.checkpoints(entries, manifest)]
    return {"checkpoints": items, "latest": manifest, "finalModel": model}


def cmd_checkpoints(kube: Kube, args: argparse.Namespace) -> int:
    job = kube.job(args.job)
    with open_reader(kube, job, args) as volume:
        listing = checkpoint_listing(volume)
    if args.output:
        emit(listing, args.output)
    else:
        out(render.checkpoints_text(listing["checkpoints"], listing["finalModel"]))
    return EXIT_OK


def cmd_export(kube: Kube, args: argparse.Namespace) -> int:
    dest = Path(args.to)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise PluginError(f"--to {dest}: exists and is not an empty directory; choose a new directory")
    job = kube.job(args.job)
    with open_reader(kube, job, args) as volume:
        listing = checkpoint_listing(volume)
        steps = [c["step"] for c in listing["checkpoints"]]
        if args.tensorboard or args.wandb:
            subdir, what, setting = (
                (TENSORBOARD_SUBDIR, "TensorBoard event files", "spec.tracking.tensorBoard.enabled: true")
                if args.tensorboard
                else (
                    WANDB_SUBDIR,
                    "W&B runs",
                    "spec.tracking.wandb (offline mode keeps them for `wandb sync`)",
                )
            )
            source = f"{data.OUTPUT_DIR}/{subdir}"
            if not volume.list_dir(source):
                raise NotFound(
                    f"no {what} in {source} ({where(job)}): the trainer writes them only with {setting}, "
                    "from its first step on"
                )
        elif args.step is not None:
            if args.step not in steps:
                raise NotFound(
                    f"no checkpoint at step {args.step} ({where(job)}; checkpoints: {steps or 'none'})"
                )
            source = f"{data.CHECKPOINT_DIR}/step-{args.step}"
        elif listing["finalModel"]:
            source = listing["finalModel"]
        else:
            raise NotFound(
                f"no final model yet ({where(job)}); export a checkpoint with --step N "
                f"(checkpoints: {steps or 'none'})"
            )
        dest.mkdir(parents=True, exist_ok=True)
        try:
            volume.copy_out(source, dest)
        except PluginError:
            # dest was new or empty: leave nothing of a refused copy behind (it may hold a bad link).
            shutil.rmtree(dest, ignore_errors=True)
            raise
    files = [p for p in dest.rglob("*") if p.is_file() and not p.is_symlink()]
    size = sum(p.stat().st_size for p in files)
    out(f"exported {source} ({len(files)} files, {size / 1e6:.1f} MB) to {dest}")
    if args.tensorboard:
        out(f"view them with: tensorboard --logdir {dest}")
    if args.wandb:
        out(f"upload them with: wandb sync {dest}/offline-run-*")
    return EXIT_OK


def pick_pod(pods: list[dict[str, Any]], role: str, rank: int, replica: int = 0) -> dict[str, Any] | None:
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    if role == "generation":
        # One vLLM server per spec.generation.replicas; a pod without the label is replica 0's (an older
        # operator made it).
        live = [
            p
            for p in live
            if p["metadata"].get("labels", {}).get(LABEL_GENERATION_REPLICA, "0") == str(replica)
        ]
    if role in ("trainer", "generation") and live:
        newest = max(int(p["metadata"].get("labels", {}).get(LABEL_ATTEMPT, "0")) for p in live)
        live = [p for p in live if int(p["metadata"].get("labels", {}).get(LABEL_ATTEMPT, "0")) == newest]
    if role == "trainer":
        return next((p for p in live if p["metadata"]["labels"].get(LABEL_NODE_RANK, "0") == str(rank)), None)
    if role == "generation":
        # <job>-gen[-r<r>]-<attempt>-<n>, n counting the attempt's replacements of a failed vLLM pod of the
        # replica: index 0 is the newest (the server in use), 1 the one it replaced, and so on.
        live.sort(key=lambda p: -_trailing_number(p["metadata"]["name"]))
    else:
        live.sort(key=lambda p: p["metadata"]["name"])
    return live[rank] if 0 <= rank < len(live) else None


def _trailing_number(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def cmd_logs(kube: Kube, args: argparse.Namespace) -> int:
    if args.attempt is not None:
        return attempt_log(kube, args)
    kube.require(LOGS)
    job = kube.job(args.job)
    pods = kube.pods(f"{LABEL_JOB}={args.job},{LABEL_ROLE}={args.role}")
    pod = pick_pod(pods, args.role, args.rank, args.replica)
    if pod is None:
        which = f"rank {args.rank}" if args.role == "trainer" else f"index {args.rank}"
        if args.role == "generation" and args.replica:
            which += f" of replica {args.replica}"
        raise NotFound(
            f"no {args.role} pod ({which}) of job {args.job} exists now ({where(job)}). Kubernetes keeps logs "
            f"only while a pod exists; what the trainer recorded stays on the volume: "
            f"kubectl grpo rewards {args.job} / kubectl grpo samples {args.job}"
        )
    name = pod["metadata"]["name"]
    container = pod["spec"]["containers"][0]["name"]
    out(f"# pod {name}, container {container}", err=True)
    for chunk in kube.log_chunks(name, container, args.follow, args.tail):
        out(chunk, end="")
    return EXIT_OK


# Bytes read from the end of a kept log for --tail: the lines asked for, at up to 1 kB each.
_TAIL_BYTES_PER_LINE = 1024


def attempt_log(kube: Kube, args: argparse.Namespace) -> int:
    """A trainer process's or a vLLM server's output as kept on the volume (the trainer's log_capture.py,
    the generation pod's supervisor)."""
    if args.role not in ("trainer", "generation") or args.follow:
        raise PluginError(
            "--attempt reads a log kept on the volume: the trainer's (default) or vLLM's (--role generation); "
            "drop --follow"
        )
    job = kube.job(args.job)
    if args.role == "generation":
        path = generation_log_path(data.OUTPUT_DIR, args.attempt, args.replica)
        who = f"vLLM replica {args.replica}"
    else:
        path = trainer_log_path(data.OUTPUT_DIR, args.attempt, args.rank)
        who = f"trainer rank {args.rank}"
    with open_reader(kube, job, args) as volume:
        size = volume.size(path)
        if size is None:
            kept = volume.list_dir(f"{data.OUTPUT_DIR}/{TRAINER_LOGS_SUBDIR}") or []
            access = (((job.get("spec") or {}).get("checkpoints") or {}).get("volume") or {}).get(
                "accessMode"
            )
            why = (
                "; vLLM pods keep their log on the volume only when they can mount it "
                "(spec.checkpoints.volume.accessMode: ReadWriteMany): the cause of a vLLM failure is in its "
                "pod's termination message, which the job's events repeat"
                if args.role == "generation" and access != "ReadWriteMany"
                else ""
            )
            raise NotFound(
                f"no log of {who} in attempt {args.attempt} on the volume ({where(job)}); "
                f"attempts kept: {', '.join(sorted(kept)) or 'none'}{why}"
            )
        start = 0 if args.tail is None else max(0, size - args.tail * _TAIL_BYTES_PER_LINE)
        text = b"".join(volume.chunks(path, start, size - start)).decode("utf-8", errors="replace")
    # splitlines also ends a line at a bare carriage return: progress bars become their successive states.
    lines = text.splitlines()
    if args.tail is not None:
        lines = lines[-args.tail :] if args.tail > 0 else []
    out(f"# {path} ({who}, attempt {args.attempt}; kept on the job's volume)", err=True)
    for line in lines:
        out(render.terminal_safe(line))
    return EXIT_OK


def cmd_suspend(kube: Kube, args: argparse.Namespace, value: bool) -> int:
    job = kube.job(args.job)
    phase = (job.get("status") or {}).get("phase")
    word = "suspended" if value else "resumed"
    if phase in TERMINAL_PHASES:
        raise PluginError(
            f"job {args.job} has {phase}: there is nothing to {'suspend' if value else 'resume'}"
        )
    if bool((job.get("spec") or {}).get("suspend")) == value:
        out(
            f"grpojob.grpo.dev/{args.job} already {'suspended' if value else 'not suspended'} (phase {phase})"
        )
        return EXIT_OK
    kube.require([PATCH_JOB])
    kube.set_suspend(args.job, value)
    detail = (
        "the operator checkpoints and stops its pods; `kubectl grpo resume` continues from the checkpoint"
        if value
        else "the operator starts a new gang that resumes from the last checkpoint"
    )
    out(f"grpojob.grpo.dev/{args.job} {word}: {detail}")
    return EXIT_OK


def report(exc: PluginError) -> int:
    """Says what went wrong on one line of stderr; the exit code the error maps to."""
    label = {EXIT_NOT_FOUND: "not found", EXIT_FORBIDDEN: "forbidden", EXIT_BAD_DATA: "bad data"}.get(
        exc.exit_code, "error"
    )
    out(f"{PROG}: {label}: {exc}", err=True)
    return exc.exit_code


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if not given:
        # `kubectl grpo` alone: what it can do, not argparse's "the following arguments are required".
        parser().print_help()
        return EXIT_OK
    args = parser().parse_args(given)
    try:
        # Before anything reaches the cluster: a missing extra found after a long read (or a --follow of
        # hours) would waste it.
        if getattr(args, "plot", None) and importlib.util.find_spec("matplotlib") is None:
            raise matplotlib_missing("no module named 'matplotlib'")
        if args.command == "check":
            return cmd_check(args)
        kube = Kube(args.kubeconfig, args.context, args.namespace)
        match args.command:
            case "status":
                return cmd_status(kube, args)
            case "samples":
                return cmd_samples(kube, args)
            case "rewards":
                return cmd_rewards(kube, args)
            case "checkpoints":
                return cmd_checkpoints(kube, args)
            case "export":
                return cmd_export(kube, args)
            case "logs":
                return cmd_logs(kube, args)
            case "config":
                return cmd_config(kube, args)
            case "compare":
                return cmd_compare(kube, args)
            case "suspend":
                return cmd_suspend(kube, args, True)
            case "resume":
                return cmd_suspend(kube, args, False)
        raise AssertionError(args.command)
    except PluginError as exc:
        return report(exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`| head`): not an error of ours, and nothing left to say.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except urllib3.exceptions.HTTPError as exc:
        out(f"{PROG}: error: cannot reach the API server ({exc}); check --context/--kubeconfig", err=True)
        return EXIT_ERROR
    except OSError as exc:  # a local file (--to, --plot) or the API server's socket
        out(f"{PROG}: error: {exc}", err=True)
        return EXIT_ERROR
    except Exception as exc:  # a bug of ours: one line, not a traceback in the user's face
        if os.environ.get("KUBECTL_GRPO_DEBUG"):
            out(traceback.format_exc(), err=True)
        out(
            f"{PROG}: error: unexpected {type(exc).__name__}: {exc} (a bug in the plugin: run again with "
            "KUBECTL_GRPO_DEBUG=1 for the traceback and report it)",
            err=True,
        )
        return EXIT_ERROR
