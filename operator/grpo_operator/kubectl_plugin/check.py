"""``kubectl grpo check -f job.yaml``: what the API server and the operator would say of a manifest, before
it is applied and without a cluster: the refusals (from the same models the CRD is generated from), each
unknown field with the name it was probably meant to be (TRL's names included), and the warnings the
chart's admission policy gives at apply time."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from grpo_operator.api.advice import check_manifest
from grpo_operator.api.resource import KIND
from grpo_operator.kubectl_plugin.errors import EXIT_ERROR, EXIT_OK, BadData
from grpo_operator.kubectl_plugin.output import emit, out

# A manifest is read whole; no GRPOJob comes near this size.
MAX_MANIFEST_BYTES = 4 * 1024 * 1024


def _documents(path: str) -> list[Any]:
    text = sys.stdin.read(MAX_MANIFEST_BYTES + 1) if path == "-" else _read(Path(path))
    if len(text) > MAX_MANIFEST_BYTES:
        raise BadData(f"{path} is larger than {MAX_MANIFEST_BYTES} bytes: is it a GRPOJob manifest?")
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise BadData(f"{path} is not valid YAML: {exc}") from exc


def _read(path: Path) -> str:
    with path.open(encoding="utf-8", errors="replace") as f:
        return f.read(MAX_MANIFEST_BYTES + 1)


def verdicts(documents: list[Any], max_rollouts: int) -> list[dict[str, Any]]:
    """One verdict per GRPOJob in ``documents``; other kinds are listed as skipped."""
    found = []
    for i, doc in enumerate(documents):
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        entry: dict[str, Any] = {"document": i, "name": name if isinstance(name, str) else None}
        if not isinstance(doc, dict) or doc.get("kind") != KIND:
            kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
            found.append({**entry, "skipped": f"not a {KIND} (kind {kind!r})"})
            continue
        errors, advice = check_manifest(doc, max_rollouts)
        unknown = [str(a) for a in advice if a.message.startswith("unknown field")]
        entry["accepted"] = not errors and not unknown
        entry["errors"] = errors
        entry["unknownFields"] = unknown
        entry["warnings"] = [str(a) for a in advice if not a.message.startswith("unknown field")]
        found.append(entry)
    return found


def cmd_check(args: argparse.Namespace) -> int:
    found = verdicts(_documents(args.filename), args.warn_rollouts)
    if not any("skipped" not in v for v in found):
        raise BadData(f"{args.filename} holds no {KIND}")
    if args.output:
        emit(found, args.output)
    else:
        for v in found:
            label = f"{args.filename}: {v['name'] or 'document ' + str(v['document'])}"
            if "skipped" in v:
                out(f"{label}: skipped, {v['skipped']}")
                continue
            count = len(v["warnings"])
            verdict = "would be accepted" if v["accepted"] else "would be refused"
            out(f"{label}: {verdict}" + (f", with {count} warning{'s' * (count != 1)}" if count else ""))
            for line in v["errors"] + v["unknownFields"]:
                out(f"  {line}")
            for line in v["warnings"]:
                out(f"  warning: {line}")
    return EXIT_OK if all(v.get("accepted", True) for v in found) else EXIT_ERROR


__all__ = ["cmd_check", "verdicts"]
