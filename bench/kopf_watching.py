"""The operator with kopf's own watching in place of the runtime's informers: a benchmark variant.

    .venv/bin/python bench/scale.py --runtime kopf --jobs 300 --cluster grpo-runtime-scale
    .venv/bin/python bench/kopf_watching.py run --all-namespaces     # by hand: the CLI of `grpo-operator run`

The product's runtime (operator/grpo_operator/runtime) watches GRPOJobs, every child kind and nodes with
its own informers, and kopf runs only the process's lifecycle. Here kopf's resource machinery delivers the
events instead: ``@kopf.on.event`` for GRPOJobs, every kind in ``CHILD_RESOURCES`` and nodes, and
``@kopf.index`` keeps the jobs by key, the children by owning job and the node names. Everything else is
the product's own code: the same ``Controller`` (work queue, workers, resync), the same pure
``reconcile(job, observed, now, settings) -> Plan`` and the same plan application, with the same
server-side label selection of children and the same immediate caching of the operator's own writes.
The only difference is who watches and caches. docs/scaling.md ("kopf's own watching vs the runtime's
informers") has the figures and the decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any, cast

import kopf
from grpo_operator import __version__
from grpo_operator.api.resource import GROUP, PLURAL, VERSION
from grpo_operator.builders.common import LABEL_JOB
from grpo_operator.cli import _configure_logging, _parser
from grpo_operator.runtime import kopf_settings
from grpo_operator.runtime.controller import Controller
from grpo_operator.runtime.informer import ClusterCache, slim
from grpo_operator.runtime.kube_client import CHILD_RESOURCES, NODE, Obj, Resource
from grpo_operator.runtime.process import lifecycle_registry, make_controller, run_operator
from grpo_operator.runtime.wakeups import CHILD_SELECTOR, METADATA_ONLY_KINDS, managed_child
from grpo_operator.settings import OperatorSettings, SettingsError

log = logging.getLogger("grpo_operator")

# Index names (kopf names an index after its handler's id).
JOBS = "grpojobs"
CHILDREN = "children_by_job"
NODES = "node_names"

Key = tuple[str, str]
ChildRef = tuple[str, str, str]  # kind, namespace, name


def _rv(obj: Obj | None) -> int | None:
    value = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _managed(body: kopf.Body, **_: Any) -> bool:
    return managed_child(cast(Obj, body))


def _raw(body: kopf.Body, kind: str, api_version: str) -> Obj:
    """What the runtime's informers keep of an object: the whole object without managedFields, or only the
    metadata for the kinds reconcile reads only the metadata of."""
    raw: Obj = {key: body[key] for key in body}
    if kind in METADATA_ONLY_KINDS:
        raw = {"metadata": dict(raw.get("metadata") or {})}
    else:
        raw["metadata"] = dict(raw.get("metadata") or {})
    raw["kind"] = kind
    raw["apiVersion"] = api_version
    return slim(raw)


class _Lifecycle:
    """What the Controller asks of its cache's watches: kopf runs them, so there is nothing to stop here."""

    def alive(self) -> bool:
        return True

    async def stop(self) -> None:
        return None


