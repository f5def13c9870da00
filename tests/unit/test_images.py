"""`make images` builds every image the project deploys, under the tags the chart, the spec defaults, the
examples and the docs name, from one version; every Dockerfile runs as a numeric non-root user."""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml
from grpo_operator import __version__
from grpo_operator.api.spec import DEFAULT_TRAINER_IMAGE, DEFAULT_VLLM_IMAGE

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "grpo-operator"
OWN_IMAGE = re.compile(r"ghcr\.io/grpo-operator/[a-z0-9-]+:[A-Za-z0-9._-]+")


def make_images_list() -> dict[str, str]:
    """tag -> Dockerfile, as `make images` (hack/images.py) builds them."""
    out = subprocess.run(
        [sys.executable, "hack/images.py", "list"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split("\t")[:2] for line in out.splitlines())


def test_one_version_for_package_chart_and_images() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert pyproject == __version__ == chart["appVersion"]
    assert all(tag.split(":")[-1].startswith(__version__) for tag in make_images_list())


def test_chart_and_spec_defaults_name_images_that_make_images_builds() -> None:
    built = make_images_list()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    # The chart's tag defaults to appVersion when image.tag is empty.
    assert values["image"]["tag"] == ""
    operator_image = f"{values['image']['repository']}:{chart['appVersion']}"
    assert built[operator_image] == "operator/Dockerfile"
    assert built[DEFAULT_TRAINER_IMAGE] == "trainer_image/Dockerfile"
    assert built[DEFAULT_VLLM_IMAGE] == "trainer_image/Dockerfile.vllm"
    assert values["jobDefaults"]["images"] == {
        "trainer": DEFAULT_TRAINER_IMAGE,
        "generation": DEFAULT_VLLM_IMAGE,
    }


def test_the_vllm_image_installs_the_plugin_from_one_build_directory_on_the_trainers_vllm() -> None:
    dockerfile = (ROOT / "trainer_image" / "Dockerfile.vllm").read_text()
    assert "COPY trainer_image/vllm_plugin/pyproject.toml /tmp/plugin/pyproject.toml" in dockerfile
    assert "COPY trainer_image/grpo_weight_broadcast /tmp/plugin/grpo_weight_broadcast" in dockerfile
    assert "pip install --no-deps /tmp/plugin" in dockerfile
    pinned = re.search(r"^vllm==(\S+)$", (ROOT / "trainer_image" / "requirements-vllm.txt").read_text(), re.M)
    assert pinned is not None
    assert f"ARG BASE_IMAGE=docker.io/vllm/vllm-openai:v{pinned.group(1)}\n" in dockerfile


def test_every_project_image_named_in_examples_docs_and_scripts_is_built() -> None:
    built = make_images_list()
    sources = [ROOT / "README.md", ROOT / "hack" / "demo.sh"]
    sources += [p for d in ("examples", "docs", "helm") for p in (ROOT / d).rglob("*") if p.is_file()]
    named = {
        (image, str(path.relative_to(ROOT)))
        for path in sources
        if path.suffix in {".md", ".yaml", ".yml", ".sh", ""}
        for image in OWN_IMAGE.findall(path.read_text(encoding="utf-8", errors="replace"))
    }
    assert named, "expected the examples and docs to name project images"
    missing = sorted((image, where) for image, where in named if image not in built)
    assert not missing, f"named but not built by `make images`: {missing}"


def dockerfiles() -> set[str]:
    skip = {".git", ".venv", "node_modules"}
    return {
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("Dockerfile*")
        if p.is_file()
        and not skip.intersection(p.relative_to(ROOT).parts)
        and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
    }


def test_make_images_builds_every_dockerfile() -> None:
    assert set(make_images_list().values()) == dockerfiles()


def test_every_dockerfile_runs_as_a_numeric_non_root_user_from_a_pinnable_base() -> None:
    for name in sorted(dockerfiles()):
        lines = [line.strip() for line in (ROOT / name).read_text().splitlines()]
        instructions = [line for line in lines if line and not line.startswith("#")]
        froms = [i for i, line in enumerate(instructions) if line.startswith("FROM ")]
        users = [i for i, line in enumerate(instructions) if line.startswith("USER ")]
        assert users and users[-1] > froms[-1], f"{name}: no USER after the last FROM"
        user = instructions[users[-1]].split()[1]
        assert re.fullmatch(r"[1-9][0-9]*(:[1-9][0-9]*)?", user), (
            f"{name}: USER {user} is not a numeric non-root uid"
        )
        # The base is an ARG so it can be pinned by digest (tag@sha256:...) without editing FROM.
        assert instructions[froms[-1]] == "FROM ${BASE_IMAGE}", name
        assert any(re.fullmatch(r"ARG BASE_IMAGE=\S+", line) for line in instructions), name


def test_operator_image_installs_the_packages_exact_pins_and_runs_the_charts_command() -> None:
    pins = [
        line.split("#", 1)[0].strip()
        for line in (ROOT / "operator" / "requirements.txt").read_text().splitlines()
        if line.split("#", 1)[0].strip()
    ]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert pins == project["dependencies"]
    assert project["scripts"]["grpo-operator"] == "grpo_operator.cli:main"
    dockerfile = (ROOT / "operator" / "Dockerfile").read_text()
    assert "pip install -r /tmp/req/requirements.txt" in dockerfile
    assert "pip install --no-deps /src" in dockerfile
    assert 'ENTRYPOINT ["grpo-operator"]' in dockerfile
    deployment = (CHART / "templates" / "deployment.yaml").read_text()
    assert 'command: ["grpo-operator"]' in deployment
    # The chart's pod securityContext runs as the uid the image declares.
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert f"USER {values['podSecurityContext']['runAsUser']}:" in dockerfile


def test_make_images_without_an_engine_fails_saying_what_is_missing(tmp_path: Path) -> None:
    # A PATH with only what the Makefile itself needs: no docker, podman or buildah.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("make", "cat", "sha256sum", "cut"):
        found = shutil.which(tool)
        assert found, f"{tool} is needed to run make"
        (bin_dir / tool).symlink_to(found)
    env = {k: v for k, v in os.environ.items() if k not in ("CONTAINER_ENGINE", "BUILD_ARGS")}
    env["PATH"] = str(bin_dir)
    proc = subprocess.run(
        ["make", "--no-print-directory", "images", f"PY={sys.executable}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0
    for engine in ("docker", "podman", "buildah"):
        assert f"{engine}: not on PATH" in proc.stderr, proc.stderr
    assert "nothing was built" in proc.stderr and "Install Docker, Podman or Buildah" in proc.stderr
    for tag in make_images_list():
        assert tag in proc.stderr


def dry_run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "hack/images.py", "build", "--dry-run", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


def commands(proc: subprocess.CompletedProcess[str]) -> list[list[str]]:
    assert proc.returncode == 0, proc.stderr
    return [shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("+ ")]


def test_build_commands_use_the_repository_root_as_context() -> None:
    for engine, verb in (("docker", "build"), ("podman", "build"), ("buildah", "bud")):
        built = commands(dry_run("--engine", engine))
        expected = [[engine, verb, "-f", df, "-t", tag] for tag, df in make_images_list().items()]
        assert [command[:6] for command in built] == expected
        assert all(command[-1] == "." for command in built)


def test_the_host_ca_bundle_is_mounted_into_podman_builds_and_never_copied(tmp_path: Path) -> None:
    bundle = tmp_path / "corporate-ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    built = commands(dry_run("--engine", "podman", "--only", "operator", "--ca-bundle", str(bundle)))
    assert len(built) == 1
    command = built[0]
    mounts = [command[i + 1] for i, arg in enumerate(command) if arg == "-v"]
    # Over the base's own bundle, a file every base has: no mount point is left behind in a layer.
    assert mounts == [f"{bundle}:/etc/ssl/certs/ca-certificates.crt:ro"]
    assert command[command.index("--build-arg") + 1] == "PIP_CERT=/etc/ssl/certs/ca-certificates.crt"
    # Docker's build takes no bind mounts: the bundle is not passed rather than copied in.
    docker = commands(dry_run("--engine", "docker", "--only", "operator", "--ca-bundle", str(bundle)))
    assert "-v" not in docker[0] and "--build-arg" not in docker[0]
    for name in dockerfiles():
        text = (ROOT / name).read_text()
        # No Dockerfile copies a CA bundle or pip settings into an image ...
        assert "COPY" not in "\n".join(
            line for line in text.splitlines() if "ca-certificates" in line or "pip.conf" in line
        )
        # ... and every one that runs pip takes the bundle's path as a build argument (unset: pip's own).
        if "pip install" in text:
            after_from = text.split("FROM ${BASE_IMAGE}", 1)[1]
            assert re.search(r"^ARG PIP_CERT$", after_from, re.M), name


def test_a_subset_builds_in_build_order_and_an_unknown_key_names_the_keys() -> None:
    built = commands(dry_run("--engine", "podman", "--only", "metric-tiny operator"))
    assert [command[5] for command in built] == [
        f"ghcr.io/grpo-operator/grpo-operator:{__version__}",
        f"ghcr.io/grpo-operator/metric-tiny-demo:{__version__}",
    ]
    proc = dry_run("--engine", "podman", "--only", "operator,metrc-tiny")
    assert proc.returncode != 0
    assert "no image called metrc-tiny" in proc.stderr and "metric-tiny" in proc.stderr


def test_the_debian_base_stands_in_for_python_images_and_refuses_the_others() -> None:
    built = commands(dry_run("--engine", "podman", "--base", "debian", "--only", "operator metric-math"))
    for command in built:
        arg = command[command.index("--build-arg") + 1]
        assert re.fullmatch(r"BASE_IMAGE=localhost/grpo-base/python:3\.11-bookworm-[0-9a-f]{8}", arg), arg
    for key, why in (("trainer", "CUDA"), ("trainer-cpu", "download.pytorch.org")):
        proc = dry_run("--engine", "podman", "--base", "debian", "--only", key)
        assert proc.returncode != 0 and f"{key} cannot be built with --base debian" in proc.stderr
        assert why in proc.stderr


def test_the_engine_settings_file_names_the_runtime_and_ulimits_this_host_allows() -> None:
    conf = tomllib.loads((ROOT / "hack" / "containers.conf").read_text())
    assert conf["engine"]["runtime"] == "runc"
    limits = dict(item.split("=", 1) for item in conf["containers"]["default_ulimits"])
    assert set(limits) == {"nofile", "nproc"}
    images = importlib.import_module("hack.images")
    assert images.check_ulimits() == [], "the host's hard limits are below hack/containers.conf's ulimits"


def test_a_base_given_for_one_image_is_used_for_that_image_alone() -> None:
    pinned = "mirror.example/python:3.11-slim-bookworm@sha256:" + "0" * 64
    built = commands(
        dry_run("--engine", "podman", "--only", "operator metric-tiny", "--base-image", f"operator={pinned}")
    )
    assert built[0][built[0].index("--build-arg") + 1] == f"BASE_IMAGE={pinned}"
    assert not any(arg.startswith("BASE_IMAGE=") for arg in built[1])
    proc = dry_run("--engine", "podman", "--base-image", "operater=x:1")
    assert (
        proc.returncode != 0 and "--base-image takes KEY=IMAGE" in proc.stderr and "operater" in proc.stderr
    )
