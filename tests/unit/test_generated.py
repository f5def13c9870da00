"""Every generated file is what its source produces now, and `make generate` is what writes them all."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hack import generate
from hack.helm import dashboard

REPO = Path(__file__).resolve().parents[2]


def test_no_generated_file_is_stale() -> None:
    stale = [str(path.relative_to(REPO)) for path in generate.stale_files()]
    assert not stale, f"stale generated files {stale}: run `make generate` and commit them"


def test_make_generate_writes_the_crd_the_api_docs_and_the_dashboard() -> None:
    written = set(generate.outputs())
    assert dashboard.OUTPUT in written
    assert REPO / "docs" / "api.md" in written
    assert {p.name for p in written} >= {"grpo.dev_grpojobs.yaml", "api.md", "grpo-operator.json"}
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^generate:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe and "-m hack.generate" in recipe.group(1), (
        "the Makefile's generate target must run hack.generate"
    )


def test_check_mode_names_a_stale_file_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "grpo-operator.json"
    target.write_text("{}\n", encoding="utf-8")
    monkeypatch.setattr(dashboard, "OUTPUT", target)
    assert generate.main(["--check"]) == 1
    assert f"stale: {target}" in capsys.readouterr().err
    assert target.read_text(encoding="utf-8") == "{}\n"
    assert generate.main([]) == 0
    assert target.read_text(encoding="utf-8") == dashboard.render_text()
