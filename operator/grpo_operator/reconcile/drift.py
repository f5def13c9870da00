"""Whether a child the operator made is still what it built.

The spec-hash annotation says which spec a child was built from, not what it is now: a tenant can change
the metric Deployment's image (``kubectl set image``) and keep every label and annotation. So the live
object is compared with the desired manifest itself. Every field the operator sets must be present and
equal in the live object ("desired is a subset of live"): fields the API server fills in (defaults, a
Service's clusterIP, a probe's periodSeconds) are not drift, and re-applying over them would never end.
Lists are compared item by item (by ``name`` where every item has one), and an extra item in a list the
operator wrote is drift: it is how a sidecar container or an env var is smuggled in.

Pods are the exception: the API server fills their spec in at admission (a service-account token volume
and its mounts, default tolerations, Kueue's node selectors), and a pod update can change only container
images, resources (through pods/resize), tolerations, scheduling gates and activeDeadlineSeconds. So a
pod is compared on the images, resources and deadline only; the rest cannot drift.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from grpo_operator.api.quantity import quantity as quantity

Obj = dict[str, Any]

# Metadata the API server owns; never part of a comparison.
_SERVER_METADATA = frozenset({"uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"})


@dataclass(frozen=True)
class Drift:
    """One field of a child that is not what the operator built; ``extra``: an item the operator never
    wrote was added to a list (a forced server-side apply cannot take it out: another manager owns it)."""

    path: str
    extra: bool = False


def drifted_fields(desired: Obj, live: Obj) -> list[Drift]:
    """The fields of ``desired`` (a manifest the operator builds) that ``live`` lacks or holds otherwise,
    and the items ``live`` has on top in a list the operator writes. Status and server-owned metadata are
    not compared."""
    out: list[Drift] = []
    for key, want in desired.items():
        if key == "status":
            continue
        have = live.get(key)
        if key == "metadata" and isinstance(want, dict):
            want = {k: v for k, v in want.items() if k not in _SERVER_METADATA}
        _compare(want, have, key, out)
    return out


def pod_drift(desired: Obj, live: Obj) -> list[Drift]:
    """What changed in a pod's spec since the operator built it, among what a pod update can change: the
    image and resources of each container and init container, and activeDeadlineSeconds."""
    want_spec, have_spec = desired.get("spec") or {}, live.get("spec") or {}
    out: list[Drift] = []
    for group in ("initContainers", "containers"):
        wanted = {c.get("name"): c for c in want_spec.get(group) or []}
        found = {c.get("name"): c for c in have_spec.get(group) or [] if isinstance(c, dict)}
        for name, want in wanted.items():
            have = found.get(name)
            if have is None:
                out.append(Drift(f"spec.{group}[{name}]"))
                continue
            _compare(want.get("image"), have.get("image"), f"spec.{group}[{name}].image", out)
            _compare(
                want.get("resources") or {}, have.get("resources"), f"spec.{group}[{name}].resources", out
            )
        out += [Drift(f"spec.{group}[{name}]", extra=True) for name in found if name not in wanted]
    _compare(
        want_spec.get("activeDeadlineSeconds"),
        have_spec.get("activeDeadlineSeconds"),
        "spec.activeDeadlineSeconds",
        out,
    )
    return out


def describe(drifts: list[Drift], limit: int = 8) -> str:
    """The drifted fields for an event: "spec.template.spec.containers[metric].image, ..."."""
    paths = [d.path + (" (added)" if d.extra else "") for d in drifts]
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(paths[:limit]) + more


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == []


def _compare(want: Any, have: Any, path: str, out: list[Drift]) -> None:
    if _empty(want):
        # The API server omits empty maps and lists (and a null) when it stores an object.
        if not _empty(have) and not isinstance(want, dict):
            out.append(Drift(path))
        return
    if isinstance(want, dict):
        if not isinstance(have, dict):
            out.append(Drift(path))
            return
        for key, value in want.items():
            _compare(value, have.get(key), f"{path}.{key}", out)
        closed = _CLOSED_KEYS.get(_kind_of(path) or "", frozenset())
        out += [Drift(f"{path}.{key}", extra=True) for key in sorted(closed & set(have) - set(want))]
        return
    if isinstance(want, list):
        _compare_list(want, have, path, out)
        return
    if not _scalar_equal(want, have, path):
        out.append(Drift(path))


def _compare_list(want: list[Any], have: Any, path: str, out: list[Drift]) -> None:
    if not isinstance(have, list):
        out.append(Drift(path))
        return
    keyed = all(isinstance(item, dict) and "name" in item for item in want)
    if keyed:
        found = {item.get("name"): item for item in have if isinstance(item, dict)}
        for item in want:
            _compare(item, found.get(item["name"]), f"{path}[{item['name']}]", out)
        wanted = {item["name"] for item in want}
        extra = [item for item in have if not (isinstance(item, dict) and item.get("name") in wanted)]
        out += [Drift(f"{path}[{_label(item)}]", extra=True) for item in extra]
        return
    if len(have) != len(want):
        # In order and complete: a command, its args, the capabilities dropped, a Role's rules.
        out.append(Drift(path, extra=len(have) > len(want)))
        return
    for index, item in enumerate(want):
        _compare(item, have[index], f"{path}[{index}]", out)


# Keys the API server never fills in that change what runs, by what holds them: absent from what the
# operator builds means absent (the image's entrypoint, no extra environment, one volume source).
_CONTAINER_KEYS = frozenset({"command", "args", "envFrom", "lifecycle", "workingDir", "volumeDevices"})
_VOLUME_SOURCES = frozenset(
    {
        "hostPath",
        "emptyDir",
        "secret",
        "configMap",
        "persistentVolumeClaim",
        "projected",
        "downwardAPI",
        "csi",
        "ephemeral",
        "image",
        "nfs",
        "iscsi",
        "rbd",
        "cephfs",
        "glusterfs",
        "fc",
        "flexVolume",
    }
)
_CLOSED_KEYS = {"container": _CONTAINER_KEYS, "volume": _VOLUME_SOURCES}
_ITEM = re.compile(r"\.(containers|initContainers|volumes)\[[^\]]*\]$")


def _kind_of(path: str) -> str | None:
    match = _ITEM.search(path)
    if match is None:
        return None
    return "volume" if match.group(1) == "volumes" else "container"


def _label(item: Any) -> str:
    return str(item.get("name")) if isinstance(item, dict) and item.get("name") else "?"


def _scalar_equal(want: Any, have: Any, path: str) -> bool:
    if want == have and type(want) is type(have):
        return True
    if ".resources." in path or path.endswith(".storage"):
        a, b = quantity(want), quantity(have)
        return a is not None and a == b
    return False
