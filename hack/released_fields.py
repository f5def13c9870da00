"""The released field sets: every field path of GRPOJob.spec and every key path of trainer.json
(TrainerConfig), each with its default, as of the last release.

    .venv/bin/python -m hack.released_fields                        # print the current sets
    .venv/bin/python -m hack.released_fields --update --release ID  # at a release only: record them

Not part of `make generate` on purpose: the snapshot is what running jobs were created with and what
released trainer images read, and tests/unit/test_compat.py judges every field outside it (None default,
or listed in grpo_operator.api.compat.LATER_FIELDS). Regenerating it with each change would let an unsafe
field through.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grpo_operator.api.compat import RELEASED_FIELDS_FILE, SNAPSHOT_ABOUT, spec_fields
from grpo_operator.api.spec import GRPOJobSpec
from grpo_operator.api.trainer_config import TrainerConfig
from pydantic import BaseModel
from pydantic_core import to_jsonable_python


def fields_of(model: type[BaseModel]) -> dict[str, Any]:
    return {".".join(path): to_jsonable_python(default) for path, default in spec_fields(model).items()}


def current_fields(release: str) -> dict[str, Any]:
    return {
        "about": SNAPSHOT_ABOUT,
        "release": release,
        "spec": fields_of(GRPOJobSpec),
        "trainerJson": fields_of(TrainerConfig),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--update", action="store_true", help="write the snapshot (at a release only)")
    parser.add_argument(
        "--release", default="unreleased", help="the release's tag or commit, recorded with it"
    )
    args = parser.parse_args(argv)
    text = json.dumps(current_fields(args.release), indent=1, sort_keys=True) + "\n"
    if args.update:
        Path(RELEASED_FIELDS_FILE).write_text(text)
        print(f"wrote {RELEASED_FIELDS_FILE}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
