"""The chart's alert rules, checked and unit-tested by promtool (Debian's prometheus package).

tests/helm/promtool/alerts.test.yaml holds the cases; the rules come from the chart itself, rendered with
its default thresholds, so a change to a template or a default is caught here."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.helm.chart import MONITORING_APIS, promtool, render, rule_groups, run, write_rule_file

CASES = Path(__file__).resolve().parent / "promtool" / "alerts.test.yaml"
OBSERVABILITY_MD = Path(__file__).resolve().parents[2] / "docs" / "observability.md"


@pytest.fixture(scope="module")
def rules_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("rules")
    docs = render(
        sets={
            "prometheusRule.enabled": "true",
            "metrics.serviceMonitor.enabled": "true",
            # The spend alert renders only for namespaces given an amount.
            "prometheusRule.alerts.GRPONamespaceOverMonthlyAmount.amounts.team-a": "100",
            "prometheusRule.alerts.GRPONamespaceOverMonthlyAmount.amounts.\\*": "50",
        },
        api_versions=MONITORING_APIS,
    )
    write_rule_file(docs, directory / "rules.yaml")
    shutil.copy(CASES, directory / CASES.name)
    return directory


def test_promtool_check_rules(rules_dir: Path) -> None:
    rules = yaml.safe_load((rules_dir / "rules.yaml").read_text())
    count = sum(len(group["rules"]) for group in rules["groups"])
    assert count > 0, "the chart rendered no rules with prometheusRule.enabled=true"
    proc = run([promtool(), "check", "rules", str(rules_dir / "rules.yaml")])
    assert f"SUCCESS: {count} rules found" in proc.stdout, proc.stdout


def test_promtool_unit_tests_pass(rules_dir: Path) -> None:
    proc = run([promtool(), "test", "rules", CASES.name], check=False, cwd=rules_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_is_tested_firing_and_not_firing(rules_dir: Path) -> None:
    rules = yaml.safe_load((rules_dir / "rules.yaml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(CASES.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    assert firing == alerts, f"alerts without a firing case: {alerts - firing}"
    assert quiet == alerts, f"alerts without a not-firing case: {alerts - quiet}"


def test_the_alert_table_of_observability_md_is_the_rendered_rules(rules_dir: Path) -> None:
    rules = yaml.safe_load((rules_dir / "rules.yaml").read_text())
    rendered = {r["alert"]: (r["for"], r["labels"]["severity"]) for g in rules["groups"] for r in g["rules"]}
    documented: dict[str, tuple[str, str]] = {}
    for line in OBSERVABILITY_MD.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^\| \[(\w+)\]\(runbooks/\1\.md\) \|.*\| (\w+) \| (\w+) \|$", line)
        if match:
            documented[match.group(1)] = (match.group(2), match.group(3))
    assert documented == rendered, (
        f"docs/observability.md's alert table (name: for, severity) differs from the chart's defaults: "
        f"documented {documented}, rendered {rendered}"
    )


def test_thresholds_and_durations_come_from_values(tmp_path: Path) -> None:
    # A values file, not --set: Helm's --set turns 0.25 into a string, which the schema rejects.
    values = tmp_path / "alerts.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "prometheusRule": {
                    "enabled": True,
                    "alerts": {
                        "GRPOJobFormatFailureRatioHigh": {
                            "enabled": True,
                            "threshold": 0.25,
                            "window": "1h",
                            "for": "45m",
                            "severity": "critical",
                        },
                        "GRPOJobFailed": {"enabled": False, "severity": "warning", "for": "0m"},
                    },
                }
            }
        )
    )
    docs = render([values], api_versions=MONITORING_APIS)
    rules = {r["alert"]: r for g in rule_groups(docs)["groups"] for r in g["rules"]}
    rule = rules["GRPOJobFormatFailureRatioHigh"]
    assert "[1h]" in rule["expr"] and rule["expr"].rstrip().endswith("> 0.25")
    assert rule["for"] == "45m" and rule["labels"]["severity"] == "critical"
    assert "GRPOJobFailed" not in rules
    # Without a ServiceMonitor nothing scrapes the operator under a known job name: no "down" alert.
    assert "GRPOOperatorDown" not in rules
