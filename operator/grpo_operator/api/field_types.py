"""Value syntax the spec shares with Kubernetes: name and quantity patterns, and integers and
quantities read the way the API server reads them.

The patterns are used both by pydantic (Rust regex) and, through the generated OpenAPI schema, by the
API server (RE2), so each sticks to constructs both engines agree on.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema

# Characters a container image reference or model id never contains. Spelled out rather than \s
# because RE2 (API server) and Rust regex (pydantic) disagree on what \s covers beyond ASCII.
NO_SPACE_PATTERN = r"^[^ \t\r\n]+$"
# Kubernetes resource.Quantity without a sign (requests are never negative).
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# DNS-1123 subdomain (PVC, StorageClass and PriorityClass names).
DNS1123_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# DNS-1123 label (Kueue LocalQueue names end up in a label value, so they must be label-safe).
DNS1123_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Environment variable names as Kubernetes accepts them.
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# Keys of a Secret or ConfigMap as Kubernetes accepts them.
CONFIG_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"

# The name of a Secret or ConfigMap the spec refers to (its field says which, in its description), and one
# of its keys: the one definition the models that point at a key share.
ObjectName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN_PATTERN)]
ObjectKey = Annotated[
    str,
    Field(
        min_length=1, max_length=253, pattern=CONFIG_KEY_PATTERN, description="The key whose value is used."
    ),
]


def _integral_float_to_int(value: Any) -> Any:
    # kubectl turns YAML `8.0` into JSON `8`, and the API server accepts an integral JSON number for
    # an integer field; strict pydantic would not, so meet the API server here.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# An integer field as the API server sees it: 8 and 8.0 are the integer 8; 8.5, "8" and true are not.
INTEGRAL_FLOAT = BeforeValidator(_integral_float_to_int)
K8sInt = Annotated[int, INTEGRAL_FLOAT]
# In an Optional, bounds must come before the validator: Annotated[int, Field(ge=..), INTEGRAL_FLOAT].

_QUANTITY_RE = re.compile(QUANTITY_PATTERN)


def _quantity_to_str(value: int | str) -> str:
    # One check for both forms, so a bad value gets one clear error rather than one per union branch.
    # Builders put quantities into manifests as strings; "2" and 2 mean the same to Kubernetes.
    text = str(value)
    if (isinstance(value, int) and value < 0) or len(text) > 64 or not _QUANTITY_RE.fullmatch(text):
        raise ValueError(
            f"{text!r} is not a non-negative Kubernetes quantity: write e.g. 500m, 2, 1.5 or 16Gi"
        )
    return text


# A Kubernetes quantity written as a string ("500m", "16Gi") or a non-negative integer (2).
Quantity = Annotated[
    int | str,
    AfterValidator(_quantity_to_str),
    WithJsonSchema(
        {"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN, "maxLength": 64, "minimum": 0}
    ),
]
