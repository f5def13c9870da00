"""The trainer's exit codes have one catalog (api/exit_codes.py): the trainer exits with it, the restart
policy and the operator setting's default decide from it, and docs/trainer.md shows it."""

from __future__ import annotations

import dataclasses

from grpo_operator.api.exit_codes import BY_CODE, EXIT_CODES, PERMANENT_EXIT_CODES, ExitCode
from grpo_operator.reconcile.restart_policy import DEFAULT_PERMANENT_EXIT_CODES, RULES, Trigger
from grpo_operator.settings import OperatorSettings
from grpo_trainer import errors

from hack import catalog_tables


def test_the_trainer_exits_with_the_catalogs_codes() -> None:
    assert errors.ExitCode is ExitCode
    assert [int(e.code) for e in EXIT_CODES] == sorted(int(c) for c in ExitCode)


def test_the_settings_default_is_the_catalogs_permanent_codes() -> None:
    default = {f.name: f.default for f in dataclasses.fields(OperatorSettings)}["permanent_exit_codes"]
    assert default is PERMANENT_EXIT_CODES, "settings.py must take the default from api/exit_codes.py"
    assert OperatorSettings().permanent_exit_codes == DEFAULT_PERMANENT_EXIT_CODES == (2, 4, 6, 7, 8, 9)


def test_restart_rows_take_exit_codes_and_their_permanence_from_the_catalog() -> None:
    rows = [rule for rule in RULES if rule.trigger is Trigger.EXIT_CODE]
    assert rows
    for rule in rows:
        assert isinstance(rule.exit_code, ExitCode), f"{rule.reason} names a bare number"
        assert rule.permanent == BY_CODE[rule.exit_code].permanent, rule.reason
        assert f"exits {int(rule.exit_code)}" in rule.cause


def test_the_trainer_doc_shows_each_code_and_what_the_operator_does() -> None:
    text = catalog_tables.TRAINER_DOC.read_text(encoding="utf-8")
    assert catalog_tables.render_exit_codes() in text, "docs/trainer.md is stale: run `make generate`"
    assert "| 5 | non-finite training" in text
    assert "counted restart `NonFiniteTraining` from the last checkpoint |" in text
    assert "fails the job at once: `Failed`/`OutOfMemory` |" in text
    assert "| 3 | metric service (or, for `spec.environment` jobs, environment service) never ready" in text
