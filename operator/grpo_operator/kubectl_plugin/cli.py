"""``kubectl grpo``: argument parsing, exit codes and one function per subcommand."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import urllib3
import yaml

from grpo_operator.api.event_reasons import RESTART_OR_FAILURE_REASONS
from grpo_operator.api.status import TERMINAL_PHASES
from grpo_operator.builders.common import LABEL_ATTEMPT, LABEL_JOB, LABEL_NODE_RANK, LABEL_ROLE
from grpo_operator.kubectl_plugin import data, render
from grpo_operator.kubectl_plugin.errors import (
    EXIT_BAD_DATA,
    EXIT_ERROR,
    EXIT_FORBIDDEN,
    EXIT_NOT_FOUND,
    EXIT_OK,
    BadData,
    NotFound,
    PluginError,
)
from grpo_operator.kubectl_plugin.kube import LOGS, PATCH_JOB, READER, Kube
from grpo_operator.kubectl_plugin.volume import DEFAULT_READER_IMAGE, VolumeTransport, reader

PROG = "kubectl grpo"
# The events `status` lists as restarts: those the operator posts when a gang restarts or the job fails.
RESTART_REASONS = RESTART_OR_FAILURE_REASONS

MAIN_HELP = f"""\
See what a GRPOJob's model writes: status with reward trends, sample completions and their rewards,
per-step rewards (and a PNG), checkpoints, the trained model, logs; suspend and resume.

The job's files are read through a short-lived reader pod that mounts the job's volume read-only
(while the job runs and after it finished). That needs, in the job's namespace: create/get/delete pods
and create pods/exec, which the edit role grants.

Examples:
  {PROG} status qwen-gsm8k -n team-math
  {PROG} samples qwen-gsm8k --worst --limit 5
  {PROG} samples qwen-gsm8k --follow
  {PROG} rewards qwen-gsm8k --plot reward.png
  {PROG} checkpoints qwen-gsm8k -o json
  {PROG} export qwen-gsm8k --to ./qwen-gsm8k-final
  {PROG} logs qwen-gsm8k --role trainer -f
  {PROG} suspend qwen-gsm8k

What the job's trainer wrote is shown with terminal control characters escaped (as \\u001b), and
read in bounded amounts: a record over 1 MiB is skipped and a prompt or completion shown as text is
cut at 64 Ki characters, each with a notice; of a file over 64 MiB only its newest 64 MiB are read.

