"""docs/runbooks/README.md's alert table is rendered from the chart's alert values, and every alert has a page."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hack import runbook_index


def test_the_table_shows_the_charts_thresholds_and_severities() -> None:
    section = runbook_index.render_section()
    alerts = runbook_index.alerts()
    for name, alert in alerts.items():
        row = next(line for line in section.splitlines() if line.startswith(f"| [{name}]"))
        assert f"| {alert['severity']} |" in row
        assert str(alert["for"]) in row or name == "GRPOJobFailed"
    assert "> 2% of completions cannot be scored over 10m, for 5m" in section  # GRPOJobMetricErrors' defaults


@pytest.mark.parametrize("remove", ["GRPOJobFailed.md", "README-only"])
def test_an_alert_without_a_page_or_a_page_without_an_alert_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, remove: str
) -> None:
    pages = tmp_path / "runbooks"
    shutil.copytree(runbook_index.OUTPUT.parent, pages)
    if remove == "README-only":
        (pages / ("GRPOJobRenamed" + ".md")).write_text("# a page whose alert is gone\n")
        expected = "GRPOJobRenamed"
    else:
        (pages / remove).unlink()
        expected = "GRPOJobFailed"
    monkeypatch.setattr(runbook_index, "OUTPUT", pages / "README.md")
    with pytest.raises(runbook_index.RunbookIndexError, match=expected):
        runbook_index.render_text()
