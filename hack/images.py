"""Build the project's container images (`make images`).

    python3 hack/images.py list                       # key, tag and Dockerfile of each image
    python3 hack/images.py build [--only KEYS] [--base auto|registry|debian] [--dry-run]
    python3 hack/images.py base                       # the Debian-made Python base alone
    python3 hack/images.py install-engine             # podman, buildah, runc, mmdebstrap from apt

The version comes from one place, ``__version__`` in operator/grpo_operator/__init__.py; the chart's
appVersion, pyproject.toml and the spec's default trainer image must equal it (tests/unit/test_images.py).
Standard library only, so it runs before the virtualenv exists.

Bases. Each Dockerfile names its base as ``ARG BASE_IMAGE=<registry tag>``. With ``--base auto`` (the
default) an image is built from that tag when the engine has it or can pull it; where the registry is
unreachable (an air-gapped cluster's build host, or this project's CI), the Python images are built
from a base made here from Debian's own packages instead (``localhost/grpo-base/python:3.11-bookworm``:
mmdebstrap's minbase of bookworm with python3 and a venv on PATH, which plays ``python:3.11-slim``).
``--base registry`` never falls back; ``--base debian`` always uses the Debian-made base;
``--base-image KEY=IMAGE`` builds one image from exactly the base given (a mirror, a digest).

CA bundle. Build steps that reach a package index get the host's CA bundle (``--ca-bundle``; default the
first of $IMAGE_CA_BUNDLE, $PIP_CERT, $SSL_CERT_FILE, $REQUESTS_CA_BUNDLE that exists) bind-mounted for
the build only, with a pip.conf pointing at it: nothing of it is written into an image. Docker's
``build`` takes no such mounts; with Docker the host's bundle is not passed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_REGISTRY = "ghcr.io/grpo-operator"
ENGINES = ("docker", "podman", "buildah")
VERSION_FILE = REPO / "operator" / "grpo_operator" / "__init__.py"
ENGINE_CONFIG = REPO / "hack" / "containers.conf"
CACHE = Path(os.environ.get("GRPO_IMAGE_CACHE", Path.home() / ".cache" / "grpo-images"))
# What `install-engine` installs from the distribution's packages (Debian bookworm: podman 4.3.1).
ENGINE_PACKAGES = ("podman", "buildah", "runc", "uidmap", "mmdebstrap")

# The Debian-made stand-in for python:3.11-slim-bookworm. Its tag carries a hash of the recipe, so a
# changed recipe builds a new base instead of reusing a stale one.
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRRORS = (
    f"deb http://deb.debian.org/debian {DEBIAN_SUITE} main",
    f"deb http://deb.debian.org/debian {DEBIAN_SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {DEBIAN_SUITE}-security main",
)
DEBIAN_PACKAGES = ("python3", "python3-venv", "ca-certificates")
DEBIAN_VENV = "/opt/python"
DEBIAN_ENV = (
    f"PATH={DEBIAN_VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
)
DEBIAN_BASE_REPO = "localhost/grpo-base/python"
# Where Debian's ca-certificates (in python:3.11-slim and in the Debian-made base alike) keeps the bundle.
BASE_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


@dataclass(frozen=True)
class Image:
    key: str  # the name `make images IMAGES="..."` takes
    name: str  # repository name under the registry
    dockerfile: str  # relative to the repository root, which is every build's context
    suffix: str = ""  # appended to the version in the tag
    # Why the Debian-made Python base cannot stand in for this image's own base ("" when it can).
    no_debian_base: str = ""

    def tag(self, registry: str, version: str) -> str:
        return f"{registry}/{self.name}:{version}{self.suffix}"


# Every Dockerfile in the repository is built here; the test fails when one is missing.
IMAGES = (
    Image("operator", "grpo-operator", "operator/Dockerfile"),
    Image(
        "trainer", "trainer", "trainer_image/Dockerfile",
        no_debian_base="it needs CUDA's runtime libraries from its nvidia/cuda base",
    ),
    Image(
        "trainer-cpu", "trainer", "trainer_image/Dockerfile.cpu", suffix="-cpu",
        no_debian_base="its torch comes from PyPI's CPU-only index at download.pytorch.org",
    ),
    Image(
        "vllm", "vllm", "trainer_image/Dockerfile.vllm",
        no_debian_base="it adds the project's vLLM plugin to vLLM's own image",
    ),
    Image("metric-builtin", "metric-builtin", "trainer_image/Dockerfile.metric"),
    Image("metric-math", "metric-math", "examples/metrics/math_partial_credit/Dockerfile"),
    Image("metric-exact-match", "metric-exact-match", "examples/metrics/exact_match/Dockerfile"),
    Image("metric-tiny", "metric-tiny-demo", "examples/tiny/Dockerfile"),
    Image("calculator-env", "calculator-env", "examples/environments/calculator/Dockerfile"),
)  # fmt: skip


def version() -> str:
    match = re.search(r'^__version__ = "([^"]+)"$', VERSION_FILE.read_text(encoding="utf-8"), re.M)
    if match is None:
        raise SystemExit(f'no __version__ = "..." line in {VERSION_FILE}')
    return match.group(1)


def tags(registry: str = DEFAULT_REGISTRY) -> list[tuple[str, str]]:
    """(tag, dockerfile) for every image, in build order."""
    v = version()
    return [(image.tag(registry, v), image.dockerfile) for image in IMAGES]


def select(only: str) -> list[Image]:
    """The images named in ``only`` (keys, separated by spaces or commas), in build order; all if empty."""
    wanted = [key for key in re.split(r"[\s,]+", only) if key]
    unknown = sorted(set(wanted) - {image.key for image in IMAGES})
    if unknown:
        raise SystemExit(
            f"images: no image called {', '.join(unknown)}; the images are: "
            + " ".join(image.key for image in IMAGES)
        )
    return [image for image in IMAGES if not wanted or image.key in wanted]


def dockerfile_base(dockerfile: str) -> str:
    match = re.search(r"^ARG BASE_IMAGE=(\S+)$", (REPO / dockerfile).read_text(encoding="utf-8"), re.M)
    if match is None:
        raise SystemExit(f"{dockerfile}: no `ARG BASE_IMAGE=<image>` line")
    return match.group(1)


def engine_env(engine: str) -> dict[str, str]:
    """The environment an engine runs in: Podman and Buildah read the project's settings file."""
    env = dict(os.environ)
    if engine in ("podman", "buildah"):
        env.setdefault("CONTAINERS_CONF", str(ENGINE_CONFIG))
    return env


