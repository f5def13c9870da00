"""Docs, comments and docstrings refer only to things that exist in this repository: every Markdown
document they name, every repository path, every ``grpo_operator``/``grpo_trainer`` dotted name and
every Sphinx cross-reference. A rename that leaves a stale mention behind, or a citation of a document
kept outside the repository, fails here with the file and line."""

from __future__ import annotations

import ast
import re
import subprocess
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEXT_SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".tpl", ".toml", ".txt", ".env"}
# Paths that begin like one of ours but name a file of another project, each where it is cited.
OTHER_PROJECTS = {
    "hack/lib/version.sh": "Kubernetes' own build script (hack/testbins.sh)",
    "docs/design/metrics.md": "vLLM's metrics design document (tests/helm/test_dashboard.py)",
}
TOP = r"(?:operator|trainer_image|hack|tests|docs|helm|examples|bench|crds|grpo_operator|grpo_trainer|grpo_metric)"
REPO_PATH = re.compile(r"(?<![\w/.$-])(" + TOP + r"/[\w./-]*[\w/])(\*?)")
MARKDOWN = re.compile(r"(?<![\w.-])([\w-]+\.md)\b")
DOTTED = re.compile(r"(?<![\w.])((?:grpo_operator|grpo_trainer|grpo_metric)(?:\.[A-Za-z_]\w*)+)")
SPHINX_ROLE = re.compile(r":(?:func|class|meth|attr|mod):`~?([\w.]+)`")


@cache
def tracked() -> tuple[Path, ...]:
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return tuple(
        REPO / name
        for name in names.splitlines()
        if (Path(name).suffix in TEXT_SUFFIXES or Path(name).name == "Makefile") and (REPO / name).is_file()
    )


def lines() -> list[tuple[Path, int, str]]:
    return [
        (path, number, line)
        for path in tracked()
        if path != Path(__file__).resolve()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
    ]


def where(path: Path, number: int) -> str:
    return f"{path.relative_to(REPO)}:{number}"


def test_every_markdown_document_named_is_in_the_repository() -> None:
    documents = {path.name for path in tracked() if path.suffix == ".md"}
    wrong = [
        f"{where(path, number)}: {name}"
        for path, number, line in lines()
        for name in MARKDOWN.findall(line)
        if name not in documents
    ]
    assert not wrong, (
        "these cite Markdown documents that are not in the repository; write the fact itself where it is "
        "needed, or in docs/design.md:\n" + "\n".join(wrong)
    )


def _exists(text: str, glob: str, near: Path) -> bool:
    bases = (REPO, REPO / "operator", REPO / "trainer_image", REPO / "helm" / "grpo-operator", near.parent)
    target = text.rstrip("/")
    if glob:
        return any(any(base.glob(target + "*")) for base in bases)
    return any((base / target).exists() for base in bases)


def test_every_repository_path_named_exists() -> None:
    wrong = [
        f"{where(path, number)}: {text}{glob}"
        for path, number, line in lines()
        for text, glob in REPO_PATH.findall(line)
        if text not in OTHER_PROJECTS and not _exists(text, glob, path)
    ]
    assert not wrong, "these name paths that do not exist (renamed or removed?):\n" + "\n".join(wrong)


def _module_file(parts: list[str]) -> Path | None:
    roots = {
        "grpo_operator": REPO / "operator",
        "grpo_trainer": REPO / "trainer_image",
        "grpo_metric": REPO / "trainer_image",
    }
    base = roots[parts[0]] / Path(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return base.with_suffix(".py") if base.with_suffix(".py").is_file() else None


def _names_in(path: Path) -> set[str]:
    return _names_of_tree(ast.parse(path.read_text(encoding="utf-8")))


def _resolves(dotted: str) -> bool:
    """Resolved from the source files, not by importing them: the trainer's modules need torch."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module_file(parts[:cut])
        if module is None:
            continue
        rest = parts[cut:]
        if rest and rest[0].startswith("__") and rest[0].endswith("__"):
            return True  # a module attribute every module has (__file__, __name__, ...)
        if rest and rest[0] not in _names_in(module) and _module_file([*parts[:cut], rest[0]]) is None:
            return False
        return all(part in _names_in(module) for part in rest[1:])
    return False


def _logger_names() -> set[str]:
    """Names given to logging.getLogger: dotted like modules, but only names."""
    names: set[str] = set()
    for path in tracked():
        if path.suffix == ".py":
            names.update(re.findall(r"getLogger\(\"([\w.]+)\"\)", path.read_text(encoding="utf-8")))
    return names


def test_every_dotted_project_name_resolves() -> None:
    loggers = _logger_names()
    wrong = [
        f"{where(path, number)}: {name}"
        for path, number, line in lines()
        if not (path.suffix == ".py" and re.match(r"\s*(from|import)\s", line))
        for name in DOTTED.findall(line)
        if name not in loggers and not re.search(r"\.(py|md|json|yaml)$", name) and not _resolves(name)
    ]
    assert not wrong, "these name modules or attributes that do not exist:\n" + "\n".join(wrong)


def _names_of_tree(tree: ast.AST) -> set[str]:
    """Every name a module defines, binds, imports or reads an attribute of."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Name | ast.arg):
            names.add(node.id if isinstance(node, ast.Name) else node.arg)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[-1])
    return names


@cache
def _defined_names() -> set[str]:
    names: set[str] = set()
    for path in tracked():
        if path.suffix == ".py":
            names |= _names_of_tree(ast.parse(path.read_text(encoding="utf-8")))
    return names


def test_every_sphinx_cross_reference_names_something_defined() -> None:
    wrong = [
        f"{where(path, number)}: {name}"
        for path, number, line in lines()
        if path.suffix == ".py"
        for name in SPHINX_ROLE.findall(line)
        if name.split(".")[-1] not in _defined_names()
    ]
    assert not wrong, "these cross-references name nothing the code defines or imports:\n" + "\n".join(wrong)


CLASS_LIKE = re.compile(r"``([A-Z]\w*[A-Z]\w*)``")


def test_every_class_named_in_a_docstring_exists() -> None:
    # ``CamelCase`` in Python text names a class; kube field values (``Apply``) have one capital only,
    # environment variables (``HOME``) none in lower case.
    wrong = [
        f"{where(path, number)}: {name}"
        for path, number, line in lines()
        if path.suffix == ".py"
        for name in CLASS_LIKE.findall(line)
        if any(c.islower() for c in name) and name not in _defined_names()
    ]
    assert not wrong, "these name classes that do not exist (renamed?):\n" + "\n".join(wrong)


TEST_ID = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def test_every_test_named_in_the_docs_is_defined() -> None:
    # The threat table of docs/platform.md, the restart table and others cite tests as `file::name`: a
    # renamed or removed test must not leave a claim behind that nothing checks any more.
    wrong = [
        f"{where(path, number)}: {file}::{name}"
        for path, number, line in lines()
        if path.suffix == ".md"
        for file, name in TEST_ID.findall(line)
        if not (REPO / file).is_file() or f"def {name}(" not in (REPO / file).read_text(encoding="utf-8")
    ]
    assert not wrong, "these cite tests that are not defined (renamed or removed?):\n" + "\n".join(wrong)
