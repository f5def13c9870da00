"""Release artifacts: the packaged chart and its repository index, the kubectl plugin's wheel, and the krew
launcher archive (docs/release.md).

    python hack/package.py chart  [--out dist/charts] [--url URL]   # helm package + helm repo index
    python hack/package.py plugin [--out dist/plugin]               # the kubectl-grpo wheel
    python hack/package.py krew   [--out dist/krew] [--write]       # launcher archive; checks the manifest

The version comes from ``__version__`` in operator/grpo_operator/__init__.py; each command refuses to
package when the chart, the plugin's metadata or the krew manifest say another one. Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "grpo-operator"
VERSION_FILE = REPO / "operator" / "grpo_operator" / "__init__.py"
PLUGIN_DIR = REPO / "kubectl-plugin"
LAUNCHER_TEMPLATE = PLUGIN_DIR / "krew" / "kubectl-grpo.in"
KREW_MANIFEST = PLUGIN_DIR / "krew" / "grpo.yaml"
# Where each top-level package the plugin may import lives in this repository.
SOURCE_ROOTS = {"grpo_operator": REPO / "operator", "grpo_metric": REPO / "trainer_image"}
PLUGIN_PACKAGE = "grpo_operator.kubectl_plugin"
# The layers hack/check_layers.py lets the plugin import (MAY_IMPORT["kubectl_plugin"]).
PLUGIN_LAYERS = ("api", "builders")
# The chart repository served next to the project's site (GitHub Pages); `--url` or CHART_REPO_URL for another.
DEFAULT_CHART_URL = "https://grpo-operator.github.io/grpo-operator/charts"
RELEASES = "https://github.com/grpo-operator/grpo-operator/releases/download"


def version() -> str:
    match = re.search(r'^__version__ = "([^"]+)"$', VERSION_FILE.read_text(encoding="utf-8"), re.M)
    if not match:
        raise SystemExit(f'no __version__ = "..." line in {VERSION_FILE}')
    return match.group(1)


def chart_field(name: str) -> str:
    """A top-level scalar of Chart.yaml (read without a YAML parser: this script runs before any venv)."""
    match = re.search(rf"^{name}:\s*\"?([^\"\s]+)\"?\s*$", (CHART / "Chart.yaml").read_text(), re.M)
    if not match:
        raise SystemExit(f"no `{name}:` line in {CHART / 'Chart.yaml'}")
    return match.group(1)


def check_chart_version() -> str:
    want = version()
    found = {"version": chart_field("version"), "appVersion": chart_field("appVersion")}
    wrong = {k: v for k, v in found.items() if v != want}
    if wrong:
        raise SystemExit(
            f"helm/grpo-operator/Chart.yaml says {wrong}, the operator's __version__ is {want}: the chart, "
            "the operator and the plugin are released together; set both to it (docs/release.md)"
        )
    return want


def helm_binary() -> str:
    """$HELM, else the helm `bash hack/testbins.sh helm` builds, else helm on PATH."""
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    pinned = re.search(
        r'HELM_VERSION="\$\{HELM_VERSION:-([^}]+)\}"', (REPO / "hack" / "versions.env").read_text()
    )
    cache = Path(os.environ.get("GRPO_TESTBINS", Path.home() / ".cache" / "grpo-testbins"))
    if pinned and (cache / f"helm-{pinned.group(1)}" / "helm").exists():
        return str(cache / f"helm-{pinned.group(1)}" / "helm")
    found = shutil.which("helm")
    if not found:
        raise SystemExit("no helm: run `bash hack/testbins.sh helm` (or put helm on PATH, or set HELM)")
    return found


def run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc


def package_chart(out: Path, url: str, helm: str | None = None) -> Path:
    """`helm package` into ``out`` and (re)write ``out``/index.yaml, merging an index already there so
    earlier versions published from the same folder stay listed."""
    ver = check_chart_version()
    helm = helm or helm_binary()
    out.mkdir(parents=True, exist_ok=True)
    run([helm, "lint", "--strict", str(CHART)])
    run([helm, "package", str(CHART), "--destination", str(out)])
    index = [helm, "repo", "index", str(out), "--url", url]
    if (out / "index.yaml").exists():
        index += ["--merge", str(out / "index.yaml")]
    run(index)
    tgz = out / f"grpo-operator-{ver}.tgz"
    if not tgz.exists():
        raise SystemExit(f"helm package wrote no {tgz}: see `ls {out}`")
    return tgz


def module_path(module: str) -> Path | None:
    """The file of a module of this repository's packages (a package's __init__.py); None otherwise."""
    root = SOURCE_ROOTS.get(module.split(".")[0])
    if root is None:
        return None
    base = root.joinpath(*module.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.exists():
            return candidate
    return None


def plugin_modules() -> dict[str, Path]:
    """Every module of this repository the plugin imports, directly or through another one, with the
    packages above each (importing a.b.c runs a/__init__.py and a/b/__init__.py)."""
    start = [PLUGIN_PACKAGE] + [
        f"{PLUGIN_PACKAGE}.{p.stem}"
        for p in sorted(SOURCE_ROOTS["grpo_operator"].joinpath(*PLUGIN_PACKAGE.split(".")).glob("*.py"))
        if p.stem != "__init__"
    ]
    found: dict[str, Path] = {}
    todo = list(start)
    while todo:
        module = todo.pop()
        path = module_path(module)
        if module in found or path is None:
            continue
        found[module] = path
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from a.b import c` may import the module a.b.c; module_path drops the names that are not.
                todo += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def plugin_files() -> dict[Path, Path]:
    """What the wheel holds, path under src/ -> file here: the plugin's package and the layers it may import
    (api, builders: hack/check_layers.py) whole, since they also read files of their own at run time (the
    upgrade snapshot, the vLLM supervisor script); elsewhere (the package root, settings, grpo_metric)
    only the modules the plugin imports, as the rest belongs to the control loop or the trainer."""
    files: dict[Path, Path] = {}
    for module, path in plugin_modules().items():
        root = SOURCE_ROOTS[module.split(".")[0]]
        files[path.relative_to(root)] = path
    package_dir = SOURCE_ROOTS["grpo_operator"] / "grpo_operator"
    for layer in ("kubectl_plugin", *sorted(PLUGIN_LAYERS)):
        for path in sorted((package_dir / layer).iterdir()):
            if path.is_file() and path.suffix in (".py", ".json"):
                files[path.relative_to(SOURCE_ROOTS["grpo_operator"])] = path
    return files


def stage_plugin(stage: Path) -> None:
    """The plugin's project tree: its pyproject.toml and README, and src/ with plugin_files()."""
    shutil.copy(PLUGIN_DIR / "pyproject.toml", stage / "pyproject.toml")
    shutil.copy(PLUGIN_DIR / "README.md", stage / "README.md")
    for relative, path in plugin_files().items():
        target = stage / "src" / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)


