"""``kubectl grpo rewards``: the per-step figures of metrics.jsonl as a table (``--columns``), a PNG of
curves (``--plot``), and with ``--follow`` each new step's line as the trainer writes it, until the job ends."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_operator.api.status import TERMINAL_PHASES
from grpo_operator.kubectl_plugin import data, render
from grpo_operator.kubectl_plugin.cluster_access import READER, Kube
from grpo_operator.kubectl_plugin.errors import EXIT_OK, PluginError, matplotlib_missing
from grpo_operator.kubectl_plugin.output import emit, out
from grpo_operator.kubectl_plugin.tail import Tail, read_jsonl
from grpo_operator.kubectl_plugin.volume import VolumeTransport, reader


def cmd_rewards(kube: Kube, args: argparse.Namespace) -> int:
    job = kube.job(args.job)
    kube.require(READER)
    lifetime = 24 * 3600 if args.follow else 900
    with reader(kube, job, args.reader_image, args.reader_timeout, lifetime) as volume:
        if args.follow:
            return follow_rewards(
                volume,
                args,
                f"GRPOJob {kube.namespace}/{args.job}",
                lambda: (kube.job(args.job).get("status") or {}).get("phase") in TERMINAL_PHASES,
            )
        rows = read_jsonl(volume, data.METRICS_FILE, job, "per-step rewards")
    if args.output:
        emit(rows, args.output)
    else:
        out(render.rewards_text(rows, _columns(args, rows)))
    if args.plot:
        _plot(rows, args.plot, f"GRPOJob {kube.namespace}/{args.job}")
    return EXIT_OK


def follow_rewards(
    volume: VolumeTransport, args: argparse.Namespace, title: str, finished: Callable[[], bool]
) -> int:
    """The steps so far, then each new step's line (one JSON object per line with -o json) every
    ``--interval`` seconds until ``finished()``; ``--plot`` is redrawn whenever steps arrive. A job that
    has written no step yet is waited for, not refused."""
    tail = Tail(volume, data.METRICS_FILE)
    rows = tail.first(complete=False) or []
    columns = _columns(args, rows)
    _print(rows, columns, args, header=True)
    if args.plot and rows:
        _plot(rows, args.plot, title)
    while True:
        terminal = finished()
        new = tail.more()
        if new:
            _print(new, columns, args, header=False)
            rows += new
            if args.plot:
                _plot(rows, args.plot, title)
        if terminal:
            return EXIT_OK
        time.sleep(args.interval)


def _print(rows: list[dict[str, Any]], columns: list[str], args: argparse.Namespace, header: bool) -> None:
    if args.output:
        for row in rows:  # one JSON document per line, so the stream can be piped to jq
            out(json.dumps(row, ensure_ascii=False))
    else:
        for line in render.follow_lines(rows, columns, header):
            out(line)


def _columns(args: argparse.Namespace, rows: list[dict[str, Any]]) -> list[str]:
    try:
        return render.reward_columns(args.columns, rows)
    except ValueError as exc:
        raise PluginError(f"--columns: {exc}") from exc


def _plot(rows: list[dict[str, Any]], plot: str, title: str) -> None:
    try:
        from grpo_operator.kubectl_plugin.plot import plot_rows
    except ImportError as exc:
        raise matplotlib_missing(str(exc)) from exc
    try:
        png = plot_rows(rows, Path(plot), title)
    except ValueError as exc:
        raise PluginError(
            f"--plot {plot}: {exc} ({data.METRICS_FILE} has no record with a numeric step and "
            "reward_mean); run it again after the first step"
        ) from exc
    out(f"reward curve written to {png}", err=True)
