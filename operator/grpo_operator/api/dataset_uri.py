"""Dataset URIs: the two schemes a GRPOJob accepts, one pure parser the trainer uses.

* ``hf://<org>/<name>[:<config>][@<revision>][#<split>]`` -- a Hugging Face Hub dataset. ``<org>/`` may be
  left out for the few canonical datasets without one; ``:<config>`` picks a configuration (``openai/gsm8k``
  needs ``:main``); ``@<revision>`` is a branch, tag or commit; ``#<split>`` defaults to ``train`` and may
  use the ``datasets`` slicing syntax, e.g. ``#train[:90%]``.
* ``file:///<absolute path>.jsonl|.json|.parquet`` -- a file inside the trainer container. Paths under
  ``/workspace`` are on the job's volume (the checkpoint PVC).

The same regular expression is enforced by the API server (a CEL rule) and by :func:`parse_dataset_uri`,
so a URI the cluster accepts is one the trainer can load.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict

# Pieces shared by the CEL rule (RE2) and the Python parser; only constructs both engines agree on.
_ID = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_HF_REPO = rf"{_ID}(?:/{_ID})?"
_HF_CONFIG = _ID
_HF_REVISION = r"[A-Za-z0-9][A-Za-z0-9._/-]*"
_HF_SPLIT = r"[A-Za-z0-9_][A-Za-z0-9_.:%+\[\]-]*"
_PATH_SEGMENT = r"[A-Za-z0-9._+=@-]+"
_FILE_PATH = rf"(?:/{_PATH_SEGMENT})*/{_PATH_SEGMENT}\.(?:jsonl|json|parquet)"

HF_URI_PATTERN = rf"hf://{_HF_REPO}(?::{_HF_CONFIG})?(?:@{_HF_REVISION})?(?:#{_HF_SPLIT})?"
FILE_URI_PATTERN = rf"file://{_FILE_PATH}"
# CEL's matches() is unanchored (RE2 search), hence the explicit anchors.
DATASET_URI_PATTERN = rf"^(?:{HF_URI_PATTERN}|{FILE_URI_PATTERN})$"

DATASET_URI_HELP = (
    "use hf://<org>/<name>[:<config>][@<revision>][#<split>] for a Hugging Face dataset "
    "or file:///<absolute path>.jsonl|.json|.parquet for a file "
    "(paths under /workspace are on the job's volume)"
)

_HF_RE = re.compile(
    rf"^hf://(?P<repo>{_HF_REPO})(?::(?P<config>{_HF_CONFIG}))?"
    rf"(?:@(?P<revision>{_HF_REVISION}))?(?:#(?P<split>{_HF_SPLIT}))?$"
)
_FILE_RE = re.compile(rf"^file://(?P<path>{_FILE_PATH})$")


class DatasetSource(BaseModel):
    """A parsed dataset URI: what the trainer needs to load the data."""

    model_config = ConfigDict(frozen=True)

    scheme: Literal["hf", "file"]
    # hf: the repository id ("openai/gsm8k"); file: the absolute path.
    location: str
    # hf only; None means the repository's default branch.
    revision: str | None = None
    # hf only; None means the dataset's default configuration.
    config: str | None = None
    # hf: the split (default "train"); file: None (the whole file is one split).
    split: str | None = None
    # file only: "jsonl", "json" or "parquet" (from the extension), the loader ``datasets`` needs.
    file_format: Literal["jsonl", "json", "parquet"] | None = None


class DatasetURIError(ValueError):
    """A dataset URI that names an unsupported scheme or is malformed."""


def parse_dataset_uri(uri: str) -> DatasetSource:
    """Parse ``uri`` or raise :class:`DatasetURIError` saying what is wrong and what to write instead."""
    m = _HF_RE.fullmatch(uri)
    if m:
        return DatasetSource(
            scheme="hf",
            location=m["repo"],
            revision=m["revision"],
            config=m["config"],
            split=m["split"] or "train",
        )
    m = _FILE_RE.fullmatch(uri)
    if m:
        path = m["path"]
        ext = path.rsplit(".", 1)[1]
        fmt: Literal["jsonl", "json", "parquet"] = (
            "jsonl" if ext == "jsonl" else "json" if ext == "json" else "parquet"
        )
        return DatasetSource(scheme="file", location=path, file_format=fmt)
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if scheme and scheme not in ("hf", "file"):
        raise DatasetURIError(f"unsupported dataset URI scheme {scheme!r} in {uri!r}: {DATASET_URI_HELP}")
    raise DatasetURIError(f"malformed dataset URI {uri!r}: {DATASET_URI_HELP}")