class KopfCache:
    """The reads of the runtime's ClusterCache (job, job_keys, children_of, node_names) and its writes of
    the operator's own results (put_job, put_child), served from kopf's indexes.

    kopf's indexes cannot be written by the operator, so what the operator wrote is kept next to them until
    the index holds that resourceVersion or a newer one: the next reconcile decides from at least what the
    last one wrote, as with the runtime's informers."""

    def __init__(self) -> None:
        self.jobs: kopf.Index[Key, Obj] | None = None
        self.children: kopf.Index[Key, Obj] | None = None
        self.nodes: kopf.Index[None, str] | None = None
        # kopf calls event handlers only once every index is filled from its first list; until then the
        # Controller reads from the API server, as it does while an informer is not synced.
        self.synced = False
        self.informers = _Lifecycle()
        self._own_jobs: dict[Key, Obj] = {}
        self._own_children: dict[ChildRef, Obj] = {}

    def mark_synced(self) -> None:
        if not self.synced:
            self.synced = True
            log.info("kopf's indexes are complete: its events now reach the work queue")

    # --- reads ---------------------------------------------------------------------------------------------------

    def job(self, namespace: str, name: str) -> tuple[bool, Obj | None]:
        if not self.synced or self.jobs is None:
            return False, None
        key = (namespace, name)
        indexed = next(iter(self.jobs[key]), None) if key in self.jobs else None
        own = self._own_jobs.get(key)
        if own is not None and (indexed is None or (_rv(indexed) or 0) < (_rv(own) or 0)):
            if indexed is None:
                return True, None  # deleted since the operator wrote it
            return True, own
        self._own_jobs.pop(key, None)
        return True, indexed

    def job_keys(self) -> list[Key] | None:
        if not self.synced or self.jobs is None:
            return None
        return list(self.jobs)

    def children_of(self, namespace: str, job: str) -> tuple[list[Obj], set[str]]:
        if not self.synced or self.children is None:
            return [], {r.kind for r in CHILD_RESOURCES}
        key = (namespace, job)
        found: dict[tuple[str, str], Obj] = {}
        if key in self.children:
            for obj in self.children[key]:
                found[(str(obj["kind"]), str(obj["metadata"]["name"]))] = obj
        for ref, own in list(self._own_children.items()):
            kind, own_namespace, name = ref
            if own_namespace != namespace or own["metadata"].get("labels", {}).get(LABEL_JOB) != job:
                continue
            indexed = found.get((kind, name))
            if indexed is not None and (_rv(indexed) or 0) >= (_rv(own) or 0):
                del self._own_children[ref]  # the watch has caught up with the operator's write
                continue
            found[(kind, name)] = own
        return list(found.values()), set()

    def node_names(self) -> frozenset[str] | None:
        if not self.synced or self.nodes is None:
            return None
        return frozenset(self.nodes[None]) if None in self.nodes else frozenset()

    # --- the operator's own writes ----------------------------------------------------------------------------

    def put_job(self, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        self._own_jobs[(str(meta.get("namespace")), str(meta.get("name")))] = slim(obj)

    def put_child(self, obj: Obj) -> None:
        kind = str(obj.get("kind"))
        if not managed_child(obj):
            return
        raw: Obj
        if kind in METADATA_ONLY_KINDS:
            raw = {"metadata": obj.get("metadata") or {}, "kind": kind, "apiVersion": obj.get("apiVersion")}
        else:
            raw = obj
        meta = raw["metadata"]
        self._own_children[(kind, str(meta.get("namespace")), str(meta.get("name")))] = slim(raw)

    def echo(self, kind: str, obj: Obj) -> bool:
        """Whether a watch event is the echo of the operator's own write of a child (nothing new to decide)."""
        meta = obj.get("metadata") or {}
        own = self._own_children.get((kind, str(meta.get("namespace")), str(meta.get("name"))))
        return own is not None and _rv(own) is not None and _rv(own) == _rv(obj)


def register_watching(registry: kopf.OperatorRegistry, controller: Controller, cache: KopfCache) -> None:
    """kopf's resource handlers: indexes of jobs, children and nodes, and events that queue the job's key."""

    def selector(resource: Resource) -> tuple[str, str, str]:
        return resource.group, resource.version, resource.plural

    job_resource = (GROUP, VERSION, PLURAL)

    @kopf.index(*job_resource, id=JOBS, registry=registry)
    async def index_job(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict[Key, Obj]:
        return {(str(namespace), name): _raw(body, "GRPOJob", f"{GROUP}/{VERSION}")}

    @kopf.on.event(*job_resource, id="grpojob-event", registry=registry)
    async def job_event(
        type: str | None, namespace: str | None, name: str, meta: kopf.Meta, **_: Any
    ) -> None:
        cache.mark_synced()
        rv = meta.get("resourceVersion")
        controller.job_event(type, str(namespace), name, str(rv) if rv is not None else None)

    def register_child(resource: Resource) -> None:
        kind, api_version = resource.kind, resource.api_version

        # ``when``, not a None result, keeps other objects out: kopf drops an object from an index only when
        # the index's handler stops matching it (a None result would keep its earlier value).
        @kopf.index(
            *selector(resource),
            id=CHILDREN,
            labels={LABEL_JOB: kopf.PRESENT},
            when=_managed,
            registry=registry,
        )
        async def index_child(body: kopf.Body, namespace: str | None, **_: Any) -> dict[Key, Obj]:
            raw = _raw(body, kind, api_version)
            return {(str(namespace), str(raw["metadata"]["labels"][LABEL_JOB])): raw}

        @kopf.on.event(
            *selector(resource), id=f"{kind}-event", labels={LABEL_JOB: kopf.PRESENT}, registry=registry
        )
        async def child_event(type: str | None, body: kopf.Body, namespace: str | None, **_: Any) -> None:
            cache.mark_synced()
            raw = _raw(body, kind, api_version)
            if type != "DELETED" and (not managed_child(raw) or cache.echo(kind, raw)):
                return
            controller.child_event(str(namespace), str(raw["metadata"]["labels"][LABEL_JOB]), kind)

    for resource in CHILD_RESOURCES:
        register_child(resource)

    @kopf.index(*selector(NODE), id=NODES, registry=registry)
    async def index_node(name: str, **_: Any) -> str:
        return name

    @kopf.on.event(*selector(NODE), id="node-event", registry=registry)
    async def node_event(**_: Any) -> None:
        cache.mark_synced()  # nodes always exist: the first event says every index is filled


def configure(settings: kopf.OperatorSettings) -> None:
    """The product's kopf settings, plus what kopf's watches need to see only what the informers see."""
    kopf_settings.configure(settings)
    for resource in CHILD_RESOURCES:
        settings.watching.label_selectors[(resource.group, resource.version, resource.plural)] = (
            CHILD_SELECTOR
        )


def build_registry(controller: Controller, cache: KopfCache) -> kopf.OperatorRegistry:
    def prepare(settings: kopf.OperatorSettings, kwargs: dict[str, Any]) -> None:
        configure(settings)
        cache.jobs = kwargs[JOBS]
        cache.children = kwargs[CHILDREN]
        cache.nodes = kwargs[NODES]

    def start() -> None:
        controller.start(watch=False)
        # The Controller reads its cache through ClusterCache's methods only; KopfCache has the same ones.
        controller.cache = cast(ClusterCache, cache)
        log.info(
            "grpo-operator started: kopf watches GRPOJobs, %d child kinds and nodes; %d workers, resync every %.0fs",
            len(CHILD_RESOURCES),
            controller.settings.workers,
            controller.settings.resync_seconds,
        )

    registry = lifecycle_registry(controller, prepare, start)
    register_watching(registry, controller, cache)
    return registry


def _settings(args: Any, namespaces: Iterable[str] | None) -> OperatorSettings:
    return OperatorSettings.from_env(
        os.environ,
        namespaces=tuple(namespaces) if namespaces else None,
        all_namespaces=True if args.all_namespaces else None,
        http_host=args.http_host,
        http_port=args.http_port,
        workers=args.workers,
        resync_seconds=args.resync_seconds,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The arguments of `grpo-operator run`."""
    args = _parser().parse_args(argv)
    _configure_logging(args.verbose, args.log_format)
    try:
        settings = _settings(args, args.namespace)
    except SettingsError as exc:
        print(f"kopf_watching: {exc}", file=sys.stderr)
        return 2
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    controller = make_controller(settings, args.kubeconfig)
    log.info("grpo-operator %s starting (kopf's own watching)", __version__)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            run_operator(controller, registry=build_registry(controller, KopfCache()), configure=configure)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
