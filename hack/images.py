"""Build every container image of the project (`make images`).

    python3 hack/images.py list                 # the tags and Dockerfiles, one per line
    python3 hack/images.py build [--dry-run]    # build them all with docker, podman or buildah

The version comes from one place, ``__version__`` in operator/grpo_operator/__init__.py; the chart's
appVersion, pyproject.toml and the spec's default trainer image must equal it (tests/unit/test_images.py).
Standard library only, so it runs before the virtualenv exists.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_REGISTRY = "ghcr.io/grpo-operator"
ENGINES = ("docker", "podman", "buildah")
VERSION_FILE = REPO / "operator" / "grpo_operator" / "__init__.py"


@dataclass(frozen=True)
class Image:
    name: str  # repository name under the registry
    dockerfile: str  # relative to the repository root, which is every build's context
    suffix: str = ""  # appended to the version in the tag

    def tag(self, registry: str, version: str) -> str:
        return f"{registry}/{self.name}:{version}{self.suffix}"


# Every Dockerfile in the repository is built here; the test fails when one is missing.
IMAGES = (
    Image("grpo-operator", "operator/Dockerfile"),
    Image("trainer", "trainer_image/Dockerfile"),
    Image("trainer", "trainer_image/Dockerfile.cpu", suffix="-cpu"),
    Image("metric-math", "examples/metrics/math_partial_credit/Dockerfile"),
    Image("metric-exact-match", "examples/metrics/exact_match/Dockerfile"),
    Image("metric-tiny-demo", "examples/tiny/Dockerfile"),
)


def version() -> str:
    match = re.search(r'^__version__ = "([^"]+)"$', VERSION_FILE.read_text(encoding="utf-8"), re.M)
    if match is None:
        raise SystemExit(f'no __version__ = "..." line in {VERSION_FILE}')
    return match.group(1)


def tags(registry: str = DEFAULT_REGISTRY) -> list[tuple[str, str]]:
    """(tag, dockerfile) for every image, in build order."""
    v = version()
    return [(image.tag(registry, v), image.dockerfile) for image in IMAGES]


def find_engine(requested: str | None) -> tuple[str | None, list[str]]:
    """The engine to build with: the one asked for, else the first of ENGINES that is installed and
    answers `<engine> info` (docker's CLI without a running daemon does not). Also returns why each
    engine tried was passed over."""
    problems: list[str] = []
    for engine in (requested,) if requested else ENGINES:
        if not shutil.which(engine):
            problems.append(f"{engine}: not on PATH")
            continue
        try:
            probe = subprocess.run([engine, "info"], capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            problems.append(f"{engine}: `{engine} info` failed: {exc}")
            continue
        if probe.returncode == 0:
            return engine, problems
        said = (probe.stderr or probe.stdout).strip().splitlines()
        problems.append(
            f"{engine}: installed, but `{engine} info` failed: {said[-1] if said else probe.returncode}"
        )
    return None, problems


def build_command(engine: str, tag: str, dockerfile: str, extra: list[str]) -> list[str]:
    # buildah's docker-compatible verb is `bud`; docker and podman share `build`.
    verb = ["bud"] if engine == "buildah" else ["build"]
    return [engine, *verb, "-f", dockerfile, "-t", tag, *extra, "."]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="images", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="print each image's tag and Dockerfile")
    build = sub.add_parser("build", help="build every image")
    for subparser in (sub.choices["list"], build):
        subparser.add_argument(
            "--registry",
            default=os.environ.get("IMAGE_REGISTRY", DEFAULT_REGISTRY),
            help="registry prefix of the tags (env IMAGE_REGISTRY; default %(default)s)",
        )
    build.add_argument("--engine", default=os.environ.get("CONTAINER_ENGINE") or None, choices=ENGINES)
    build.add_argument(
        "--build-args",
        default=os.environ.get("BUILD_ARGS", ""),
        help="extra arguments for every build, e.g. '--pull' (env BUILD_ARGS)",
    )
    build.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")
    args = parser.parse_args(argv)

    images = tags(args.registry)
    if args.command == "list":
        for tag, dockerfile in images:
            print(f"{tag}\t{dockerfile}")
        return 0

    # A dry run only prints the commands, so it needs no working engine.
    engine, problems = (args.engine or ENGINES[0], []) if args.dry_run else find_engine(args.engine)
    if engine is None:
        print(
            "images: no usable container engine, so nothing was built:\n"
            + "".join(f"  {problem}\n" for problem in problems)
            + "Install Docker, Podman or Buildah (or start the Docker daemon; CONTAINER_ENGINE picks one) "
            "and run `make images` again. These are the images it builds:",
            file=sys.stderr,
        )
        for tag, dockerfile in images:
            print(f"  {tag}  ({dockerfile})", file=sys.stderr)
        return 2
    extra = shlex.split(args.build_args)
    for tag, dockerfile in images:
        command = build_command(engine, tag, dockerfile, extra)
        print("+ " + shlex.join(command), flush=True)
        if args.dry_run:
            continue
        result = subprocess.run(command, cwd=REPO, check=False)
        if result.returncode != 0:
            print(
                f"images: building {tag} from {dockerfile} failed (exit {result.returncode})", file=sys.stderr
            )
            return result.returncode
    if not args.dry_run:
        print(f"images: built {len(images)} images with {engine}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
