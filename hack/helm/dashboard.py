"""Writes the chart's Grafana dashboard (helm/grpo-operator/files/dashboards/grpo-operator.json).

    python hack/helm/dashboard.py           # write the JSON
    python hack/helm/dashboard.py --check   # exit 1 when the checked-in JSON is stale

The panels are declared in dashboard_panels.py, compactly, and rendered to Grafana's JSON model, so the dashboard is
reviewable as code and every query is in one list that the tests read: tests/helm/ checks that each
metric a panel uses is exported by the trainer, the operator or vLLM, and the end-to-end test runs
every query against a real Prometheus that scraped the operator and a CPU training run.

Variables: ``datasource`` (a Prometheus data source), ``namespace`` and ``grpojob`` (multi-select,
from the trainer's ``grpo_step`` series). Per-job queries filter on both through ``JOB``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "helm" / "grpo-operator" / "files" / "dashboards" / "grpo-operator.json"
UID = "grpo-operator"
if str(REPO) not in sys.path:  # run by path: `python hack/helm/dashboard.py`
    sys.path.insert(0, str(REPO))

from hack.helm.dashboard_panels import ROWS, Panel  # noqa: E402


def _datasource() -> dict[str, str]:
    return {"type": "prometheus", "uid": "${datasource}"}


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    steps += [{"color": colour, "value": value} for value, colour in panel.thresholds]
    defaults: dict[str, Any] = {
        "unit": panel.unit,
        "thresholds": {"mode": "absolute", "steps": steps},
    }
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    if panel.mappings:
        defaults["mappings"] = [
            {
                "type": "value",
                "options": {
                    f"{value:g}": {"text": text, "index": i} for i, (value, text) in enumerate(panel.mappings)
                },
            }
        ]
    if panel.kind == "state-timeline":
        defaults["color"] = {"mode": "thresholds"}
        defaults["custom"] = {"lineWidth": 0, "fillOpacity": 80}
    if panel.kind == "timeseries":
        defaults["custom"] = {"lineWidth": 1, "fillOpacity": 10, "showPoints": "never", "spanNulls": True}
        if panel.thresholds:
            defaults["custom"]["thresholdsStyle"] = {"mode": "line"}
    options: dict[str, Any]
    if panel.kind == "stat":
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
        }
    elif panel.kind == "state-timeline":
        # One row per series, its bars merged while the value stays; the row names say what each is.
        options = {
            "mergeValues": True,
            "showValue": "never",
            "alignValue": "left",
            "rowHeight": 0.9,
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False},
            "tooltip": {"mode": "single", "sort": "none"},
        }
    else:
        options = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": _datasource(),
        "gridPos": {"h": 7 if panel.kind == "stat" else 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": [
            {
                "datasource": _datasource(),
                "refId": chr(ord("A") + i),
                "expr": target.expr,
                "legendFormat": target.legend,
                "range": True,
            }
            for i, target in enumerate(panel.targets)
        ],
    }


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": _datasource(),
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
    }


def render() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    panel_id = 1
    y = 0
    for row in ROWS:
        panels.append(
            {
                "id": panel_id,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        panel_id += 1
        y += 1
        x = 0
        row_height = 0
        for panel in row.panels:
            if x + panel.width > 24:
                x = 0
                y += row_height
                row_height = 0
            item = _panel_json(panel, panel_id, x, y)
            panels.append(item)
            panel_id += 1
            x += panel.width
            row_height = max(row_height, item["gridPos"]["h"])
        y += row_height
    return {
        "uid": UID,
        "title": "GRPO jobs and operator",
        "description": "Learning signal, throughput, checkpoints and vLLM of GRPOJobs, and the grpo-operator.",
        "tags": ["grpo", "grpo-operator"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "browser",
        "id": None,
        "links": [],
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                    "regex": "",
                },
                _variable("namespace", "Namespace", "label_values(grpo_step, namespace)"),
                _variable("grpojob", "GRPOJob", 'label_values(grpo_step{namespace=~"$namespace"}, grpojob)'),
            ]
        },
        "panels": panels,
    }


def render_text() -> str:
    return json.dumps(render(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the checked-in JSON is stale")
    args = parser.parse_args(argv)
    text = render_text()
    current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else None
    if args.check:
        if current != text:
            print(f"stale: {OUTPUT.relative_to(REPO)} (run `python hack/helm/dashboard.py`)", file=sys.stderr)
            return 1
        return 0
    if current != text:
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(text, encoding="utf-8")
        print(f"wrote {OUTPUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
