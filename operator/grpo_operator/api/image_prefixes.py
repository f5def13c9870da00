"""Whether an image is under an allowed prefix (the platform limit platformPolicy.allowedImagePrefixes).

In ``api`` because both the operator's policy check (reconcile/platform_policy.py) and its settings (which
refuse default images outside the allowed prefixes at start) judge images the same way; the chart's
admission policy has the CEL twin."""

from __future__ import annotations

# Where one part of an image reference ends: a path segment ("/"), the tag (":") or the digest ("@").
IMAGE_BOUNDARIES = ("/", ":", "@")


def image_allowed(image: str, prefix: str) -> bool:
    """Whether ``image`` is under ``prefix``, matched on path boundaries: a prefix that ends in "/", ":" or
    "@" is matched as written; any other must be the whole image or be followed by one of them, so
    "registry.example.com" admits neither "registry.example.com.evil.io/x" nor "registry.example.com-evil/x"."""
    if prefix.endswith(IMAGE_BOUNDARIES):
        return image.startswith(prefix)
    return image == prefix or image.startswith(tuple(prefix + b for b in IMAGE_BOUNDARIES))
