"""The one way a generated table lives inside a hand-written document: between a BEGIN and an END marker
line, replaced whole by ``make generate`` (hack/generate.py) and checked by tests/unit/test_generated.py."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class MarkersMissing(ValueError):
    """A document lacks a generated section's markers."""


def replace_section(text: str, begin: str, end: str, section: str, doc: Path, where: str) -> str:
    """``text`` with everything from the ``begin`` marker to the ``end`` marker replaced by ``section``
    (which carries the markers itself)."""
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        shown = doc.relative_to(REPO) if doc.is_relative_to(REPO) else doc
        raise MarkersMissing(
            f"{shown} must hold the lines {begin!r} and {end!r}, in that order, where the generated table "
            f"goes: put them back in its {where!r} section"
        )
    return text[:start] + section + text[stop + len(end) :]
