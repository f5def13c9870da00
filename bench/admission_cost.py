"""What admitting one GRPOJob costs the API server, and where that cost comes from.

Creates N objects of each kind below, each kind in a fresh namespace, with one ``kubectl`` call per kind
(a JSON List, as bench/scale.py's floor does), and prints the wall time per object:

* ``configmap``: N ConfigMaps holding the job's manifest as text (an ordinary object of the same size);
* ``grpojob create``: N GRPOJobs (examples/tiny/grpojob.yaml under new names) through ``kubectl create``;
* ``grpojob apply --server-side``: the same through server-side apply, as bench/scale.py and GitOps tools
  send them (managed fields are computed for every field);
* ``grpojob, no CEL``: the same creates under a copy of the CRD (group ``bench.grpo.dev``) with every
  ``x-kubernetes-validations`` rule removed: the share of the CEL rules;
* ``grpojob, no schema``: a copy whose spec is ``x-kubernetes-preserve-unknown-fields`` alone: the share
  of the OpenAPI schema (defaulting, pruning, structural validation).

Runs on its own local cluster (``--cluster``, default grpo-admission) so that the CRD copies never reach
the test clusters. No operator runs: this is the API server's side of ``kubectl apply`` alone.

    .venv/bin/python bench/admission_cost.py --jobs 300
"""

from __future__ import annotations

import argparse
import copy
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from _bench import REPO, BenchCluster, create_namespaces, delete_namespaces, log, write_list

Obj = dict[str, Any]
CRD = REPO / "crds" / "grpo.dev_grpojobs.yaml"
BENCH_GROUP = "bench.grpo.dev"


def strip_rules(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: strip_rules(v) for k, v in node.items() if k != "x-kubernetes-validations"}
    if isinstance(node, list):
        return [strip_rules(v) for v in node]
    return node


def crd_copy(kind: str, plural: str, schema_of: Any) -> Obj:
    crd: Obj = yaml.safe_load(CRD.read_text())
    crd = copy.deepcopy(crd)
    crd["metadata"] = {"name": f"{plural}.{BENCH_GROUP}"}
    crd["spec"]["group"] = BENCH_GROUP
    names = crd["spec"]["names"]
    names.update(kind=kind, plural=plural, singular=plural[:-1], listKind=f"{kind}List")
    names.pop("shortNames", None)
    names.pop("categories", None)
    for version in crd["spec"]["versions"]:
        version["schema"]["openAPIV3Schema"] = schema_of(version["schema"]["openAPIV3Schema"])
    return crd


def permissive(schema: Obj) -> Obj:
    return {
        "type": "object",
        "properties": {
            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    }


def jobs(n: int, namespace: str, api_version: str, kind: str) -> list[Obj]:
    base: Obj = yaml.safe_load((REPO / "examples" / "tiny" / "grpojob.yaml").read_text())
    out = []
    for i in range(n):
        job = copy.deepcopy(base)
        job["apiVersion"], job["kind"] = api_version, kind
        job["metadata"] = {"name": f"j-{i:05d}", "namespace": namespace}
        out.append(job)
    return out


def configmaps(n: int, namespace: str) -> list[Obj]:
    text = (REPO / "examples" / "tiny" / "grpojob.yaml").read_text()
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"j-{i:05d}", "namespace": namespace},
            "data": {"grpojob.yaml": text},
        }
        for i in range(n)
    ]


def timed(cluster: BenchCluster, verb: list[str], items: list[Obj]) -> float:
    path = write_list(items)
    started = time.monotonic()
    cluster.kubectl(*verb, "-f", path, timeout=3600)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=300, help="objects of each kind (default 300)")
    parser.add_argument(
        "--cluster", default="grpo-admission", help="local cluster name (default grpo-admission)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()

    cluster = BenchCluster.up(args.cluster, 1, 1)
    cluster.kubectl("apply", "-f", str(CRD))
    no_cel = crd_copy("NoCelJob", "nocel-jobs", strip_rules)
    no_schema = crd_copy("NoSchemaJob", "noschema-jobs", permissive)
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [no_cel, no_schema]}),
    )
    for name in ("grpojobs.grpo.dev", f"nocel-jobs.{BENCH_GROUP}", f"noschema-jobs.{BENCH_GROUP}"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")

    n = args.jobs
    tag = uuid.uuid4().hex[:6]
    cases: list[tuple[str, list[str], Callable[[str], list[Obj]]]] = [
        ("configmap", ["create"], lambda ns: configmaps(n, ns)),
        ("grpojob create", ["create"], lambda ns: jobs(n, ns, "grpo.dev/v1alpha1", "GRPOJob")),
        (
            "grpojob apply --server-side",
            ["apply", "--server-side"],
            lambda ns: jobs(n, ns, "grpo.dev/v1alpha1", "GRPOJob"),
        ),
        ("grpojob, no CEL", ["create"], lambda ns: jobs(n, ns, f"{BENCH_GROUP}/v1alpha1", "NoCelJob")),
        ("grpojob, no schema", ["create"], lambda ns: jobs(n, ns, f"{BENCH_GROUP}/v1alpha1", "NoSchemaJob")),
    ]
    namespaces = [f"adm-{tag}-{i}" for i in range(len(cases))]
    create_namespaces(cluster, namespaces)
    figures: dict[str, float] = {}
    try:
        for (label, verb, make), namespace in zip(cases, namespaces, strict=True):
            seconds = timed(cluster, verb, make(namespace))
            figures[label] = seconds
            log(f"{label}: {n} objects in {seconds:.1f} s")
    finally:
        delete_namespaces(cluster, namespaces)
    floor = figures["configmap"] / n
    print(f"\n{n} objects of each kind; one kubectl call each; cluster {args.cluster}")
    print(f"{'kind':<30} {'ms/object':>10} {'x configmap':>12}")
    for label, seconds in figures.items():
        per = seconds / n
        print(f"{label:<30} {per * 1000:>10.1f} {per / floor:>12.2f}")
    if args.json:
        args.json.write_text(json.dumps({"objects": n, "seconds": figures}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
