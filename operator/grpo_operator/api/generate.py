"""The API part of ``make generate`` (hack/generate.py): write the CRD and docs/api.md from the models.

python -m grpo_operator.api.generate            # write the files
python -m grpo_operator.api.generate --check    # exit 1 listing the files that are stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpo_operator.api.crd import render_crd_yaml
from grpo_operator.api.docs import render_api_md

CRD_FILE = "grpo.dev_grpojobs.yaml"


def repo_root() -> Path:
    # operator/grpo_operator/api/generate.py -> repository root
    return Path(__file__).resolve().parents[3]


def outputs(root: Path) -> dict[Path, str]:
    """Every generated file and its expected content."""
    crd = render_crd_yaml()
    return {
        root / "crds" / CRD_FILE: crd,
        root / "helm" / "grpo-operator" / "crds" / CRD_FILE: crd,
        root / "docs" / "api.md": render_api_md(),
    }


def stale_files(root: Path) -> list[Path]:
    """Generated files whose checked-in content differs from what the models produce."""
    return [
        path
        for path, text in outputs(root).items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    parser.add_argument("--root", type=Path, default=repo_root(), help="repository root")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.root)
        for path in stale:
            print(f"stale: {path.relative_to(args.root)} (run `make generate`)", file=sys.stderr)
        return 1 if stale else 0
    for path, text in outputs(args.root).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(args.root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