def run(command: list[str], engine: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=engine_env(engine), text=True, check=False, **kwargs)  # type: ignore[call-overload, no-any-return]


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
            probe = run([engine, "info"], engine, capture_output=True, timeout=60)
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


def check_ulimits() -> list[str]:
    """The engine settings' ulimits that this host's hard limits do not allow, each saying what to do."""
    limits = {"nofile": resource.RLIMIT_NOFILE, "nproc": resource.RLIMIT_NPROC}
    problems = []
    for name, wanted in re.findall(r'"(nofile|nproc)=(\d+):\d+"', ENGINE_CONFIG.read_text()):
        hard = resource.getrlimit(limits[name])[1]
        if hard != resource.RLIM_INFINITY and int(wanted) > hard:
            problems.append(
                f"{ENGINE_CONFIG.relative_to(REPO)} sets {name}={wanted} but this host's hard limit is {hard}: "
                f"lower it there (every container would fail with 'error setting rlimits')"
            )
    return problems


def ca_bundle(requested: str | None) -> Path | None:
    candidates = [requested] if requested else [
        os.environ.get(var) for var in ("IMAGE_CA_BUNDLE", "PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
    ]  # fmt: skip
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    if requested:
        raise SystemExit(f"images: --ca-bundle {requested} is not a file")
    return None


def ca_mounts(engine: str, bundle: Path | None) -> list[str]:
    """The build's view of the host's CA bundle: bind-mounted over the base's own bundle (a file every base
    has, so no mount point is left in a layer) for the RUN steps only, and pip told to use it through the
    Dockerfiles' ``ARG PIP_CERT`` (pip reads its own bundle otherwise). Only Podman and Buildah mount
    volumes into a build."""
    if bundle is None or engine == "docker":
        return []
    return [
        "-v", f"{bundle}:{BASE_CA_BUNDLE}:ro",
        "--build-arg", f"PIP_CERT={BASE_CA_BUNDLE}",
    ]  # fmt: skip


def build_command(engine: str, tag: str, dockerfile: str, extra: list[str]) -> list[str]:
    # buildah's docker-compatible verb is `bud`; docker and podman share `build`.
    verb = ["bud"] if engine == "buildah" else ["build"]
    return [engine, *verb, "-f", dockerfile, "-t", tag, *extra, "."]


def has_image(engine: str, tag: str) -> bool:
    # `image exists` is Podman's and Buildah's way of asking; Docker has only `image inspect`.
    verb = "inspect" if engine == "docker" else "exists"
    return run([engine, "image", verb, tag], engine, capture_output=True).returncode == 0


# --- the Debian-made base -----------------------------------------------------------------------------
def debian_recipe() -> str:
    return "\n".join([DEBIAN_SUITE, *DEBIAN_MIRRORS, *DEBIAN_PACKAGES, DEBIAN_VENV, *DEBIAN_ENV])


def debian_base_tag() -> str:
    return (
        f"{DEBIAN_BASE_REPO}:3.11-{DEBIAN_SUITE}-{hashlib.sha256(debian_recipe().encode()).hexdigest()[:8]}"
    )


def ensure_debian_base(engine: str) -> str:
    """The Debian-made base's tag, built first when the engine does not have it yet (~1 min, ~250 MB).
    The root filesystem is kept as a tarball in the cache, so a pruned engine store imports it again
    in seconds."""
    tag = debian_base_tag()
    if has_image(engine, tag):
        return tag
    tarball = CACHE / f"{tag.rsplit(':', 1)[1]}.tar"
    if not tarball.is_file():
        if not shutil.which("mmdebstrap"):
            raise SystemExit(
                "images: the Debian-made base needs mmdebstrap: run `python3 hack/images.py install-engine` "
                "(or apt-get install mmdebstrap)"
            )
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = tarball.with_suffix(".partial.tar")
        command = [
            "mmdebstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}",
            # Documentation and translations are dead weight in an image.
            "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/locale/*",
            f'--customize-hook=chroot "$1" python3 -m venv {DEBIAN_VENV}',
            DEBIAN_SUITE, str(partial), *DEBIAN_MIRRORS,
        ]  # fmt: skip
        print("+ " + shlex.join(command), flush=True)
        if subprocess.run(command, check=False).returncode != 0:
            raise SystemExit("images: mmdebstrap failed to build the Debian-made base (its log is above)")
        partial.rename(tarball)
    changes = [f"ENV {e}" for e in DEBIAN_ENV] + ['CMD ["python3"]', f"LABEL grpo.dev/base-recipe={tag}"]
    command = [
        engine,
        "import",
        *(arg for change in changes for arg in ("--change", change)),
        str(tarball),
        tag,
    ]
    print("+ " + shlex.join(command), flush=True)
    if run(command, engine).returncode != 0:
        raise SystemExit(f"images: `{engine} import` of {tarball} failed")
    return tag


@dataclass
class BaseChooser:
    """Which base each image is built from (see the module's docstring), deciding once per base tag."""

    engine: str
    mode: str
    dry_run: bool = False
    bases: dict[str, str] = field(default_factory=dict)  # image key -> base given for it alone

    def __post_init__(self) -> None:
        self.reachable: dict[str, str] = {}  # base tag -> "" (usable) or why not
        self.announced: set[str] = set()

    def registry_base(self, base: str) -> str:
        """ "" when ``base`` is in the engine's store or could be pulled, else what the pull said."""
        if base not in self.reachable:
            if has_image(self.engine, base):
                self.reachable[base] = ""
            else:
                print(f"+ {self.engine} pull {base}", flush=True)
                pulled = run([self.engine, "pull", base], self.engine, capture_output=True, timeout=900)
                said = (pulled.stderr or pulled.stdout).strip().splitlines()
                self.reachable[base] = "" if pulled.returncode == 0 else (said[-1] if said else "pull failed")
        return self.reachable[base]

    def choose(self, image: Image) -> tuple[list[str], str]:
        """(build arguments, the base used); SystemExit naming the image when none is usable."""
        chosen = self.bases.get(image.key)
        if chosen:  # a base given for this image alone: exactly that one, or a failure saying why
            why = "" if self.dry_run else self.registry_base(chosen)
            if why:
                raise SystemExit(
                    f"images: {image.key}: the base given for it, {chosen}, could not be had ({why})"
                )
            return ["--build-arg", f"BASE_IMAGE={chosen}"], chosen
        base = dockerfile_base(image.dockerfile)
        if self.dry_run and self.mode != "debian":
            return [], base
        if self.mode != "debian":
            why = self.registry_base(base)
            if not why:
                return [], base
            if self.mode == "registry" or image.no_debian_base:
                stand_in = f"; the Debian-made base cannot stand in: {image.no_debian_base}"
                raise SystemExit(
                    f"images: {image.key}: its base {base} could not be pulled ({why})"
                    + (
                        stand_in
                        if image.no_debian_base
                        else "; --base auto would build it FROM a Debian-made base"
                    )
                )
        elif image.no_debian_base:
            raise SystemExit(
                f"images: {image.key} cannot be built with --base debian: {image.no_debian_base}"
            )
        local = debian_base_tag() if self.dry_run else ensure_debian_base(self.engine)
        if self.mode == "auto" and base not in self.announced:
            self.announced.add(base)
            print(
                f"images: {base} is unreachable ({self.reachable[base]}); {image.key} is built FROM {local}"
            )
        return ["--build-arg", f"BASE_IMAGE={local}"], local


def image_size(engine: str, tag: str) -> str:
    proc = run([engine, "image", "inspect", "--format", "{{.Size}}", tag], engine, capture_output=True)
    return f"{int(proc.stdout.strip()) / 1e6:.0f} MB" if proc.stdout.strip().isdigit() else "?"


def install_engine() -> int:
    missing = [p for p in ENGINE_PACKAGES if not shutil.which("newuidmap" if p == "uidmap" else p)]
    if not missing:
        print("images: podman, buildah, runc and mmdebstrap are installed")
        return 0
    if not shutil.which("apt-get"):
        print(f"images: install {' '.join(missing)} with this system's package manager", file=sys.stderr)
        return 2
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    print(f"images: installing {' '.join(missing)} from the system's packages", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in ([*sudo, "apt-get", "update", "-q"], [*sudo, "apt-get", "install", "-y", "-q", *missing]):
        if subprocess.run(command, env=env, check=False).returncode != 0:
            print(f"images: `{shlex.join(command)}` failed", file=sys.stderr)
            return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="images", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="print each image's tag and Dockerfile")
    build = sub.add_parser("build", help="build the images")
    base = sub.add_parser("base", help="build the Debian-made Python base alone")
    sub.add_parser("install-engine", help="install podman, buildah, runc and mmdebstrap with apt-get")
    for subparser in (listing, build):
        subparser.add_argument(
            "--registry",
            default=os.environ.get("IMAGE_REGISTRY", DEFAULT_REGISTRY),
            help="registry prefix of the tags (env IMAGE_REGISTRY; default %(default)s)",
        )
        subparser.add_argument("--only", default=os.environ.get("IMAGES", ""), help="image keys (env IMAGES)")
    for subparser in (build, base):
        subparser.add_argument(
            "--engine", default=os.environ.get("CONTAINER_ENGINE") or None, choices=ENGINES
        )
    build.add_argument(
        "--base", default=os.environ.get("IMAGE_BASE", "auto"), choices=("auto", "registry", "debian")
    )
    build.add_argument(
        "--base-image",
        action="append",
        default=os.environ.get("IMAGE_BASES", "").split(),
        metavar="KEY=IMAGE",
        help="the base of one image (repeatable; env IMAGE_BASES, space-separated), e.g. "
        "operator=mirror.example/python:3.11-slim-bookworm@sha256:...",
    )
    build.add_argument("--ca-bundle", default=None, help="CA bundle for the build steps (see the docstring)")
    build.add_argument(
        "--build-args",
        default=os.environ.get("BUILD_ARGS", ""),
        help="extra arguments for every build, e.g. '--pull' (env BUILD_ARGS)",
    )
    build.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")
    args = parser.parse_args(argv)

    if args.command == "install-engine":
        return install_engine()
    if args.command == "list":
        v = version()
        for image in select(args.only):
            print(f"{image.tag(args.registry, v)}\t{image.dockerfile}\t{image.key}")
        return 0

    # A dry run only prints the commands, so it needs no working engine.
    engine, problems = (
        (args.engine or ENGINES[0], []) if getattr(args, "dry_run", False) else find_engine(args.engine)
    )
    if engine is None:
        print(
            "images: no usable container engine, so nothing was built:\n"
            + "".join(f"  {problem}\n" for problem in problems)
            + "Install Docker, Podman or Buildah (`python3 hack/images.py install-engine` installs Podman from "
            "the system's packages; CONTAINER_ENGINE picks one) and run `make images` again. These are the "
            "images it builds:",
            file=sys.stderr,
        )
        for tag, dockerfile in tags(getattr(args, "registry", DEFAULT_REGISTRY)):
            print(f"  {tag}  ({dockerfile})", file=sys.stderr)
        return 2
    if engine in ("podman", "buildah") and (problems := check_ulimits()):
        print("images: " + "\n  ".join(problems), file=sys.stderr)
        return 2
    if args.command == "base":
        print(ensure_debian_base(engine))
        return 0

    images = select(args.only)
    bases = dict(item.split("=", 1) for item in args.base_image if "=" in item)
    if unknown := sorted(set(bases) - {image.key for image in IMAGES}) or [
        i for i in args.base_image if "=" not in i
    ]:
        raise SystemExit(
            f"images: --base-image takes KEY=IMAGE with a key of `list`; got {', '.join(unknown)}"
        )
    chooser = BaseChooser(engine, args.base, dry_run=args.dry_run, bases=bases)
    mounts = ca_mounts(engine, ca_bundle(args.ca_bundle))
    extra = shlex.split(args.build_args)
    v = version()
    built: list[tuple[str, str, float]] = []
    # An image that cannot be built does not stop the others: the summary names each failure and why.
    failed: list[str] = []
    for image in images:
        tag = image.tag(args.registry, v)
        try:
            base_args, base_used = chooser.choose(image)
        except SystemExit as refused:
            if args.dry_run:
                raise
            failed.append(str(refused.code).removeprefix("images: "))
            continue
        command = build_command(engine, tag, image.dockerfile, [*base_args, *mounts, *extra])
        print("+ " + shlex.join(command), flush=True)
        if args.dry_run:
            continue
        started = time.monotonic()
        result = run(command, engine, cwd=REPO)
        if result.returncode != 0:
            failed.append(f"{image.key}: `{engine} build` of {image.dockerfile} exited {result.returncode}")
            continue
        built.append((tag, base_used, time.monotonic() - started))
    if args.dry_run:
        return 0
    print(f"images: built {len(built)} image(s) with {engine}:")
    for tag, base_used, seconds in built:
        print(f"  {tag}  {image_size(engine, tag)}  {seconds:.0f} s  FROM {base_used}")
    if failed:
        print(
            f"images: {len(failed)} not built:\n" + "".join(f"  {why}\n" for why in failed), file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
