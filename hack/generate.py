"""``make generate``: every generated file of the repository, from its one source.

    python -m hack.generate            # write the files that changed
    python -m hack.generate --check    # exit 1 listing the stale files, write nothing

The CRD (both copies) and docs/api.md come from the API models (``grpo_operator.api.generate``); the
chart's Grafana dashboard from its panel list (``hack/helm/dashboard_panels.py``); the restart-policy table of
docs/operations.md from ``reconcile/restart_policy.py`` (``hack/restart_table.py``), its event table and
docs/trainer.md's exit-code table from the catalogs in ``api`` (``hack/catalog_tables.py``); the alert table of
docs/runbooks/README.md from the chart's alert values (``hack/runbook_index.py``); the child-kinds table
of docs/scaling.md from ``builders/child_kinds.py`` (``hack/child_kinds_table.py``); the learning-health
tables of docs/concepts.md from ``api/learning_health.py`` (``hack/learning_health_table.py``); docs/coming-from-trl.md
from ``api/advice.py`` (``hack/trl_names_table.py``).
tests/unit/test_generated.py fails while any of them is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpo_operator.api import generate as api_generate

from hack import (
    catalog_tables,
    child_kinds_table,
    learning_health_table,
    restart_table,
    runbook_index,
    trl_names_table,
)
from hack.helm import dashboard

REPO = Path(__file__).resolve().parents[1]


def outputs() -> dict[Path, str]:
    """Every generated file and the content its source produces."""
    return {
        **api_generate.outputs(REPO),
        dashboard.OUTPUT: dashboard.render_text(),
        # docs/operations.md holds two generated tables (restart policy, events): both in one text.
        restart_table.OUTPUT: catalog_tables.render_operations_text(),
        catalog_tables.TRAINER_DOC: catalog_tables.render_trainer_text(),
        child_kinds_table.OUTPUT: child_kinds_table.render_text(),
        runbook_index.OUTPUT: runbook_index.render_text(),
        learning_health_table.OUTPUT: learning_health_table.render_text(),
        trl_names_table.OUTPUT: trl_names_table.render_text(),
    }


def shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def differing(expected: dict[Path, str]) -> list[Path]:
    return [
        path
        for path, text in expected.items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]


def stale_files() -> list[Path]:
    """Generated files whose checked-in content differs from what their sources produce."""
    return differing(outputs())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for path in stale:
            print(f"stale: {shown(path)} (run `make generate`)", file=sys.stderr)
        return 1 if stale else 0
    expected = outputs()
    for path in differing(expected):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(expected[path], encoding="utf-8")
        print(f"wrote {shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
