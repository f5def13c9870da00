"""Finds the shell command blocks in the README and docs/, so tests can prove none of them rots.

A ```bash block is accounted for when either
- every command in it is `make <target>` for a target the Makefile defines (CI runs `make test`, the
  demo is `make demo`), or
- the line before it is ``<!-- run-in-test -->`` (or ``<!-- run-in-test: <setup> -->``): then
  tests/integration/test_docs_commands.py runs it, in order, against the test cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)\s*$")
TAG = re.compile(r"^<!--\s*run-in-test(?::\s*([\w-]+))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    tagged: bool
    setup: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    def commands(self) -> list[str]:
        out: list[str] = []
        pending = ""
        for raw in self.text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            out.append(re.sub(r"\s+#\s.*$", "", pending + line))
            pending = ""
        return out


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def shell_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, language = i, match.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if language in ("bash", "sh", "shell", "console"):
            prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
            tag = TAG.match(prev.strip())
            blocks.append(
                Block(
                    path=path,
                    line=start + 1,
                    language=language,
                    text="\n".join(lines[start + 1 : j]),
                    tagged=tag is not None,
                    setup=tag.group(1) if tag else None,
                )
            )
        i = j + 1
    return blocks


def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*):", text, re.MULTILINE)}
