"""The import-layer check (hack/check_layers.py, part of `make lint`) on the real tree and on broken ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from hack import check_layers


def test_the_tree_keeps_its_layers() -> None:
    assert check_layers.violations() == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "operator" / "grpo_operator"
    for name, text in files.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "trainer_image").mkdir()
    return pkg


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {"api/x.py": "from grpo_operator.builders import y\n"},
            "layer 'api' imports 'grpo_operator.builders'",
        ),
        ({"settings.py": "import grpo_operator.reconcile.gang\n"}, "layer 'settings' imports"),
        (
            {"kubectl_plugin/c.py": "from grpo_operator.runtime import kube\n"},
            "layer 'kubectl_plugin' imports",
        ),
        ({"observability.py": "from grpo_operator.runtime.controller import C\n"}, "layer 'observability'"),
        ({"newthing/m.py": "import json\n"}, "belongs to no layer: add 'newthing'"),
        ({"api/k.py": "import kubernetes\n"}, "api must not import 'kubernetes'"),
    ],
)
def test_a_wrong_import_or_an_unplaced_package_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str], expected: str
) -> None:
    pkg = _tree(tmp_path, files)
    monkeypatch.setattr(check_layers, "REPO", tmp_path)
    monkeypatch.setattr(check_layers, "PACKAGE", pkg)
    found = check_layers.violations()
    assert any(expected in line for line in found), found


def test_runtime_may_use_everything_below_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = "".join(f"import grpo_operator.{m}\n" for m in ("api", "settings", "builders", "reconcile"))
    pkg = _tree(
        tmp_path, {"runtime/r.py": text + "import grpo_operator.observability\nimport grpo_operator\n"}
    )
    monkeypatch.setattr(check_layers, "REPO", tmp_path)
    monkeypatch.setattr(check_layers, "PACKAGE", pkg)
    assert check_layers.violations() == []
