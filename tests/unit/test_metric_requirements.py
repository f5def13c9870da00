"""The images install what CI tests: trainer_image/requirements*.txt must match pyproject.toml's pins,
and the Dockerfiles must copy and import the packages they run. (No Docker engine here: this and
installing the same pins in CI is what keeps the images honest.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGE = ROOT / "trainer_image"


def pins(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            out[name.lower().replace("_", "-")] = version
    return out


def project() -> dict[str, list[str]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {"dependencies": data["project"]["dependencies"], **data["project"]["optional-dependencies"]}


def test_trainer_requirements_match_pyproject() -> None:
    image = pins((IMAGE / "requirements.txt").read_text().splitlines())
    declared = pins(project()["trainer"]) | pins(
        [d for d in project()["dependencies"] if not d.lower().startswith("kopf")]
    )
    assert image == declared


def test_metric_requirements_match_pyproject() -> None:
    image = pins((IMAGE / "requirements-metric.txt").read_text().splitlines())
    assert image == {"aiohttp": pins(project()["dependencies"])["aiohttp"]}


def test_vllm_pin_is_inside_trls_supported_window_and_matches_its_torch() -> None:
    vllm = pins((IMAGE / "requirements-vllm.txt").read_text().splitlines())["vllm"]
    major, minor, _ = (int(p) for p in vllm.split("."))
    assert (0, 22) <= (major, minor) <= (0, 31), "TRL 1.16 supports vLLM 0.22.0-0.31.0"
    # vllm 0.31.0 requires torch==2.13.0 and transformers<5.18 (its package metadata).
    trainer = pins(project()["trainer"])
    assert trainer["torch"] == "2.13.0"
    assert tuple(int(p) for p in trainer["transformers"].split(".")[:2]) < (5, 18)


def test_trainer_dockerfile_installs_both_requirement_files_and_checks_the_entrypoint() -> None:
    text = (IMAGE / "Dockerfile").read_text()
    assert "pip install -r /tmp/req/requirements.txt -r /tmp/req/requirements-vllm.txt" in text
    for package in ("grpo_trainer", "grpo_metric", "grpo_gateway", "grpo_operator/api"):
        assert re.search(rf"COPY \S*{package} /app/{package}", text), package
    assert 'ENTRYPOINT ["python", "-m", "grpo_trainer"]' in text
    assert re.search(r"import [^\n]*grpo_trainer\.main", text)
    assert re.search(r"import [^\n]*grpo_gateway\.app", text)


def test_entrypoint_module_imports_without_torch() -> None:
    # The operator-side CI image has no torch: config errors must still be reported without it.
    import grpo_trainer.main as main

    assert callable(main.main)
