"""Fails when a module imports across the project's layers the wrong way, or belongs to no layer.

Every module of ``grpo_operator`` has a layer (docs/design.md), and a layer may import only the layers it
lists in ``MAY_IMPORT``:

    api  <-  settings  <-  builders  <-  reconcile  <-  runtime  <-  cli
     ^          ^                                         |
     |          +-- observability (metrics the runtime exports)
     +-- kubectl_plugin (a client: the API's names and the children's names, nothing of the operator)

``api`` imports neither kopf nor kubernetes, so the trainer and tools can use it alone. The trainer
(grpo_trainer), the metric SDK (grpo_metric) and the rollout gateway (grpo_gateway) share only
``grpo_operator.api``. The package root (``grpo_operator/__init__.py``: the version) is importable by all.

A module of ``grpo_operator`` that is in no layer fails the check: a new package must be placed here.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "operator" / "grpo_operator"
ROOT = "root"
MAY_IMPORT: dict[str, frozenset[str]] = {
    "api": frozenset(),
    "settings": frozenset({"api"}),
    "builders": frozenset({"api", "settings"}),
    "reconcile": frozenset({"api", "settings", "builders"}),
    "observability": frozenset({"api"}),
    "runtime": frozenset({"api", "settings", "builders", "reconcile", "observability"}),
    "cli": frozenset({"api", "settings", "builders", "reconcile", "observability", "runtime"}),
    "kubectl_plugin": frozenset({"api", "builders"}),
}
FORBIDDEN_IN_API = ("kopf", "kubernetes", "grpo_trainer", "grpo_metric", "grpo_gateway")
DATA_PLANE = ("grpo_trainer", "grpo_metric", "grpo_gateway")


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def layer_of(module: str) -> str | None:
    """The layer of a ``grpo_operator`` module (``ROOT`` for the package itself); None for other packages."""
    parts = module.split(".")
    if parts[0] != "grpo_operator":
        return None
    if len(parts) == 1 or parts[1] == "__init__":
        return ROOT
    return parts[1].removesuffix(".py")


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts)


def violations() -> list[str]:
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        layer = layer_of(_module_name(path))
        where = path.relative_to(REPO)
        if layer == ROOT:
            allowed: frozenset[str] = frozenset()
        elif layer not in MAY_IMPORT:
            found.append(f"{where}: belongs to no layer: add '{layer}' to MAY_IMPORT in hack/check_layers.py")
            continue
        else:
            allowed = MAY_IMPORT[layer] | {layer}
        for mod in imported_modules(path):
            target = layer_of(mod)
            if target is not None and target != ROOT and target not in allowed:
                found.append(f"{where}: layer '{layer}' imports '{mod}' (layer '{target}')")
            if layer == "api" and mod.split(".")[0] in FORBIDDEN_IN_API:
                found.append(f"{where}: api must not import '{mod}'")
    for sub in DATA_PLANE:
        for path in sorted((REPO / "trainer_image" / sub).rglob("*.py")):
            for mod in imported_modules(path):
                if layer_of(mod) not in (None, ROOT, "api"):
                    found.append(
                        f"{path.relative_to(REPO)}: the trainer may import only grpo_operator.api, not '{mod}'"
                    )
    return found


def main() -> int:
    problems = violations()
    for line in problems:
        print(f"layer violation: {line}", file=sys.stderr)
    if problems:
        print("Move the code to the right layer (see docs/design.md, 'Layers').", file=sys.stderr)
        return 1
    print("layers ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