Exit codes: 0 ok; 1 the request failed (the message says why); 2 bad arguments;
3 not found (job, pod, checkpoint or file); 4 permission missing (the message lists which);
5 a file on the job's volume is malformed or unsafe (the message names it).
"""


def _connection(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection (as for kubectl)")
    group.add_argument("-n", "--namespace", help="namespace of the job (default: the context's namespace)")
    group.add_argument("--context", help="kubeconfig context to use")
    group.add_argument(
        "--kubeconfig", help="path to the kubeconfig file (default: $KUBECONFIG or ~/.kube/config)"
    )


def _output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=("json", "yaml"), help="print data as JSON or YAML")


def _reader_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("reader pod (reads the job's volume)")
    group.add_argument(
        "--reader-image",
        default=os.environ.get("KUBECTL_GRPO_READER_IMAGE", DEFAULT_READER_IMAGE),
        help=f"image with sh, tail, ls and tar (default: $KUBECTL_GRPO_READER_IMAGE or {DEFAULT_READER_IMAGE})",
    )
    group.add_argument(
        "--reader-timeout", type=float, default=120.0, help="seconds to wait for it to start (default 120)"
    )


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog=PROG, description=MAIN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    subs = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def sub(name: str, help_: str, examples: str) -> argparse.ArgumentParser:
        p = subs.add_parser(
            name,
            help=help_,
            description=help_,
            epilog=f"Examples:\n{examples}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("job", metavar="JOB", help="name of the GRPOJob")
        _connection(p)
        return p

    p = sub(
        "status",
        "Phase, step/S, reward and format-failure trends, last checkpoint, conditions, why pending, restarts.",
        f"  {PROG} status qwen-gsm8k -n team-math\n  {PROG} status qwen-gsm8k -o yaml",
    )
    _output(p)
    _reader_flags(p)
    p.add_argument("--no-trend", action="store_true", help="skip the trend (no reader pod; status only)")

    p = sub(
        "samples",
        "Prompts, completions and their rewards (default: every sample of the newest step).",
        f"  {PROG} samples qwen-gsm8k\n  {PROG} samples qwen-gsm8k --step 120 --best --limit 3\n"
        f"  {PROG} samples qwen-gsm8k --split validation\n  {PROG} samples qwen-gsm8k --follow",
    )
    _output(p)
    _reader_flags(p)
    p.add_argument("--step", type=int, help="only this step")
    order = p.add_mutually_exclusive_group()
    order.add_argument(
        "--best", action="store_const", const="best", dest="order", help="highest rewards first"
    )
    order.add_argument(
        "--worst", action="store_const", const="worst", dest="order", help="lowest rewards first"
    )
    p.add_argument("--limit", type=int, help="show at most this many (default: all; 10 with --best/--worst)")
    p.add_argument("--split", choices=("train", "validation"), default="train", help="default train")
    p.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new steps' samples as they come"
    )
    p.add_argument("--interval", type=float, default=5.0, help=argparse.SUPPRESS)

    p = sub(
        "rewards",
        "Per-step train reward, std, format failures, no-signal groups and validation reward.",
        f"  {PROG} rewards qwen-gsm8k\n  {PROG} rewards qwen-gsm8k --plot reward.png\n  {PROG} rewards qwen-gsm8k -o json",
    )
    _output(p)
    _reader_flags(p)
    p.add_argument(
        "--plot", metavar="FILE.png", help="also draw the reward curve into this PNG (needs matplotlib)"
    )

    p = sub(
        "checkpoints",
        "Published checkpoints (the latest is what a restart resumes from) and the final model.",
        f"  {PROG} checkpoints qwen-gsm8k\n  {PROG} checkpoints qwen-gsm8k -o json",
    )
    _output(p)
    _reader_flags(p)

    p = sub(
        "export",
        "Copy the final model (default) or a checkpoint out of the job's volume into a local directory.",
        f"  {PROG} export qwen-gsm8k --to ./model\n  {PROG} export qwen-gsm8k --step 200 --to ./step-200",
    )
    _reader_flags(p)
    p.add_argument("--step", type=int, help="export checkpoint step-N instead of the final model")
    p.add_argument("--to", required=True, metavar="DIR", help="local directory; must not exist or be empty")

    p = sub(
        "logs",
        "Logs of one of the job's pods (default: trainer rank 0 of the current attempt).",
        f"  {PROG} logs qwen-gsm8k -f\n  {PROG} logs qwen-gsm8k --role generation\n  {PROG} logs qwen-gsm8k --rank 1 --tail 100",
    )
    p.add_argument("--role", choices=("trainer", "generation", "metric", "rollouts"), default="trainer")
    p.add_argument(
        "--rank", type=int, default=0, help="trainer node rank, or index of the generation/metric pod"
    )
    p.add_argument("-f", "--follow", action="store_true", help="stream new lines")
    p.add_argument("--tail", type=int, help="only the last N lines")

    sub(
        "suspend",
        "Set spec.suspend: the operator stops the job's pods after a checkpoint; nothing is lost.",
        f"  {PROG} suspend qwen-gsm8k",
    )
    sub(
        "resume",
        "Clear spec.suspend: the job resumes from its last checkpoint.",
        f"  {PROG} resume qwen-gsm8k",
    )
    return top


# -- helpers ------------------------------------------------------------------------------------


def out(text: str, *, err: bool = False, end: str = "\n") -> None:
    """Everything the plugin prints goes through here: much of it was written by the tenant's trainer
    image (files on the volume, the status it patches), so control characters are made visible."""
    stream = sys.stderr if err else sys.stdout
    stream.write(render.terminal_safe(text) + end)
    stream.flush()


def warn(text: str) -> None:
    out(f"{PROG}: warning: {text}", err=True)


def emit(value: Any, output: str | None) -> None:
    if output == "yaml":
        out(yaml.safe_dump(value, sort_keys=False, allow_unicode=True), end="")
    else:
        out(json.dumps(value, indent=2, ensure_ascii=False))


def where(job: dict[str, Any]) -> str:
    status = job.get("status") or {}
    step = (status.get("progress") or {}).get("display") or "no step yet"
    return f"job {job['metadata']['name']} is {status.get('phase') or 'Pending'}, step {step}"


def open_reader(kube: Kube, job: dict[str, Any], args: argparse.Namespace, lifetime: int = 900) -> Any:
    kube.require(READER)
    return reader(kube, job, args.reader_image, args.reader_timeout, lifetime)


class Tail:
    """The records of a JSON-lines file on the volume, read in bounded chunks: first its newest
    ``data.FILE_LIMIT`` bytes, then (``follow``) what is appended."""

    def __init__(
        self, volume: VolumeTransport, path: str, keep: Callable[[dict[str, Any]], bool] | None = None
    ) -> None:
        self.volume = volume
        self.path = path
        self.keep = keep
        self.offset = 0
        self.scanner = data.JsonlScanner(path)

    def first(self, *, complete: bool) -> list[dict[str, Any]] | None:
        """The records of the newest part of the file (None when it does not exist); ``complete``
        also takes an unterminated last line, which a file still being written may have."""
        size = self.volume.size(self.path)
        if size is None:
            return None
        start = max(0, size - data.FILE_LIMIT)
        if start:
            # From the byte before: the line it ends (or the newline itself) is dropped as partial.
            self.scanner = data.JsonlScanner(self.path, skip_first=True)
            warn(
                f"{self.path} is {data.size_text(size)}: only its newest {data.size_text(data.FILE_LIMIT)} "
                "are read"
            )
        self.offset = max(0, start - 1)
        return self._read(size, complete)

    def more(self) -> list[dict[str, Any]]:
        size = self.volume.size(self.path)
        if size is None:
            return []
        if size < self.offset:  # the file was replaced: read the new one from its start
            self.offset, self.scanner = 0, data.JsonlScanner(self.path)
        return self._read(min(size, self.offset + data.FILE_LIMIT), complete=False)

    def _read(self, end: int, complete: bool) -> list[dict[str, Any]]:
        records: deque[dict[str, Any]] = deque(maxlen=data.RECORD_LIMIT)
        seen = 0

        def take(batch: list[dict[str, Any]]) -> None:
            nonlocal seen
            for record in batch:
                if self.keep is None or self.keep(record):
                    seen += 1
                    records.append(record)

        for chunk in self.volume.chunks(self.path, self.offset, end - self.offset):
            self.offset += len(chunk)
            take(self.scanner.feed(chunk))
        if complete:
            take(self.scanner.finish())
        for note in self.scanner.summary():
            warn(note)
        self.scanner.notices.clear()
        self.scanner.malformed = self.scanner.long_lines = 0
        if seen > len(records):
            warn(f"kept the newest {len(records)} of {seen} records of {self.path}")
        return list(records)


def read_jsonl(volume: VolumeTransport, path: str, job: dict[str, Any], what: str) -> list[dict[str, Any]]:
    records = Tail(volume, path).first(complete=True)
    if records is None:
        raise NotFound(
            f"no {what} yet: {path} does not exist on the job's volume ({where(job)}; the trainer writes it after each step)"
        )
    return records


# -- subcommands --------------------------------------------------------------------------------


def status_report(kube: Kube, job: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    name = job["metadata"]["name"]
    status = job.get("status") or {}
    report: dict[str, Any] = {"name": name, "namespace": kube.namespace, "status": status}
    if not args.no_trend:
        absent = kube.missing(READER)
        if absent:
            report["trendUnavailable"] = "you may not " + ", ".join(p.text() for p in absent)
        else:
            try:
                with reader(kube, job, args.reader_image, args.reader_timeout, 300) as volume:
                    rows = Tail(volume, data.METRICS_FILE).first(complete=True) or []
                report["trend"] = {
                    "steps": [data.step_of(r) for r in rows],
                    "reward": data.series(rows, "reward_mean"),
                    "formatFailureRatio": data.series(rows, "format_failure_ratio"),
                    "validation": data.series(rows, "validation_mean"),
                }
                if not rows:
                    report["trendUnavailable"] = "no step finished yet"
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
    report = status_report(kube, job, args)
    if args.output:
        emit(report, args.output)
    else:
        out(render.status_text(report))
    return EXIT_OK


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
    """``samples`` once the volume can be read; with ``--follow`` until ``finished()``."""
    limit = args.limit if args.limit is not None else (10 if args.order else None)
    # Only the split asked for is kept, so the record cap applies to what can be shown.
    tail = Tail(
        volume,
        data.SAMPLES_FILE,
        lambda s: s.get("split", "train") == args.split and data.step_of(s) is not None,
    )
    samples = tail.first(complete=not args.follow)
    if samples is None and not args.follow:
        raise NotFound(
            f"no samples yet: {data.SAMPLES_FILE} does not exist on the job's volume ({where(job)})"
        )
    samples = samples or []
    chosen = data.select_samples(samples, split=args.split, step=args.step, order=args.order, limit=limit)
    if not chosen and not args.follow:
        steps = sorted({data.step_of(s) or 0 for s in samples})
        raise NotFound(
            f"no {args.split} samples"
            + (f" at step {args.step}" if args.step is not None else "")
            + f" ({where(job)}; steps with {args.split} samples: {steps or 'none'})"
        )
    show(chosen, args, follow=False)
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
            )
        if terminal:
            return EXIT_OK
        time.sleep(args.interval)


def show(samples: list[dict[str, Any]], args: argparse.Namespace, follow: bool) -> None:
    if args.output and (args.follow or follow):
        for s in samples:  # one JSON document per line, so a stream can be piped to jq
            out(json.dumps(s, ensure_ascii=False))
    elif args.output:
        emit(samples, args.output)
    elif samples:
        out(("\n" if follow else "") + render.samples_text(samples))


def cmd_rewards(kube: Kube, args: argparse.Namespace) -> int:
    job = kube.job(args.job)
    with open_reader(kube, job, args) as volume:
        rows = read_jsonl(volume, data.METRICS_FILE, job, "per-step rewards")
    if args.output:
        emit(rows, args.output)
    else:
        out(render.rewards_text(rows))
    if args.plot:
        try:
            from grpo_operator.kubectl_plugin.plot import plot_rows
        except ImportError as exc:
            raise PluginError(f"--plot needs matplotlib ({exc}): pip install matplotlib==3.11.2") from exc
        title = f"GRPOJob {kube.namespace}/{args.job}: reward per step"
        try:
            png = plot_rows(rows, Path(args.plot), title)
        except ValueError as exc:
            raise PluginError(
                f"--plot {args.plot}: {exc} ({data.METRICS_FILE} has no record with a numeric step and "
                "reward_mean); run it again after the first step"
            ) from exc
        out(f"reward curve written to {png}", err=True)
    return EXIT_OK


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
        if args.step is not None:
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
    return EXIT_OK


def pick_pod(pods: list[dict[str, Any]], role: str, rank: int) -> dict[str, Any] | None:
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    if role in ("trainer", "generation") and live:
        newest = max(int(p["metadata"].get("labels", {}).get(LABEL_ATTEMPT, "0")) for p in live)
        live = [p for p in live if int(p["metadata"].get("labels", {}).get(LABEL_ATTEMPT, "0")) == newest]
    if role == "trainer":
        return next((p for p in live if p["metadata"]["labels"].get(LABEL_NODE_RANK, "0") == str(rank)), None)
    live.sort(key=lambda p: p["metadata"]["name"])
    return live[rank] if 0 <= rank < len(live) else None


def cmd_logs(kube: Kube, args: argparse.Namespace) -> int:
    kube.require(LOGS)
    job = kube.job(args.job)
    pods = kube.pods(f"{LABEL_JOB}={args.job},{LABEL_ROLE}={args.role}")
    pod = pick_pod(pods, args.role, args.rank)
    if pod is None:
        which = f"rank {args.rank}" if args.role == "trainer" else f"index {args.rank}"
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
    args = parser().parse_args(argv)
    try:
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
