"""Dynamic volume provisioner for the local simulated cluster (test harness, not product code).

The simulated nodes run no kubelet, so no CSI driver exists. This process plays the part of a
dynamic provisioner for the ``grpo-local`` StorageClass: for every Pending claim of that class it
creates a hostPath PersistentVolume with the claim's size and access modes, pre-bound to the claim,
and the real controller-manager's PV controller completes the binding. Released volumes whose
reclaim policy is Delete are deleted with their directory, as a real provisioner would. The
directory of a claim is ``<root>/<namespace>/<claim>``, so local processes that stand in for pods
(the demo's trainer) can read and write the same files a pod would.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

PROVISIONER = "grpo.dev/local-sim"
STORAGE_CLASS = "grpo-local"
LOG = logging.getLogger("provisioner")


def pv_name(claim_uid: str) -> str:
    return f"pvc-{claim_uid}"


def claim_dir(root: Path, namespace: str, name: str) -> Path:
    return root / namespace / name


def build_pv(claim: Any, root: Path) -> dict[str, Any]:
    meta = claim.metadata
    path = claim_dir(root, meta.namespace, meta.name)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": pv_name(meta.uid),
            "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": claim.spec.resources.requests["storage"]},
            "accessModes": list(claim.spec.access_modes or ["ReadWriteOnce"]),
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": STORAGE_CLASS,
            "volumeMode": claim.spec.volume_mode or "Filesystem",
            "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta.namespace,
                "name": meta.name,
                "uid": meta.uid,
            },
        },
    }


def provision(core: client.CoreV1Api, claim: Any, root: Path) -> None:
    if claim.spec.storage_class_name != STORAGE_CLASS or claim.spec.volume_name:
        return
    if claim.status.phase != "Pending" or claim.metadata.deletion_timestamp:
        return
    path = claim_dir(root, claim.metadata.namespace, claim.metadata.name)
    path.mkdir(parents=True, exist_ok=True)
    try:
        core.create_persistent_volume(build_pv(claim, root))
        LOG.info(
            "provisioned %s for %s/%s",
            pv_name(claim.metadata.uid),
            claim.metadata.namespace,
            claim.metadata.name,
        )
    except ApiException as exc:
        if exc.status != 409:  # 409: provisioned already (restart or duplicate event)
            raise


def reclaim(core: client.CoreV1Api, pv: Any) -> None:
    annotations = pv.metadata.annotations or {}
    if annotations.get("pv.kubernetes.io/provisioned-by") != PROVISIONER:
        return
    if pv.status.phase != "Released" or pv.spec.persistent_volume_reclaim_policy != "Delete":
        return
    if pv.spec.host_path:
        shutil.rmtree(pv.spec.host_path.path, ignore_errors=True)
    try:
        core.delete_persistent_volume(pv.metadata.name)
        LOG.info("deleted released volume %s", pv.metadata.name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def sync_once(core: client.CoreV1Api, root: Path) -> str:
    for claim in core.list_persistent_volume_claim_for_all_namespaces().items:
        provision(core, claim, root)
    volumes = core.list_persistent_volume()
    for pv in volumes.items:
        reclaim(core, pv)
    return str(volumes.metadata.resource_version)


def run(kubeconfig: str, root: Path) -> None:
    config.load_kube_config(config_file=kubeconfig)
    core = client.CoreV1Api()
    while True:
        try:
            sync_once(core, root)
            # Watch both kinds in turn with a short timeout: simple, and a missed event is caught by
            # the next full sync within seconds.
            for event in watch.Watch().stream(
                core.list_persistent_volume_claim_for_all_namespaces, timeout_seconds=5
            ):
                provision(core, event["object"], root)
        except Exception:  # keep serving through API server restarts
            LOG.exception("sync failed; retrying in 2s")
            time.sleep(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--root", required=True, type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    run(args.kubeconfig, args.root)


if __name__ == "__main__":
    main()
