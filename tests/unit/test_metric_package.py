"""The metric SDK is a package of its own: its wheel builds from trainer_image/grpo_metric alone, holds only
grpo_metric, depends only on aiohttp (at the repository's pin), and imports and serves without the
trainer or the operator being importable."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SDK = REPO / "trainer_image" / "grpo_metric"

# Run in a fresh interpreter whose path starts with the installed wheel: operator and trainer imports are
# made to fail, so anything the SDK needs from them shows up as an ImportError.
PROBE = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("grpo_operator", "grpo_trainer"):
            raise ImportError(f"the SDK imported {name}")
        return None
sys.meta_path.insert(0, Refuse())
sys.path.insert(0, sys.argv[1])
import json, urllib.request
import grpo_metric
assert grpo_metric.__file__.startswith(sys.argv[1]), grpo_metric.__file__
with grpo_metric.MetricServer(lambda example, completion: float(completion == example["answer"])) as server:
    body = json.dumps({"items": [{"id": "a", "prompt": "q", "completion": "4", "example": {"answer": "4"}}]})
    request = urllib.request.Request(server.url + "/score", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    print(urllib.request.urlopen(request, timeout=10).read().decode())
"""


def test_the_sdk_is_a_pip_installable_package_of_its_own(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(SDK, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(source),
            "-w",
            str(wheels),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("grpo_metric-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"grpo_metric"}
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata, re.MULTILINE)
    root = (REPO / "pyproject.toml").read_text()
    root_pin = re.search(r'"(aiohttp==[^"]+)"', root)
    math_pin = re.search(r'"(math-verify==[^"]+)"', root)
    assert root_pin is not None and math_pin is not None
    # aiohttp alone, and math-verify only for the stock image's `builtin` extra: the same pins as the repository.
    assert requires == [root_pin.group(1), f'{math_pin.group(1)}; extra == "builtin"']

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        timeout=300,
    )
    probe = subprocess.run(
        [sys.executable, "-I", "-c", PROBE, str(site)], capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert '"reward": 1.0' in probe.stdout
