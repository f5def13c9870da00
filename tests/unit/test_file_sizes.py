"""Every Python file of the repository stays under 600 lines (docs/development.md, "Where things live"): a
module past it holds more than one thing, and a newcomer has to read all of it to change one. A file that
must be longer goes into LONGER_ALLOWED with the reason; the list is empty today."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 600
# path -> why it cannot be split. Keep it short: each entry is a debt, not a licence.
LONGER_ALLOWED: dict[str, str] = {}


def _python_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    return [name for name in listed.stdout.splitlines() if (REPO / name).is_file()]


def test_every_python_file_is_under_the_line_limit() -> None:
    over = {}
    for name in _python_files():
        with (REPO / name).open(encoding="utf-8") as f:
            count = sum(1 for _ in f)
        if count > MAX_LINES and name not in LONGER_ALLOWED:
            over[name] = count
    assert over == {}, (
        f"these files are over {MAX_LINES} lines: {over}. Split each where it holds two concerns (a module "
        "of its own, with a name that says what it holds), or add it to LONGER_ALLOWED with the reason"
    )


def test_the_allow_list_names_files_that_need_it() -> None:
    for name, reason in LONGER_ALLOWED.items():
        assert reason, name
        with (REPO / name).open(encoding="utf-8") as f:
            assert sum(1 for _ in f) > MAX_LINES, (
                f"{name} is back under {MAX_LINES} lines: drop it from the list"
            )
