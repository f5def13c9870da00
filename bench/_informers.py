"""Watching from the benchmarks: list+watch of one resource in a thread."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from _bench import LABEL_JOB, Obj
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException


class Informer(threading.Thread):
    """List+watch of one resource across all namespaces; keeps the objects and when each was first seen.

    ``on_event(type, obj, t)`` runs in this thread for every change, with the monotonic time the event
    arrived."""

    def __init__(
        self,
        api: client.ApiClient,
        list_fn: Callable[..., Any],
        on_event: Callable[[str, Obj, float], None] | None = None,
        **list_kwargs: Any,
    ) -> None:
        super().__init__(daemon=True)
        self.api = api
        self.list_fn = list_fn
        self.list_kwargs = list_kwargs
        self.on_event = on_event
        self.objects: dict[tuple[str, str], Obj] = {}
        self.first_seen: dict[tuple[str, str], float] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.synced = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def _handle(self, type_: str, obj: Obj, t: float) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name")))
        with self.lock:
            if type_ == "DELETED":
                self.objects.pop(key, None)
            else:
                self.objects[key] = obj
                self.first_seen.setdefault(key, t)
        if self.on_event is not None:
            self.on_event(type_, obj, t)

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                listing = self.list_fn(_preload_content=False, **self.list_kwargs)
                data = json.loads(listing.data)
                now = time.monotonic()
                seen = set()
                for item in data.get("items") or []:
                    self._handle("ADDED", item, now)
                    meta = item["metadata"]
                    seen.add((str(meta.get("namespace") or ""), str(meta["name"])))
                with self.lock:
                    gone = [k for k in self.objects if k not in seen]
                for key in gone:
                    self._handle("DELETED", {"metadata": {"namespace": key[0], "name": key[1]}}, now)
                self.synced.set()
                rv = data["metadata"]["resourceVersion"]
                stream = watch.Watch().stream(
                    self.list_fn,
                    resource_version=rv,
                    timeout_seconds=60,
                    allow_watch_bookmarks=False,
                    _request_timeout=90,
                    **self.list_kwargs,
                )
                for event in stream:
                    if self._stop.is_set():
                        return
                    raw = event.get("raw_object") or {}
                    if event["type"] == "ERROR":
                        break
                    self._handle(event["type"], raw, time.monotonic())
            except ApiException as exc:
                if exc.status != 410:
                    time.sleep(1)
            except Exception:  # API server down (chaos) or a dropped stream: list again shortly
                time.sleep(1)

    def snapshot(self) -> list[Obj]:
        with self.lock:
            return list(self.objects.values())


def job_informer(
    api: client.ApiClient, on_event: Callable[[str, Obj, float], None] | None = None
) -> Informer:
    custom = client.CustomObjectsApi(api)

    def list_jobs(**kwargs: Any) -> Any:
        return custom.list_cluster_custom_object("grpo.dev", "v1alpha1", "grpojobs", **kwargs)

    return Informer(api, list_jobs, on_event)


def pod_informer(
    api: client.ApiClient, on_event: Callable[[str, Obj, float], None] | None = None
) -> Informer:
    core = client.CoreV1Api(api)
    return Informer(api, core.list_pod_for_all_namespaces, on_event, label_selector=LABEL_JOB)
