"""JSON schemas for kubeconform, generated offline from the sources the rest of the project builds from.

kubeconform normally downloads schemas from GitHub; here nothing is downloaded from the web:

* built-in kinds come from Kubernetes' own OpenAPI document, ``api/openapi-spec/swagger.json`` in the
  ``k8s.io/kubernetes`` module (the version in hack/versions.env, already in the Go module cache after
  ``hack/testbins.sh k8s``; otherwise ``go mod download`` fetches it through the module proxy);
* custom resources come from CRD files: the chart's own (crds/) and the Prometheus Operator's
  (``example/prometheus-operator-crd/`` in its Go module, version PROMETHEUS_OPERATOR_VERSION from the
  environment or hack/versions.env, default PROMETHEUS_OPERATOR_DEFAULT).

The conversion follows kubeconform's scripts/openapi2jsonschema.py: ``$ref``s inlined (standalone),
``additionalProperties: false`` wherever properties are listed (strict: a misspelled field fails), int-or-
string and quantities accept both forms, optional fields may be null. Files are laid out for the single
kubeconform location ``<dir>/{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json`` (the
group of core kinds is ``v1``).

    python hack/helm/kube_schemas.py OUT_DIR apps/v1:Deployment v1:Service ...
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
LOCATION_TEMPLATE = "{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json"

Schema = dict[str, Any]
GVK = tuple[str, str]  # (apiVersion, kind)

_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_SPECIAL: dict[str, Schema] = {
    _QUANTITY: {"oneOf": [{"type": "string"}, {"type": "number"}]},
    _INT_OR_STRING: {"oneOf": [{"type": "string"}, {"type": "integer"}]},
}


class SchemaError(RuntimeError):
    """A schema source is missing or unusable."""


def pinned_version(name: str, default: str | None = None) -> str:
    """A version from the environment, else hack/versions.env (lines like K8S_VERSION="${K8S_VERSION:-v1.36.3}")."""
    if os.environ.get(name):
        return os.environ[name]
    for line in (REPO / "hack" / "versions.env").read_text().splitlines():
        if line.startswith(f"{name}="):
            value = line.split("=", 1)[1].strip('"')
            return value.split(":-", 1)[-1].rstrip("}")
    if default is None:
        raise SchemaError(f"{name} not found in hack/versions.env")
    return default


def k8s_version() -> str:
    return pinned_version("K8S_VERSION")


# The Prometheus Operator release whose CRDs (ServiceMonitor, PodMonitor, PrometheusRule) the chart is
# validated against; served by the Go module proxy.
PROMETHEUS_OPERATOR_DEFAULT = "v0.85.0"


def go_module_dir(module: str, version: str) -> Path:
    """The unpacked source of a Go module (from the module cache; downloaded through the proxy if absent)."""
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOWORK": "off"}
    try:
        proc = subprocess.run(
            ["go", "mod", "download", "-json", f"{module}@{version}"],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
            check=False,
        )
    except FileNotFoundError as exc:
        raise SchemaError("the `go` command is needed to fetch schema sources (install Go 1.26)") from exc
    info = json.loads(proc.stdout or "{}")
    if proc.returncode != 0 or "Dir" not in info:
        raise SchemaError(
            f"cannot download Go module {module}@{version}: {info.get('Error') or proc.stderr.strip()}"
        )
    return Path(info["Dir"])


def kubernetes_swagger(version: str | None = None) -> Path:
    path = (
        go_module_dir("k8s.io/kubernetes", version or k8s_version()) / "api" / "openapi-spec" / "swagger.json"
    )
    if not path.is_file():
        raise SchemaError(f"{path} is missing from the k8s.io/kubernetes module")
    return path


def prometheus_operator_crds(version: str | None = None) -> list[Path]:
    version = version or pinned_version("PROMETHEUS_OPERATOR_VERSION", PROMETHEUS_OPERATOR_DEFAULT)
    directory = go_module_dir("github.com/prometheus-operator/prometheus-operator", version)
    files = sorted((directory / "example" / "prometheus-operator-crd").glob("monitoring.coreos.com_*.yaml"))
    if not files:
        raise SchemaError(f"no CRDs under {directory}/example/prometheus-operator-crd")
    return files


# --- built-in kinds from swagger.json ------------------------------------------------------------------


class _Swagger:
    def __init__(self, document: Schema) -> None:
        self.definitions: dict[str, Schema] = document["definitions"]
        self._expanded: dict[str, Schema] = {}

    def by_gvk(self) -> dict[GVK, str]:
        found: dict[GVK, str] = {}
        for name, definition in self.definitions.items():
            for gvk in definition.get("x-kubernetes-group-version-kind", []):
                group, version, kind = gvk.get("group", ""), gvk["version"], gvk["kind"]
                api_version = f"{group}/{version}" if group else version
                # The same kind is also listed under meta/v1 WatchEvent-style definitions; keep the first
                # definition whose name ends in the kind (the real object, not a list or an option).
                if name.endswith("." + kind):
                    found.setdefault((api_version, kind), name)
        return found

    def expand(self, node: Any, stack: tuple[str, ...] = ()) -> Any:
        if isinstance(node, list):
            return [self.expand(item, stack) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[-1]
            return self.definition(name, stack)
        if node.get("format") == "int-or-string":
            return copy.deepcopy(_SPECIAL[_INT_OR_STRING])
        return {key: self.expand(value, stack) for key, value in node.items()}

    def definition(self, name: str, stack: tuple[str, ...] = ()) -> Schema:
        if name in _SPECIAL:
            return copy.deepcopy(_SPECIAL[name])
        if name in stack:
            # A recursive type (JSONSchemaProps): accept anything below the first repetition.
            return {}
        if name not in self._expanded:
            self._expanded[name] = _strict(self.expand(self.definitions[name], (*stack, name)))
        return copy.deepcopy(self._expanded[name])


def _strict(schema: Schema) -> Schema:
    """additionalProperties: false where properties are listed; optional properties may be null."""
    if not isinstance(schema, dict):
        return schema
    properties = schema.get("properties")
    if isinstance(properties, dict):
        schema.setdefault("additionalProperties", False)
        required = set(schema.get("required", []))
        for key, prop in properties.items():
            if key not in required and isinstance(prop, dict):
                _allow_null(prop)
    return schema


def _allow_null(prop: Schema) -> None:
    kind = prop.get("type")
    if isinstance(kind, str) and kind != "null":
        prop["type"] = [kind, "null"]
    elif "oneOf" in prop and {"type": "null"} not in prop["oneOf"]:
        prop["oneOf"] = [*prop["oneOf"], {"type": "null"}]


def _pin_identity(schema: Schema, api_version: str, kind: str) -> Schema:
    props = schema.setdefault("properties", {})
    props["apiVersion"] = {"type": "string", "enum": [api_version]}
    props["kind"] = {"type": "string", "enum": [kind]}
    return schema


# --- custom resources from CRDs -----------------------------------------------------------------------

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _CRDLoader(_BaseLoader):  # type: ignore[misc]
    """SafeLoader that reads a bare ``=`` as the string "=" (PyYAML's value tag, pyyaml#89): the
    Prometheus Operator's CRDs list "=" among relabeling actions."""


_CRDLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: str(node.value))


