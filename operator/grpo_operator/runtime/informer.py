"""Watch-backed caches of the GRPOJobs, their children and the nodes (client-go's informers).

Without them every reconcile read the job and listed nine child kinds (10 requests), and the resync
re-reconciled every job every 30 s: about 6,000 requests a minute at 300 idle jobs (bench/scale.py;
docs/scaling.md has the figures). With them a reconcile reads nothing from the API server: it decides
from the cached objects and only writes. The API server sends each change once, over one watch per
kind, whether one job or a thousand.

Semantics as in client-go's reflector, which the correctness of a level-based reconcile depends on:

* A (re)list replaces the whole store, so an object deleted while the watch was down (an API server
  restart, a 410 Gone) disappears from the cache too, with a DELETED notification.
* ``synced`` becomes true after the first complete list and stays true; until then (and for a kind
  the operator may not watch, HTTP 403) the controller falls back to listing that kind per reconcile,
  so a cache is only ever used when it is complete.
* The child caches hold only what the operator manages (``keep``: controlled by a GRPOJob, or a
  retained claim with the operator's marks), selected server-side by the labels only the operator sets;
  kinds whose body reconcile never reads are watched metadata-only. A tenant's objects that merely carry
  a job's label cost the operator no memory (bench/tenant_memory.py).
* A change tells the listener only when what the controller reads of the object changed (``view``):
  a Deployment's replica counters or the PV controller's marks on a bound claim update the cache and
  wake nobody. The echo of the operator's own write (same resourceVersion) wakes nobody either.
* Our own writes are put into the cache at once (``put``) unless the cache already holds a newer
  resourceVersion, so a decision is never made from an object older than one the operator wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import urlencode

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from grpo_operator.runtime.kube_client import Obj, Resource

log = logging.getLogger("grpo_operator.informer")

Key = tuple[str, str]
T = TypeVar("T")
# (event type, object) for every change: ADDED, MODIFIED, DELETED (also for objects a relist found gone).
Listener = Callable[[str, Obj], None]
# Which objects a cache keeps; the others are treated as absent (and never held in memory).
Keep = Callable[[Obj], bool]
# What of an object its listener acts on; a change that leaves it equal is not news.
View = Callable[[Obj], object]

# Metadata-only list and watch (what client-go's metadata informers ask for): the API server sends each
# object's metadata and nothing else, so a ConfigMap's data never reaches the operator. The trailing plain
# JSON lets a server without this support answer with whole objects, which ``slim`` then cuts down.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json"
METADATA_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json"

# The StorageClass a claim without storageClassName gets.
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"

LIST_PAGE = 500
WATCH_SECONDS = 300  # the server ends each watch after this long; the informer re-watches from where it was
RETRY_SECONDS = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


def _key(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _rv(obj: Obj | None) -> int | None:
    """The resourceVersion as a number: opaque by the API's contract, but etcd's revision in every API
    server; where it is not a number, ordering is unknown and the newest arrival wins."""
    value = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def slim(obj: Obj) -> Obj:
    """Drops managedFields, the largest part of most objects and never read by reconcile."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


