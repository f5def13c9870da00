"""`--plot` needs matplotlib, the kubectl-grpo distribution's `plot` extra: without it the plugin says what
to install before it reaches a cluster (tests/packaging/test_plugin_package.py checks it in a real install)."""

from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest
from grpo_operator import __version__
from grpo_operator.kubectl_plugin import cli
from grpo_operator.kubectl_plugin.errors import EXIT_ERROR


@pytest.mark.parametrize("command", [["rewards", "a"], ["compare", "a", "b"]])
def test_plot_without_matplotlib_names_the_extra_and_reaches_no_cluster(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    real = importlib.util.find_spec

    def hidden(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name == "matplotlib" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", hidden)

    def no_cluster(*args: object) -> None:
        raise AssertionError("reached for the cluster before saying matplotlib is missing")

    monkeypatch.setattr(cli, "Kube", no_cluster)
    assert cli.main([*command, "--plot", str(tmp_path / "r.png")]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "--plot needs matplotlib" in err
    assert f"{sys.executable} -m pip install 'kubectl-grpo[plot]=={__version__}'" in err
