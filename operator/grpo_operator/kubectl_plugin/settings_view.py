"""``kubectl grpo config`` and ``kubectl grpo compare``: what a job really runs with, and how two jobs differ.

``config`` shows the job's spec with every default and the preset's knobs filled in (the values training
uses, not only what the manifest says) and trainer.json, the file the operator wrote for the trainer
(ConfigMap ``<job>-config``). ``compare A B`` lists the settings that differ and the two reward curves
step by step (and overlaid in a PNG with ``--plot``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from grpo_operator.api.base import describe_validation_error
from grpo_operator.api.rollouts import rollouts_source
from grpo_operator.api.spec import GRPOJobSpec
from grpo_operator.api.trainer_config import CONFIG_MAP_KEY
from grpo_operator.kubectl_plugin import data
from grpo_operator.kubectl_plugin.cluster_access import READER, Kube, Permission
from grpo_operator.kubectl_plugin.errors import EXIT_OK, BadData, PluginError, matplotlib_missing
from grpo_operator.kubectl_plugin.output import emit, out
from grpo_operator.kubectl_plugin.tail import Tail
from grpo_operator.kubectl_plugin.volume import VolumeTransport, reader

READ_CONFIG = Permission("get", "configmaps", "read the job's trainer.json (ConfigMap <job>-config)")


def resolved_spec(job: dict[str, Any]) -> dict[str, Any]:
    """The job's spec as training uses it: every default, and the preset's knobs in spec.grpo."""
    try:
        spec = GRPOJobSpec.model_validate(job.get("spec") or {})
    except ValidationError as exc:
        lines = "; ".join(describe_validation_error(exc, "spec")[:5])
        raise BadData(f"the job's spec does not validate against this plugin's API ({lines})") from exc
    client = rollouts_source(spec) == "Client"
    wire = spec.to_dict()
    wire["grpo"] = spec.grpo.resolved(sampled_by_client=client).to_dict()
    return wire


def trainer_json(kube: Kube, name: str) -> dict[str, Any] | None:
    """trainer.json as the operator wrote it for the job, None while there is none."""
    config = kube.config_map(f"{name}-config")
    text = ((config or {}).get("data") or {}).get(CONFIG_MAP_KEY)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise BadData(f"ConfigMap {name}-config key {CONFIG_MAP_KEY} is not JSON: {exc}") from exc
    return value if isinstance(value, dict) else None


def cmd_config(kube: Kube, args: argparse.Namespace) -> int:
    job = kube.job(args.job)
    kube.require((READ_CONFIG,))
    report = {"spec": resolved_spec(job), "trainerJson": trainer_json(kube, args.job)}
    if args.output:
        emit(report, args.output)
        return EXIT_OK
    out(f"# GRPOJob {kube.namespace}/{args.job}: the spec with every default and spec.grpo.preset filled in")
    out(yaml.safe_dump({"spec": report["spec"]}, sort_keys=False, allow_unicode=True), end="")
    if report["trainerJson"] is None:
        out(
            f"# trainer.json: not written yet (the operator writes ConfigMap {args.job}-config when the job starts)"
        )
    else:
        out(f"# trainer.json (ConfigMap {args.job}-config): what the trainer reads")
        out(json.dumps(report["trainerJson"], indent=2, ensure_ascii=False))
    return EXIT_OK


def flatten(value: Any, path: str = "") -> dict[str, Any]:
    """Dotted field paths to leaf values (lists as whole values: an env list differs as a whole)."""
    if isinstance(value, dict):
        found: dict[str, Any] = {}
        for key, item in value.items():
            found.update(flatten(item, f"{path}.{key}" if path else str(key)))
        return found
    return {path: value}


def settings_diff(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Each field whose resolved value differs between two specs (absent: null)."""
    fa, fb = flatten(a, "spec"), flatten(b, "spec")
    return [
        {"field": path, "a": fa.get(path), "b": fb.get(path)}
        for path in sorted(set(fa) | set(fb))
        if fa.get(path) != fb.get(path)
    ]


def _curve(volume: VolumeTransport) -> dict[int, dict[str, float | None]]:
    rows = Tail(volume, data.METRICS_FILE).first(complete=True) or []
    curve: dict[int, dict[str, float | None]] = {}
    for row in rows:
        step = data.step_of(row)
        if step is not None:
            curve[step] = {
                "reward": data.as_float(row.get("reward_mean")),
                "validation": data.as_float(row.get("validation_mean")),
            }
    return curve


def curves_table(
    a: str, b: str, ca: dict[int, dict[str, float | None]], cb: dict[int, dict[str, float | None]]
) -> str:
    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    lines = [f"{'STEP':>6}  {'REWARD ' + a:>20}  {'REWARD ' + b:>20}  {'VALID ' + a:>18}  {'VALID ' + b:>18}"]
    for step in sorted(set(ca) | set(cb)):
        ra, rb = ca.get(step, {}), cb.get(step, {})
        lines.append(
            f"{step:>6}  {cell(ra.get('reward')):>20}  {cell(rb.get('reward')):>20}  "
            f"{cell(ra.get('validation')):>18}  {cell(rb.get('validation')):>18}"
        )
    return "\n".join(lines)


def cmd_compare(kube: Kube, args: argparse.Namespace) -> int:
    jobs = {name: kube.job(name) for name in (args.job, args.other)}
    diff = settings_diff(resolved_spec(jobs[args.job]), resolved_spec(jobs[args.other]))
    report: dict[str, Any] = {"a": args.job, "b": args.other, "settings": diff}
    if not args.no_curves:
        kube.require(READER)
        curves = {}
        for name, job in jobs.items():
            with reader(kube, job, args.reader_image, args.reader_timeout, 900) as volume:
                curves[name] = _curve(volume)
        report["curves"] = {name: {str(k): v for k, v in c.items()} for name, c in curves.items()}
    if args.output:
        emit(report, args.output)
    else:
        out(f"# settings that differ ({args.job} | {args.other}), with every default and preset filled in")
        for row in diff:
            out(f"{row['field']}: {json.dumps(row['a'])} | {json.dumps(row['b'])}")
        if not diff:
            out("(none: the two jobs run with the same settings)")
        if not args.no_curves:
            out("")
            out(curves_table(args.job, args.other, curves[args.job], curves[args.other]))
    if args.plot:
        if args.no_curves:
            raise PluginError("--plot draws the curves: leave out --no-curves")
        _plot(curves, Path(args.plot), f"{kube.namespace}: {args.job} vs {args.other}")
        out(f"reward curves written to {args.plot}", err=True)
    return EXIT_OK


def _plot(curves: dict[str, dict[int, dict[str, float | None]]], png: Path, title: str) -> None:
    try:
        from grpo_operator.kubectl_plugin.plot import plot_curves
    except ImportError as exc:
        raise matplotlib_missing(str(exc)) from exc
    series = {
        name: [
            (step, point["reward"]) for step, point in sorted(curve.items()) if point["reward"] is not None
        ]
        for name, curve in curves.items()
    }
    if not any(series.values()):
        raise PluginError("--plot: neither job has finished a step yet")
    plot_curves(series, png, title)