def build_plugin_wheel(out: Path, python: str = sys.executable) -> Path:
    """The kubectl-grpo wheel, built offline with the setuptools of ``python``'s environment (the
    version the plugin's build-system pins; the project's venv has it)."""
    probe = subprocess.run(
        [python, "-c", "import setuptools; print(setuptools.__version__)"], capture_output=True, text=True
    )
    pinned = re.search(r'"setuptools==([^"]+)"', (PLUGIN_DIR / "pyproject.toml").read_text())
    want = pinned.group(1) if pinned else "?"
    if probe.returncode != 0 or probe.stdout.strip() != want:
        raise SystemExit(
            f"building the plugin's wheel needs setuptools {want} in {python}'s environment "
            f"(found: {probe.stdout.strip() or 'none'}): run `{python} -m pip install setuptools=={want}`"
        )
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kubectl-grpo-") as tmp:
        stage = Path(tmp)
        stage_plugin(stage)
        run(
            [
                python,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-q",
                "-w",
                str(out),
                str(stage),
            ],
            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )
    wheel = out / f"kubectl_grpo-{version()}-py3-none-any.whl"
    if not wheel.exists():
        raise SystemExit(f"pip wheel wrote no {wheel.name}: see `ls {out}`")
    return wheel


def launcher_archive() -> bytes:
    """The krew archive: the launcher script and the plugin's README, byte for byte the same on every
    build (fixed times, owners and order) so the manifest's sha256 can be checked against the sources."""
    ver = version()
    files = [
        ("kubectl-grpo", LAUNCHER_TEMPLATE.read_text().replace("@VERSION@", ver).encode(), 0o755),
        ("README.md", (PLUGIN_DIR / "README.md").read_bytes(), 0o644),
    ]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data, mode in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)


def launcher_name() -> str:
    return f"kubectl-grpo-launcher-{version()}.tar.gz"


def manifest_text(sha256: str) -> str:
    """The krew manifest with this version's archive address and digest filled in."""
    ver = version()
    text = KREW_MANIFEST.read_text()
    text = re.sub(r"^(  version: ).*$", rf"\g<1>v{ver}", text, flags=re.M)
    text = re.sub(r"^(\s+uri: ).*$", rf"\g<1>{RELEASES}/v{ver}/{launcher_name()}", text, flags=re.M)
    return re.sub(r"^(\s+sha256: ).*$", rf'\g<1>"{sha256}"', text, flags=re.M)


def package_krew(out: Path, write: bool) -> Path:
    archive = launcher_archive()
    out.mkdir(parents=True, exist_ok=True)
    path = out / launcher_name()
    path.write_bytes(archive)
    want = manifest_text(hashlib.sha256(archive).hexdigest())
    if write:
        KREW_MANIFEST.write_text(want)
    elif KREW_MANIFEST.read_text() != want:
        raise SystemExit(
            f"{KREW_MANIFEST.relative_to(REPO)} does not name version {version()} and the sha256 of {path.name}: "
            "run `python hack/package.py krew --write` and commit it"
        )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    chart = sub.add_parser("chart", help="helm package + helm repo index")
    chart.add_argument("--out", type=Path, default=REPO / "dist" / "charts")
    chart.add_argument("--url", default=os.environ.get("CHART_REPO_URL") or DEFAULT_CHART_URL)
    plugin = sub.add_parser("plugin", help="the kubectl-grpo wheel")
    plugin.add_argument("--out", type=Path, default=REPO / "dist" / "plugin")
    krew = sub.add_parser("krew", help="the krew launcher archive; checks (or --write) the manifest")
    krew.add_argument("--out", type=Path, default=REPO / "dist" / "krew")
    krew.add_argument("--write", action="store_true", help="rewrite the manifest's version, uri and sha256")
    args = parser.parse_args(argv)
    if args.what == "chart":
        tgz = package_chart(args.out, args.url)
        print(f"{tgz}\n{args.out / 'index.yaml'} (charts served from {args.url})")
    elif args.what == "plugin":
        print(build_plugin_wheel(args.out))
    else:
        print(package_krew(args.out, args.write))
    return 0


if __name__ == "__main__":
    sys.exit(main())