class Informer:
    """List+watch of one resource in one namespace (or all), optionally label-selected."""

    def __init__(
        self,
        api: client.ApiClient,
        resource: Resource,
        namespace: str | None,
        *,
        label_selector: str | None = None,
        listener: Listener | None = None,
        timeout: float = 30.0,
        metadata_only: bool = False,
        keep: Keep | None = None,
        view: View | None = None,
        forbidden_means: str | None = None,
    ) -> None:
        """``forbidden_means``: what the operator does without this cache, logged when it may not watch."""
        self.api = api
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.listener = listener
        self.timeout = timeout
        self.metadata_only = metadata_only
        self.keep = keep
        self.view = view
        self.forbidden_means = (
            forbidden_means or "reading them per reconcile instead, which costs API requests"
        )
        self.objects: dict[Key, Obj] = {}
        self.synced = False
        self.forbidden = False
        self._stopping = threading.Event()
        self._response: Any = None

    @property
    def name(self) -> str:
        where = self.namespace or "all namespaces"
        return f"{self.resource.plural} in {where}"

    # --- the store, used from the event loop only --------------------------------------------------------

    def get(self, namespace: str, name: str) -> Obj | None:
        return self.objects.get((namespace, name))

    def put(self, obj: Obj) -> None:
        """An object the operator just wrote (the API server's response): newer than anything cached."""
        key = _key(obj)
        have, new = _rv(self.objects.get(key)), _rv(obj)
        if have is not None and new is not None and have > new:
            return
        obj.setdefault("kind", self.resource.kind)
        obj.setdefault("apiVersion", self.resource.api_version)
        self.objects[key] = slim(obj)

    def trim(self, obj: Obj) -> Obj:
        if self.metadata_only:
            obj = {"metadata": obj.get("metadata") or {}}
        obj["kind"] = self.resource.kind
        obj["apiVersion"] = self.resource.api_version
        return obj

    def _apply(self, type_: str, obj: Obj) -> None:
        key = _key(obj)
        obj = self.trim(obj)
        if type_ != "DELETED" and self.keep is not None and not self.keep(obj):
            if key not in self.objects:
                return  # not the operator's: never cached, nobody to tell
            type_ = "DELETED"  # it stopped being the operator's (e.g. its owner reference was removed)
        if type_ == "DELETED":
            self.objects.pop(key, None)
        else:
            before = self.objects.get(key)
            have, new = _rv(before), _rv(obj)
            if have is not None and new is not None and have > new:
                return  # our own newer write is already here; this event is older
            self.objects[key] = slim(obj)
            if have is not None and have == new:
                # The echo of the operator's own write, which ``put`` stored and the reconcile that wrote it
                # already decided from: nothing new to tell anyone.
                return
            if before is not None and self.view is not None and self.view(before) == self.view(obj):
                return  # changed only where the listener does not look
        if self.listener is not None:
            self.listener(type_, obj)

    def _replace(self, items: list[Obj]) -> None:
        if self.keep is not None:
            items = [o for o in items if self.keep(self.trim(o))]
        fresh = {_key(o): o for o in items}
        for key in [k for k in self.objects if k not in fresh]:
            self._apply("DELETED", self.objects[key])
        for obj in items:
            self._apply("MODIFIED" if _key(obj) in self.objects else "ADDED", obj)
        self.synced = True

    # --- the list+watch loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Lists and watches until cancelled."""
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            try:
                items, rv = await _in_thread(loop, self._list)
                self._replace(items)
                failures = 0
                while True:
                    rv = await _in_thread(loop, self._watch, rv, loop)
                    failures = 0
            except Gone:
                log.debug("watch of %s expired (410); listing again", self.name)
                continue
            except asyncio.CancelledError:
                self._stopping.set()
                self._close()
                raise
            except ApiException as exc:
                if exc.status == 403:
                    self.forbidden = True
                    self.synced = False
                    log.warning(
                        "no permission to list/watch %s (HTTP 403): %s; grant list and watch on %s to the operator",
                        self.name,
                        self.forbidden_means,
                        self.resource.plural,
                    )
                    return
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                log.warning("watching %s failed (HTTP %s); retrying in %.0fs", self.name, exc.status, delay)
                await asyncio.sleep(delay)
            except Exception as exc:  # connection refused/reset while the API server is away
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                log.warning("watching %s failed (%s); retrying in %.0fs", self.name, exc, delay)
                await asyncio.sleep(delay)

    def _request(self, query: dict[str, Any], timeout: Any) -> Any:
        path = self.resource.path(self.namespace) + "?" + urlencode(query)
        accept = "application/json"
        if self.metadata_only:
            accept = METADATA_WATCH if query.get("watch") else METADATA_LIST
        headers = {"Accept": accept}
        _, url, header_params, _, _ = self.api.param_serialize(
            method="GET", resource_path=path, header_params=headers, auth_settings=["BearerToken"]
        )
        response = self.api.call_api("GET", url, header_params=header_params, _request_timeout=timeout)
        if not 200 <= response.status <= 299:
            response.read()
            if response.status == 410:
                raise Gone()
            raise ApiException(http_resp=response)
        return response

    def _list(self) -> tuple[list[Obj], str]:
        items: list[Obj] = []
        query: dict[str, Any] = {"limit": LIST_PAGE}
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        while True:
            response = self._request(query, self.timeout)
            page = json.loads(response.read() or b"{}")
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                return items, str(meta.get("resourceVersion") or "")
            query["continue"] = meta["continue"]

    def _watch(self, rv: str, loop: asyncio.AbstractEventLoop) -> str:
        """One watch request; returns the resourceVersion to continue from when the server ends it."""
        query: dict[str, Any] = {
            "watch": "true",
            "resourceVersion": rv,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": WATCH_SECONDS,
        }
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        # Connect timeout as for any request; reads may be quiet for the whole watch.
        response = self._request(query, (self.timeout, WATCH_SECONDS + 30))
        self._response = response.response
        try:
            for event in _events(response.response):
                if self._stopping.is_set():
                    return rv
                type_, obj = event.get("type"), event.get("object") or {}
                if type_ == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise ApiException(status=obj.get("code"), reason=str(obj.get("message")))
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if type_ in ("ADDED", "MODIFIED", "DELETED"):
                    try:
                        loop.call_soon_threadsafe(self._apply, type_, obj)
                    except RuntimeError:  # the event loop is closed: the operator is exiting
                        return rv
            return rv
        finally:
            self._response = None
            response.response.release_conn()

    def _close(self) -> None:
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):  # already closed
                response.shutdown()


