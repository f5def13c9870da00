"""The spec's released field set: every field path of GRPOJob.spec with its default, as of the last release.

    .venv/bin/python -m hack.released_fields            # print the current field set
    .venv/bin/python -m hack.released_fields --update   # at a release only: record it as released

Not part of `make generate` on purpose: the snapshot is what running jobs were created with, and
tests/unit/test_compat.py judges every field outside it (None default, or listed in
grpo_operator.api.compat.LATER_FIELDS). Regenerating it with each change would let an unsafe field
through.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grpo_operator.api.compat import RELEASED_FIELDS_FILE, spec_fields
from grpo_operator.api.spec import GRPOJobSpec
from pydantic_core import to_jsonable_python


def current_fields() -> dict[str, Any]:
    return {".".join(path): to_jsonable_python(default) for path, default in spec_fields(GRPOJobSpec).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--update", action="store_true", help="write the snapshot (at a release only)")
    args = parser.parse_args(argv)
    text = json.dumps(current_fields(), indent=1, sort_keys=True) + "\n"
    if args.update:
        Path(RELEASED_FIELDS_FILE).write_text(text)
        print(f"wrote {RELEASED_FIELDS_FILE}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
