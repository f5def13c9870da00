"""The packaged chart (`make chart-package`, hack/package.py): the .tgz holds every file of the chart (the
CRD, the templates, the values schema, the dashboard), renders exactly as the chart in the repository does,
and the repository index lists it under its version with its digest (docs/release.md)."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest
import yaml
from grpo_operator import __version__

from hack import package
from tests.helm.chart import CHART, MONITORING_APIS, VALUES_DIR, helm, run, template_args

URL = "https://charts.example.com/grpo"


@pytest.fixture(scope="module")
def packaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return package.package_chart(tmp_path_factory.mktemp("charts"), URL, helm=helm())


def chart_files() -> dict[str, bytes]:
    return {
        str(path.relative_to(CHART.parent)): path.read_bytes()
        for path in sorted(CHART.rglob("*"))
        if path.is_file()
    }


def test_the_package_holds_every_file_of_the_chart(packaged: Path) -> None:
    assert packaged.name == f"grpo-operator-{__version__}.tgz"
    with tarfile.open(packaged) as tgz:
        inside = {m.name: tgz.extractfile(m).read() for m in tgz.getmembers() if m.isfile()}  # type: ignore[union-attr]
    source = chart_files()
    assert set(inside) == set(source)
    for name in (
        "grpo-operator/crds/grpo.dev_grpojobs.yaml",
        "grpo-operator/values.schema.json",
        "grpo-operator/files/dashboards/grpo-operator.json",
        "grpo-operator/templates/deployment.yaml",
    ):
        assert name in inside, name
    # helm package writes Chart.yaml back from what it parsed; every other file goes in as it is.
    assert yaml.safe_load(inside.pop("grpo-operator/Chart.yaml")) == yaml.safe_load(
        source.pop("grpo-operator/Chart.yaml")
    )
    assert inside == source


@pytest.mark.parametrize("values", ["default.yaml", "monitoring.yaml", "platform-policy.yaml"])
def test_the_package_renders_as_the_chart_in_the_repository(packaged: Path, values: str) -> None:
    args = template_args([VALUES_DIR / values], api_versions=MONITORING_APIS, include_crds=True)
    from_source = run(args).stdout
    args[args.index(str(CHART))] = str(packaged)
    assert run(args).stdout == from_source


def test_the_index_lists_the_version_with_its_digest_and_address(packaged: Path) -> None:
    index = yaml.safe_load((packaged.parent / "index.yaml").read_text())
    [entry] = index["entries"]["grpo-operator"]
    assert entry["version"] == entry["appVersion"] == __version__
    assert entry["digest"] == hashlib.sha256(packaged.read_bytes()).hexdigest()
    assert entry["urls"] == [f"{URL}/{packaged.name}"]
    # helm itself finds it there, as `helm repo add` + `helm search repo` would.
    shown = run([helm(), "show", "chart", str(packaged)]).stdout
    assert yaml.safe_load(shown)["version"] == __version__


def test_packaging_again_keeps_the_versions_the_index_already_lists(packaged: Path, tmp_path: Path) -> None:
    # A release adds its chart to the published index; the earlier versions stay installable.
    published = yaml.safe_load((packaged.parent / "index.yaml").read_text())
    older = dict(
        published["entries"]["grpo-operator"][0], version="0.0.9", urls=[f"{URL}/grpo-operator-0.0.9.tgz"]
    )
    published["entries"]["grpo-operator"].append(older)
    (tmp_path / "index.yaml").write_text(yaml.safe_dump(published))
    package.package_chart(tmp_path, URL, helm=helm())
    merged = yaml.safe_load((tmp_path / "index.yaml").read_text())
    assert sorted(e["version"] for e in merged["entries"]["grpo-operator"]) == ["0.0.9", __version__]
