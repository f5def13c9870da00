"""The trainer is shared steps plus one loop per rollout source under an entry point that only picks the
loop and maps errors to exit codes: no module imports another that imports it back (directly, lazily or
through others), and both loops end through the one ending in steps.py."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "trainer_image" / "grpo_trainer"


def _trees() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(PACKAGE.glob("*.py"))}


def _imports(tree: ast.Module) -> set[str]:
    """The grpo_trainer modules a module imports anywhere in it, inside functions included: a lazy import
    still closes a circle once both functions run."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "grpo_trainer":
                found.update(alias.name for alias in node.names)
            elif node.module.startswith("grpo_trainer."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("grpo_trainer."))
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def test_the_trainers_import_graph_has_no_circle() -> None:
    trees = _trees()
    graph = {name: _imports(tree) - {name} for name, tree in trees.items()}
    assert {"steps", "metric_loop", "client_loop", "main"} <= set(graph)
    assert _cycle(graph) is None, f"grpo_trainer modules import each other in a circle: {_cycle(graph)}"
    # The loops stand on the steps, never on the entry point or on each other.
    for loop in ("metric_loop", "client_loop"):
        assert "steps" in graph[loop]
        assert not graph[loop] & {"main", "__main__", "metric_loop", "client_loop"}, loop
    assert not graph["steps"] & {"main", "metric_loop", "client_loop"}


def test_the_entry_point_only_parses_dispatches_and_maps_errors() -> None:
    tree = _trees()["main"]
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    assert defined == {"run", "main", "_out_of_memory_reason"}


def test_both_loops_end_through_the_one_ending() -> None:
    trees = _trees()

    def called(tree: ast.Module) -> set[str]:
        return {
            n.func.id if isinstance(n.func, ast.Name) else n.func.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name | ast.Attribute)
        }

    for loop in ("metric_loop", "client_loop"):
        assert "finish" in called(trees[loop]), f"{loop} does not end through steps.finish"
    savers = sorted(name for name, tree in trees.items() if "save_final_model" in called(tree))
    assert savers == ["steps"], f"the final model is saved outside the shared ending: {savers}"


# Imports torch in a fresh interpreter per module (20 s): the trainer tier, not `make check`.
@pytest.mark.trainer
def test_each_trainer_module_imports_alone_in_a_fresh_interpreter() -> None:
    """Without a circle every module imports first; the entry point also imports without torch."""
    code = (
        "import importlib, sys\n"
        "import grpo_trainer.main\n"
        "assert 'torch' not in sys.modules, 'grpo_trainer.main imported torch'\n"
        "for name in ('steps', 'metric_loop', 'client_loop'):\n"
        "    for loaded in [m for m in sys.modules if m.startswith('grpo_trainer.')]:\n"
        "        del sys.modules[loaded]\n"
        "    importlib.import_module('grpo_trainer.' + name)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
