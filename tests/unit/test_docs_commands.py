"""Every shell command shown in the README and docs/ is run by CI or the demo, so none can rot."""

from __future__ import annotations

from tests.harness.docs import doc_files, make_targets, shell_blocks


def test_every_documented_command_is_run_by_a_test_or_is_a_make_target() -> None:
    targets = make_targets()
    unaccounted: list[str] = []
    for path in doc_files():
        for block in shell_blocks(path):
            if block.tagged:
                continue
            for command in block.commands():
                words = command.split()
                if words[:1] == ["make"] and len(words) >= 2 and all(w in targets for w in words[1:]):
                    continue
                unaccounted.append(f"{block.where}: {command}")
    assert not unaccounted, (
        "These documented commands are run by no test. Put `<!-- run-in-test -->` on the line before "
        "their block (tests/integration/test_docs_commands.py then runs it against the test cluster) "
        "and make them runnable there, or show them as prose rather than as a command block:\n  "
        + "\n  ".join(unaccounted)
    )


def test_the_readme_names_exactly_the_two_setup_free_commands() -> None:
    blocks = shell_blocks(doc_files()[0])
    commands = [c for b in blocks for c in b.commands()]
    assert [c.split("#")[0].strip() for c in commands] == ["make demo", "make test"]
