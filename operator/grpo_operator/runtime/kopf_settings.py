"""Every kopf setting the operator changes, and why — in one place.

The operator uses kopf for its lifecycle (login, startup, cleanup, signals) and logging, watches
GRPOJobs and their children with its own informers (runtime/informer.py: caches with client-go's
relist semantics, which reconcile reads instead of the API server) and keeps decisions in its own
level-based reconcile loop (runtime/controller.py). The settings follow from that:

* **No finalizer.** No resource handlers are registered (no timers, daemons or on.delete handlers, the
  kopf features that add a finalizer). Deleting a GRPOJob therefore never waits for the operator: the
  Kubernetes garbage collector removes the children through their owner references, and a checkpoint
  PVC with `retention: Retain` has no owner reference and stays. If the operator is down, deletion is
  exactly as fast as with it up. The finalizer name is still set to our own domain, so that if a
  future handler ever needed one, it would be recognisable in `kubectl get -o yaml` and documented
  (docs/operations.md, "Deletion").
* **No progress or diff-base in status.** With no resource handler kopf stores nothing, but the storages
  are pinned to annotations under our own prefix anyway: the GRPOJob status belongs to the operator's
  reconcile (phase, conditions, ...) and the trainer (progress, rewards, checkpoint), and nothing else
  may write there.
* **No kopf event posting.** The reconcile loop posts its own events with fixed reasons (Created,
  Unschedulable, Restarting, ResumedFromCheckpoint, Succeeded, Failed, ...); kopf's per-handler events
  would only add noise.
* **Standalone.** One replica (Deployment strategy Recreate). kopf's peering is not leader election:
  two peers of equal priority both pause, so peering is off rather than half-on.
* **Watch timeouts.** For kopf's own streams (its CRD and namespace scanning): server-side watch timeout
  below the client timeout, so streams are recycled by the server before any proxy or load balancer
  silently drops them. The runtime's informers do the same with their own timeouts (informer.py).
* **Server-side label filter.** The informers watch only pods (and other children) that carry the
  labels the operator sets (app.kubernetes.io/managed-by=grpo-operator and grpo.dev/job), so a big
  cluster's other pods are never sent to the operator; the kopf setting below says the same for any
  kopf watch of pods.
"""

from __future__ import annotations

import logging

import kopf

from grpo_operator.builders.common import LABEL_JOB

FINALIZER = "grpo.dev/finalizer"
ANNOTATION_PREFIX = "grpo.dev"


def configure(settings: kopf.OperatorSettings) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.posting.enabled = False
    settings.posting.level = logging.WARNING
    settings.peering.standalone = True
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    settings.watching.label_selectors[("v1", "pods")] = LABEL_JOB
