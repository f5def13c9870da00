"""Fails when a module imports across the project's layers the wrong way.

Layers (docs/design.md): api -> builders -> reconcile -> runtime; each may import only the layers
below it. ``api`` imports neither kopf nor kubernetes, so the trainer and tools can use it alone.
The trainer (grpo_trainer), the metric SDK (grpo_metric) and the rollout gateway (grpo_gateway) share
only ``grpo_operator.api``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ORDER = ["api", "builders", "reconcile", "runtime"]
FORBIDDEN_IN_API = ("kopf", "kubernetes", "grpo_trainer", "grpo_metric")


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
    parts = module.split(".")
    if parts[0] == "grpo_operator" and len(parts) > 1 and parts[1] in ORDER:
        return parts[1]
    return None


def violations() -> list[str]:
    found: list[str] = []
    pkg = REPO / "operator" / "grpo_operator"
    for layer in ORDER:
        for path in sorted((pkg / layer).rglob("*.py")):
            allowed = set(ORDER[: ORDER.index(layer) + 1])
            for mod in imported_modules(path):
                target = layer_of(mod)
                if target and target not in allowed:
                    found.append(
                        f"{path.relative_to(REPO)}: layer '{layer}' imports '{mod}' (layer '{target}')"
                    )
                if layer == "api" and mod.split(".")[0] in FORBIDDEN_IN_API:
                    found.append(f"{path.relative_to(REPO)}: api must not import '{mod}'")
    for sub in ("grpo_trainer", "grpo_metric", "grpo_gateway"):
        for path in sorted((REPO / "trainer_image" / sub).rglob("*.py")):
            for mod in imported_modules(path):
                if mod.startswith("grpo_operator") and layer_of(mod) != "api" and mod != "grpo_operator":
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