def _from_crd_schema(node: Any) -> Any:
    """A CRD's structural OpenAPI v3 schema as a strict JSON schema (kubeconform's conversion)."""
    if isinstance(node, list):
        return [_from_crd_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("x-kubernetes-int-or-string"):
        out: Schema = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
        if node.get("nullable"):
            out["oneOf"].append({"type": "null"})
        return out
    out = {
        key: _from_crd_schema(value)
        for key, value in node.items()
        if not key.startswith("x-kubernetes-") and key != "nullable"
    }
    if node.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if "properties" in out and not node.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


def crd_schemas(files: Iterable[Path]) -> dict[GVK, Schema]:
    found: dict[GVK, Schema] = {}
    for path in files:
        for doc in yaml.load_all(path.read_text(encoding="utf-8"), Loader=_CRDLoader):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for version in spec["versions"]:
                raw = (version.get("schema") or {}).get("openAPIV3Schema")
                if raw is None:
                    continue
                api_version = f"{spec['group']}/{version['name']}"
                kind = spec["names"]["kind"]
                found[(api_version, kind)] = _pin_identity(_from_crd_schema(raw), api_version, kind)
    return found


# --- output -------------------------------------------------------------------------------------------


def schema_file(directory: Path, api_version: str, kind: str) -> Path:
    """Where kubeconform's LOCATION_TEMPLATE looks for (api_version, kind)."""
    parts = api_version.split("/")
    return directory / parts[0] / f"{kind.lower()}_{parts[-1]}.json"


def write_schemas(
    directory: Path, wanted: Iterable[GVK], *, swagger: Path, crd_files: Iterable[Path]
) -> dict[GVK, Path]:
    """Writes a schema for every wanted (apiVersion, kind); fails naming any kind no source describes."""
    wanted = sorted(set(wanted))
    custom = crd_schemas(crd_files)
    spec = _Swagger(json.loads(swagger.read_text(encoding="utf-8")))
    builtin = spec.by_gvk()
    written: dict[GVK, Path] = {}
    missing: list[str] = []
    for api_version, kind in wanted:
        if (api_version, kind) in custom:
            schema = custom[(api_version, kind)]
        elif (api_version, kind) in builtin:
            schema = _pin_identity(spec.definition(builtin[(api_version, kind)]), api_version, kind)
        else:
            missing.append(f"{api_version} {kind}")
            continue
        # No "$schema": OpenAPI's (and so Kubernetes') keywords are draft 4's, e.g. a boolean
        # exclusiveMinimum, which is kubeconform's default draft; declaring draft 7 would break them.
        path = schema_file(directory, api_version, kind)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(schema, separators=(",", ":")), encoding="utf-8")
        written[(api_version, kind)] = path
    if missing:
        raise SchemaError(
            "no schema source describes: " + ", ".join(missing) + " (add the CRD file that defines it)"
        )
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path, help="directory to write the schemas to")
    parser.add_argument("kinds", nargs="+", help="apiVersion:Kind, e.g. apps/v1:Deployment")
    parser.add_argument("--crd", type=Path, action="append", default=[], help="extra CRD file")
    args = parser.parse_args(argv)
    wanted = [tuple(item.split(":", 1)) for item in args.kinds]
    crds = [*sorted((REPO / "helm" / "grpo-operator" / "crds").glob("*.yaml")), *prometheus_operator_crds()]
    try:
        written = write_schemas(
            args.out,
            [(a, k) for a, k in wanted],
            swagger=kubernetes_swagger(),
            crd_files=[*crds, *args.crd],
        )
    except SchemaError as exc:
        print(f"kube_schemas: {exc}", file=sys.stderr)
        return 1
    for path in written.values():
        print(path)
    print(f"kubeconform -schema-location '{args.out}/{LOCATION_TEMPLATE}'", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