def _in_thread(loop: asyncio.AbstractEventLoop, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """Runs blocking ``fn`` in a daemon thread: a watch blocked in a read must never delay the process's
    exit (executor threads are joined at exit; a quiet watch can block for minutes)."""
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, exc: BaseException | None) -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def target() -> None:
        try:
            result, exc = fn(*args), None
        except BaseException as error:  # handed to the awaiting task
            result, exc = None, error
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody is waiting any more
            loop.call_soon_threadsafe(settle, result, exc)

    threading.Thread(target=target, daemon=True, name="grpo-watch").start()
    return future


def _events(response: Any) -> Iterator[Obj]:
    for line in iter_resp_lines(response):
        if line:
            yield json.loads(line)


class Informers:
    """All informers of one operator."""

    def __init__(self, informers: list[Informer]) -> None:
        self.all = informers
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for informer in self.all:
            self._tasks.append(asyncio.create_task(informer.run(), name=f"watch {informer.name}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):  # cancelled or failed: stopping either way
                await task
        self._tasks.clear()

    def alive(self) -> bool:
        return not any(t.done() and not t.cancelled() and t.exception() is not None for t in self._tasks)


class ClusterCache:
    """The operator's view of the cluster: GRPOJobs, every child kind (label grpo.dev/job) and nodes,
    each watched once per namespace (or once cluster-wide), with an index of children by job."""

    def __init__(
        self,
        api: client.ApiClient,
        namespaces: list[str | None],
        *,
        job_resource: Resource,
        child_resources: tuple[Resource, ...],
        node_resource: Resource,
        job_label: str,
        on_job: Callable[[str, str, str, str | None], None],
        on_child: Callable[[str, str, str], None],
        timeout: float = 30.0,
        child_selector: str | None = None,
        keep_child: Keep | None = None,
        metadata_only: frozenset[str] = frozenset(),
        child_view: View | None = None,
        storage_class_resource: Resource | None = None,
    ) -> None:
        """``child_selector`` (default: ``job_label`` present) is the server-side filter of every child
        watch, ``keep_child`` the client-side one; kinds in ``metadata_only`` are watched as metadata;
        a child's change wakes its job only when ``child_view`` of it changed."""
        self.job_label = job_label
        self._on_job = on_job
        self._on_child = on_child
        self.jobs = {
            ns: Informer(api, job_resource, ns, listener=self._job_event, timeout=timeout)
            for ns in namespaces
        }
        self.children: dict[str, dict[str | None, Informer]] = {
            r.kind: {
                ns: Informer(
                    api,
                    r,
                    ns,
                    label_selector=child_selector or job_label,
                    listener=self._child_event,
                    timeout=timeout,
                    metadata_only=r.kind in metadata_only,
                    keep=keep_child,
                    view=child_view,
                )
                for ns in namespaces
            }
            for r in child_resources
        }
        self.nodes = Informer(api, node_resource, None, timeout=timeout)
        self.storage_classes = (
            Informer(
                api,
                storage_class_resource,
                None,
                timeout=timeout,
                forbidden_means="new gangs are created without waiting for their volume to be bound, and "
                "the scheduler may turn their pods away until it is",
            )
            if storage_class_resource
            else None
        )
        # (namespace, job) -> {(kind, name)}, and the reverse, so a relabelled or deleted child leaves its job.
        self._by_job: dict[Key, set[tuple[str, str]]] = {}
        self._job_of: dict[tuple[str, str, str], Key] = {}
        everything = [
            *self.jobs.values(),
            *(i for per in self.children.values() for i in per.values()),
            self.nodes,
            *([self.storage_classes] if self.storage_classes is not None else []),
        ]
        self.informers = Informers(everything)

    # --- listeners ------------------------------------------------------------------------------------------

    def _job_event(self, type_: str, obj: Obj) -> None:
        namespace, name = _key(obj)
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        self._on_job(type_, namespace, name, str(rv) if rv is not None else None)

    def _child_event(self, type_: str, obj: Obj) -> None:
        for namespace, job in self._index(type_, obj):
            self._on_child(namespace, job, str(obj.get("kind")))

    def _index(self, type_: str, obj: Obj) -> set[Key]:
        """Files a child under its job (or removes it); returns the jobs whose children changed."""
        namespace, name = _key(obj)
        ref = (str(obj.get("kind")), namespace, name)
        job = ((obj.get("metadata") or {}).get("labels") or {}).get(self.job_label)
        before = self._job_of.pop(ref, None)
        if before is not None:
            self._by_job.get(before, set()).discard((ref[0], name))
            if not self._by_job.get(before):
                self._by_job.pop(before, None)
        if type_ != "DELETED" and job:
            key = (namespace, str(job))
            self._job_of[ref] = key
            self._by_job.setdefault(key, set()).add((ref[0], name))
        return {owner for owner in (before, (namespace, str(job)) if job else None) if owner is not None}

    # --- reads --------------------------------------------------------------------------------------------------

    def _informer(self, per_namespace: dict[str | None, Informer], namespace: str) -> Informer | None:
        informer = per_namespace.get(namespace) or per_namespace.get(None)
        if informer is None or not informer.synced or informer.forbidden:
            return None
        return informer

    def job(self, namespace: str, name: str) -> tuple[bool, Obj | None]:
        """(cache usable, the job or None when it does not exist)."""
        informer = self._informer(self.jobs, namespace)
        if informer is None:
            return False, None
        return True, informer.get(namespace, name)

    def job_keys(self) -> list[Key] | None:
        """Every cached job, or None while any job informer is not usable."""
        keys: list[Key] = []
        for informer in self.jobs.values():
            if not informer.synced or informer.forbidden:
                return None
            keys.extend(informer.objects)
        return keys

    def put_job(self, obj: Obj) -> None:
        namespace, _ = _key(obj)
        informer = self.jobs.get(namespace) or self.jobs.get(None)
        if informer is not None:
            informer.put(obj)

    def put_child(self, obj: Obj) -> None:
        """A child the operator just created or updated (the API server's response), cached at once: the next
        reconcile must not see it missing and create it again. Its watch event, when it comes, is an echo."""
        namespace, _ = _key(obj)
        per_namespace = self.children.get(str(obj.get("kind")))
        informer = self._informer(per_namespace, namespace) if per_namespace is not None else None
        if informer is None:
            return  # not watched (yet): that kind is listed per reconcile
        obj = informer.trim(obj)
        if informer.keep is not None and not informer.keep(obj):
            return
        informer.put(obj)
        self._index("ADDED", obj)

    def children_of(self, namespace: str, job: str) -> tuple[list[Obj], set[str]]:
        """(cached children of the job, kinds whose cache is not usable and must be listed instead)."""
        names = self._by_job.get((namespace, job), set())
        objects: list[Obj] = []
        missing: set[str] = set()
        for kind, per_namespace in self.children.items():
            informer = self._informer(per_namespace, namespace)
            if informer is None:
                missing.add(kind)
                continue
            for child_kind, name in names:
                if child_kind == kind:
                    obj = informer.get(namespace, name)
                    if obj is not None:
                        objects.append(obj)
        return objects, missing

    def node_names(self) -> frozenset[str] | None:
        """Names of all nodes, or None while the node cache is not usable."""
        if not self.nodes.synced or self.nodes.forbidden:
            return None
        return frozenset(name for _, name in self.nodes.objects)

    def storage_class_modes(self) -> tuple[tuple[tuple[str, str], ...], str | None] | None:
        """((class, volumeBindingMode) of every StorageClass, the default class), or None while unknown."""
        informer = self.storage_classes
        if informer is None or not informer.synced or informer.forbidden:
            return None
        modes: list[tuple[str, str]] = []
        defaults: list[tuple[str, str]] = []
        for (_, name), obj in sorted(informer.objects.items()):
            modes.append((name, str(obj.get("volumeBindingMode") or "Immediate")))
            meta = obj.get("metadata") or {}
            if (meta.get("annotations") or {}).get(DEFAULT_CLASS_ANNOTATION) == "true":
                defaults.append((str(meta.get("creationTimestamp") or ""), name))
        # With several defaults the API server gives a new claim the newest (as Kubernetes does since 1.26).
        return tuple(modes), max(defaults)[1] if defaults else None
