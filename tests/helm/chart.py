"""Helpers for the chart tests: the helm, kubeconform and promtool binaries, rendering, rule extraction.

Binaries are found, never guessed: helm and kubeconform from hack/testbins.sh's cache (versions in
hack/versions.env), promtool and prometheus from PATH (Debian's `prometheus` package, installed by
hack/helm/ensure-prometheus.sh). A missing one fails the test with the command that provides it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.harness.kube import _versions, helm_binary, testbins_dir

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "grpo-operator"
VALUES_DIR = Path(__file__).resolve().parent / "values"
MONITORING_APIS = (
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PodMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
)
RELEASE = "grpo"
NAMESPACE = "grpo-system"
# The chart names the operator's objects (Deployment, ServiceAccount, roles) "<release>-grpo-operator".
FULLNAME = f"{RELEASE}-grpo-operator"

Doc = dict[str, Any]


def helm() -> str:
    try:
        return helm_binary()
    except RuntimeError as exc:
        raise AssertionError(
            f"{exc} (it builds helm {_versions()['HELM_VERSION']} from its Go module)"
        ) from None


def kubeconform() -> str:
    version = _versions().get("KUBECONFORM_VERSION", "v0.7.0")
    built = testbins_dir() / f"kubeconform-{version}" / "kubeconform"
    if not built.exists():
        raise AssertionError(f"no kubeconform at {built}: run `bash hack/testbins.sh kubeconform`")
    return str(built)


def promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        raise AssertionError(
            "promtool not found: run `bash hack/helm/ensure-prometheus.sh` (installs Debian's prometheus package)"
        )
    return found


def prometheus() -> str:
    found = shutil.which("prometheus")
    if not found:
        raise AssertionError(
            "prometheus not found: run `bash hack/helm/ensure-prometheus.sh` (installs Debian's prometheus package)"
        )
    return found


def run(
    args: Sequence[str], *, check: bool = True, timeout: float = 120, **kw: Any
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def template_args(
    values_files: Iterable[Path] = (),
    sets: Mapping[str, str] | None = None,
    *,
    api_versions: Iterable[str] = (),
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    include_crds: bool = False,
) -> list[str]:
    args = [helm(), "template", release, str(CHART), "--namespace", namespace]
    for path in values_files:
        args += ["--values", str(path)]
    for key, value in (sets or {}).items():
        args += ["--set", f"{key}={value}"]
    for api in api_versions:
        args += ["--api-versions", api]
    if include_crds:
        args.append("--include-crds")
    return args


def render_text(
    values_files: Iterable[Path] = (),
    sets: Mapping[str, str] | None = None,
    *,
    api_versions: Iterable[str] = (),
    include_crds: bool = False,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    args = template_args(values_files, sets, api_versions=api_versions, include_crds=include_crds)
    return run(args, check=check)


def render(
    values_files: Iterable[Path] = (),
    sets: Mapping[str, str] | None = None,
    *,
    api_versions: Iterable[str] = (),
    include_crds: bool = False,
) -> list[Doc]:
    text = render_text(values_files, sets, api_versions=api_versions, include_crds=include_crds).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


def find(docs: Iterable[Doc], kind: str, name: str | None = None, namespace: str | None = None) -> list[Doc]:
    return [
        d
        for d in docs
        if d["kind"] == kind
        and (name is None or d["metadata"]["name"] == name)
        and (namespace is None or d["metadata"].get("namespace") == namespace)
    ]


def one(docs: Iterable[Doc], kind: str, name: str | None = None, namespace: str | None = None) -> Doc:
    found = find(docs, kind, name, namespace)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def rule_groups(docs: Iterable[Doc]) -> dict[str, Any]:
    """The PrometheusRule's spec as a plain Prometheus rule file (what the Prometheus Operator loads)."""
    return {"groups": one(docs, "PrometheusRule")["spec"]["groups"]}


def write_rule_file(docs: Iterable[Doc], path: Path) -> Path:
    path.write_text(yaml.safe_dump(rule_groups(docs), sort_keys=False), encoding="utf-8")
    return path


def values_files() -> list[Path]:
    return sorted(VALUES_DIR.glob("*.yaml"))


def env_of(deployment: Doc) -> dict[str, str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


# Words of PromQL (functions, keywords, label names, duration units) the dashboard uses; any other
# identifier in a query is a metric name.
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "by", "without", "on", "ignoring", "and", "or", "unless",
    "rate", "increase", "time", "histogram_quantile", "le", "namespace", "grpojob", "result", "phase",
    "reason", "counted", "verb", "kind", "code", "type", "component", "healthy", "outcome", "source", "h", "m",
    "s", "currency",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_vars = re.sub(r"\$\w+", "", without_strings)
    tokens = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", without_vars))
    return tokens - PROMQL_WORDS
