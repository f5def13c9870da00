"""The kubectl plugin installed on its own, as a user gets it (docs/release.md): the kubectl-grpo wheel built
by hack/package.py, installed through the krew launcher into a fresh virtual environment with its
dependencies from the package index (the newest versions its loose pins allow), runs `kubectl grpo`, is
found by kubectl on PATH, and says what to install for --plot, which needs the `plot` extra."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from grpo_operator import __version__

from hack import package
from tests.harness.kube import kubectl_binary

pytestmark = pytest.mark.slow

# Installing kubernetes, pydantic and aiohttp from the index into a new venv: about a minute here.
INSTALL_TIMEOUT = 600


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return package.build_plugin_wheel(tmp_path_factory.mktemp("wheels"))


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The launcher as krew unpacks it from the archive the manifest names."""
    where = tmp_path_factory.mktemp("krew")
    with tarfile.open(fileobj=io.BytesIO(package.launcher_archive()), mode="r:gz") as archive:
        archive.extractall(where, filter="data")
    return where / "kubectl-grpo"


@pytest.fixture(scope="module")
def installed(wheel: Path, launcher: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The launcher's first use, installing the wheel built here (not yet on PyPI) in place of the release;
    the bin directory of the environment it made."""
    home = tmp_path_factory.mktemp("home")
    env = {**os.environ, "KUBECTL_GRPO_HOME": str(home), "KUBECTL_GRPO_REQUIREMENT": str(wheel)}
    env["KUBECTL_GRPO_PYTHON"] = sys.executable
    first = subprocess.run(
        [str(launcher), "--help"], env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT
    )
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"first use of {__version__}" in first.stderr
    assert "usage: kubectl grpo" in first.stdout
    again = subprocess.run([str(launcher), "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "first use" not in again.stderr, again.stderr
    return home / __version__ / "bin"


def test_the_wheel_holds_the_plugin_and_the_api_it_reads(wheel: Path) -> None:
    assert wheel.name == f"kubectl_grpo-{__version__}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "grpo_operator/kubectl_plugin/cli.py" in names
    assert "grpo_operator/api/released_fields.json" in names
    assert not [n for n in names if n.startswith(("grpo_operator/reconcile/", "grpo_operator/runtime/"))]
    entry_points = zipfile.ZipFile(wheel).read(f"kubectl_grpo-{__version__}.dist-info/entry_points.txt")
    assert b"kubectl-grpo = grpo_operator.kubectl_plugin.cli:main" in entry_points


def test_kubectl_finds_the_installed_plugin(installed: Path) -> None:
    # Only what the wheel brought: not the project's venv, whose grpo_operator would hide a missing module.
    env = {"PATH": f"{installed}:/usr/bin:/bin", "HOME": os.environ["HOME"]}
    listed = subprocess.run(
        [kubectl_binary(), "plugin", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert str(installed / "kubectl-grpo") in listed.stdout, listed.stdout + listed.stderr
    shown = subprocess.run(
        [kubectl_binary(), "grpo", "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0 and "usage: kubectl grpo" in shown.stdout, shown.stderr


def test_plot_without_the_extra_says_what_to_install_before_reaching_a_cluster(
    installed: Path, tmp_path: Path
) -> None:
    # No cluster and no kubeconfig: the missing extra is reported first, not a connection error.
    env = {"PATH": f"{installed}:/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(
        [str(installed / "kubectl-grpo"), "rewards", "some-job", "--plot", str(tmp_path / "r.png")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "--plot needs matplotlib" in proc.stderr
    assert f"{installed / 'python'} -m pip install 'kubectl-grpo[plot]=={__version__}'" in proc.stderr
    assert not (tmp_path / "r.png").exists()
