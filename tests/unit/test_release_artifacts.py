"""The release artifacts agree on one version and say what they need (docs/release.md): the chart's version
and appVersion, the default images, the kubectl-grpo distribution and its krew manifest; the plugin's
distribution declares every third-party package its modules import, with loose pins."""

from __future__ import annotations

import ast
import hashlib
import sys
import tomllib
from pathlib import Path

import yaml
from grpo_operator import __version__
from grpo_operator.api.workloads import DEFAULT_TRAINER_IMAGE
from grpo_operator.settings import OperatorSettings
from packaging.requirements import Requirement

from hack import check_layers, package

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "grpo-operator"
PLUGIN_PROJECT = tomllib.loads((ROOT / "kubectl-plugin" / "pyproject.toml").read_text())["project"]
# Import name -> the distribution that provides it, where they differ (pydantic pins its own pydantic-core).
DISTRIBUTION_OF = {"yaml": "PyYAML", "pydantic_core": "pydantic"}


def test_chart_version_app_version_and_default_images_are_the_operators_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # The chart is released with the operator: one number for both (the index lists charts by version).
    assert chart["version"] == chart["appVersion"] == __version__
    own_trainer = f"ghcr.io/grpo-operator/trainer:{__version__}"
    assert values["jobDefaults"]["images"]["trainer"] == DEFAULT_TRAINER_IMAGE == own_trainer
    assert OperatorSettings().trainer_image == own_trainer
    # The same check hack/package.py makes before packaging.
    assert package.check_chart_version() == __version__


def test_the_plugin_distribution_takes_the_operators_version() -> None:
    plugin = (ROOT / "kubectl-plugin" / "pyproject.toml").read_text()
    assert PLUGIN_PROJECT["dynamic"] == ["version"]
    assert 'version = { attr = "grpo_operator.__version__" }' in plugin
    assert PLUGIN_PROJECT["scripts"] == {"kubectl-grpo": "grpo_operator.kubectl_plugin.cli:main"}


def third_party_imports(paths: list[Path]) -> set[str]:
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - set(package.SOURCE_ROOTS) - {"__future__"}


def test_the_plugin_wheel_holds_the_plugin_and_the_api_and_nothing_of_the_control_loop() -> None:
    modules = package.plugin_modules()
    plugin_dir = ROOT / "operator" / "grpo_operator" / "kubectl_plugin"
    assert {
        f"grpo_operator.kubectl_plugin.{p.stem}" for p in plugin_dir.glob("*.py") if p.stem != "__init__"
    } <= set(modules)
    assert "grpo_operator.api.spec" in modules
    # Whole: the layers the plugin may import, as the layer check says.
    assert set(package.PLUGIN_LAYERS) == check_layers.MAY_IMPORT["kubectl_plugin"]
    shipped = {str(p) for p in package.plugin_files()}
    assert {"grpo_operator/builders/vllm_supervisor.py", "grpo_operator/api/released_fields.json"} <= shipped
    assert not [p for p in shipped if p.startswith(("grpo_operator/reconcile/", "grpo_operator/runtime/"))]
    control_loop = ("grpo_operator.reconcile", "grpo_operator.runtime", "grpo_operator.cli", "grpo_trainer")
    assert not [m for m in modules if m.startswith(control_loop)]


def test_every_package_the_plugin_imports_is_a_loosely_pinned_dependency() -> None:
    shipped = [path for path in package.plugin_files().values() if path.suffix == ".py"]
    imported = third_party_imports(shipped)
    required = {Requirement(r) for r in PLUGIN_PROJECT["dependencies"]}
    extras = {Requirement(r) for rs in PLUGIN_PROJECT["optional-dependencies"].values() for r in rs}
    declared = {r.name.lower() for r in required | extras}
    missing = sorted(n for n in imported if DISTRIBUTION_OF.get(n, n).lower() not in declared)
    assert not missing, f"kubectl-plugin/pyproject.toml does not declare what the plugin imports: {missing}"
    # matplotlib only as the plot extra: `pip install kubectl-grpo` stays small.
    assert "matplotlib" not in {r.name for r in required}
    assert [r.name for r in extras] == ["matplotlib"]
    for req in required | extras:
        ops = {spec.operator for spec in req.specifier}
        assert ops == {">=", "<"}, f"{req}: a lower bound and the next major, not an exact pin"


def test_the_krew_manifest_names_this_version_and_the_launcher_built_from_the_sources() -> None:
    manifest = yaml.safe_load(package.KREW_MANIFEST.read_text())
    assert manifest["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert manifest["kind"] == "Plugin"
    assert manifest["metadata"]["name"] == "grpo"  # kubectl grpo
    spec = manifest["spec"]
    assert spec["version"] == f"v{__version__}"
    [platform] = spec["platforms"]
    assert platform["selector"]["matchExpressions"] == [
        {"key": "os", "operator": "In", "values": ["linux", "darwin"]}
    ]
    assert platform["uri"].endswith(f"/v{__version__}/kubectl-grpo-launcher-{__version__}.tar.gz")
    assert platform["bin"] == "kubectl-grpo"
    assert platform["sha256"] == hashlib.sha256(package.launcher_archive()).hexdigest(), (
        "the launcher changed: run `python hack/package.py krew --write`"
    )
    # Byte for byte reproducible, or the manifest's digest could not be checked against the sources.
    assert package.launcher_archive() == package.launcher_archive()


def test_the_launcher_installs_this_version() -> None:
    launcher = package.LAUNCHER_TEMPLATE.read_text().replace("@VERSION@", __version__)
    assert launcher.startswith("#!/bin/sh\n")
    assert f'version="{__version__}"' in launcher
    assert 'requirement="${KUBECTL_GRPO_REQUIREMENT:-kubectl-grpo==$version}"' in launcher
