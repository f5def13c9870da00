"""Rewrites Kueue's CRDs and webhook configurations (from its module source) for a Kueue controller
manager that runs as a local process beside the local control plane instead of in a pod.

In a real install every webhook points at the in-cluster Service ``kueue-webhook-service`` and the
certificate is managed in-cluster. Here the API server reaches the manager at
``https://127.0.0.1:<port>`` with a self-signed certificate, so each ``clientConfig`` becomes
``{url, caBundle}``. Only the webhooks of what the local manager serves are kept (Kueue's own kinds and
plain pods): a webhook for an integration the manager does not enable would answer 404 and, with
``failurePolicy: Fail``, block every Deployment or Job in the cluster. The pod webhooks are limited to
namespaces labelled ``kueue-managed=true``, as the manager's ``managedJobsNamespaceSelector`` is.

Usage: kueue_manifests.py <testbins kueue dir> <webhook port> <ca.crt>   (prints a YAML stream)
"""

from __future__ import annotations

import base64
import re
import sys
from pathlib import Path
from typing import Any

import yaml

SERVED_GROUPS = {"kueue.x-k8s.io", ""}  # "" is the core group: the pod webhooks
MANAGED_NAMESPACES = {"matchLabels": {"kueue-managed": "true"}}


def client_config(port: int, ca: str, path: str) -> dict[str, Any]:
    return {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}


def converted_kinds(root: Path) -> set[str]:
    """Plurals of the CRDs Kueue's own kustomization gives a conversion webhook (the uncommented
    ``patches/webhook_in_<plural>.yaml`` entries); the others (e.g. ResourceFlavor) convert with
    strategy None, and the manager answers their conversion requests with an error."""
    text = (root / "crds" / "kustomization.yaml").read_text()
    return set(re.findall(r"^- path: patches/webhook_in_([a-z]+)\.yaml", text, flags=re.MULTILINE))


def crds(root: Path, port: int, ca: str) -> list[dict[str, Any]]:
    out = []
    converted = converted_kinds(root)
    for path in sorted((root / "crds").glob("kueue.x-k8s.io_*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["plural"] in converted:
            # The manager converts between the served versions (v1beta1, v1beta2).
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": client_config(port, ca, "/convert"),
                    "conversionReviewVersions": ["v1"],
                },
            }
        out.append(crd)
    return out


def webhooks(root: Path, port: int, ca: str) -> list[dict[str, Any]]:
    out = []
    for doc in yaml.safe_load_all((root / "webhook" / "manifests.yaml").read_text()):
        if not doc:
            continue
        kept = []
        for hook in doc["webhooks"]:
            groups = {g for rule in hook.get("rules", []) for g in rule.get("apiGroups", [])}
            if not groups <= SERVED_GROUPS:
                continue
            hook["clientConfig"] = client_config(port, ca, hook["clientConfig"]["service"]["path"])
            if groups == {""}:
                hook["namespaceSelector"] = MANAGED_NAMESPACES
            kept.append(hook)
        doc["metadata"] = {"name": f"kueue-{doc['metadata']['name']}"}
        doc["webhooks"] = kept
        out.append(doc)
    return out


def main() -> int:
    root, port, ca_file = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    ca = base64.b64encode(ca_file.read_bytes()).decode()
    yaml.safe_dump_all([*crds(root, port, ca), *webhooks(root, port, ca)], sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
