"""The docs agree with each other and with the chart.

- every relative link in the Markdown docs reaches a file, and its #anchor a heading of that file;
- every quoted section reference (`docs/platform.md, "The CRD and upgrades"`, or `see "RBAC"` within a
  doc), in the docs, the chart's NOTES/values/templates and the code's docstrings, names a heading that
  exists (a heading matches when it is the quoted text, or starts with it followed by ":" or ",");
- every Helm command in the docs uses the one release name and namespace the docs are written for, and
  every ClusterRole a doc binds or lists is one the chart renders for that release;
- the chart's kubeVersion and the docs name the same minimum Kubernetes version;
- every CRD apply the chart tells users to run takes ownership of fields Helm set (--force-conflicts).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.helm.chart import CHART, REPO, run, template_args

RELEASE = "grpo-operator"
RELEASE_NAMESPACE = "grpo-system"
BUILTIN_ROLES = {"admin", "edit", "view", "cluster-admin"}

MARKDOWN = sorted(
    [
        REPO / "README.md",
        CHART / "README.md",
        *(REPO / "docs").rglob("*.md"),
        *(REPO / "examples").rglob("*.md"),
    ]
)
OTHER_TEXT = sorted(
    [
        *(CHART / "templates").iterdir(),
        CHART / "values.yaml",
        *(REPO / "operator").rglob("*.py"),
        *(REPO / "trainer_image").rglob("*.py"),
        *(REPO / "examples").rglob("*.yaml"),
    ]
)

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FILE_SECTION = re.compile(r'([\w./-]+\.md)\)?,?\s+"([^"\n]+)"')
SAME_FILE_SECTION = re.compile(r'\b[sS]ee\s+"([^"\n]+)"')
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
HELM_COMMAND = re.compile(r"\bhelm\s+(install|upgrade|uninstall)\s+((?:--?[\w-]+\s+)*)([\w.-]+)([^\n]*)")


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def prose(text: str) -> str:
    """The text outside fenced code blocks (a link-like string in a code sample is not a link)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def headings(path: Path) -> list[str]:
    return [re.sub(r"[`*]", "", h) for h in HEADING.findall(prose(path.read_text(encoding="utf-8")))]


def sections(path: Path) -> list[str]:
    """Headings, and the bold run-in labels (`**Model cache.** ...`) the longer docs use as subsections."""
    text = prose(path.read_text(encoding="utf-8"))
    return [*headings(path), *re.findall(r"^\*\*([^*\n]+?)\.\*\*", text, re.MULTILINE)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def has_section(path: Path, name: str) -> bool:
    return any(h == name or re.match(rf"{re.escape(name)}[:,]", h) for h in sections(path))


def resolve_doc(source: Path, name: str) -> Path | None:
    for base in (source.parent, REPO, REPO / "docs"):
        candidate = (base / name).resolve()
        if candidate.is_file():
            return candidate
    return None


def test_every_relative_link_and_anchor_resolves() -> None:
    broken: list[str] = []
    for path in MARKDOWN:
        # Inline code spans hold regular expressions and shell snippets, not links.
        text = re.sub(r"`[^`\n]*`", "", prose(path.read_text(encoding="utf-8")))
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                broken.append(f"{rel(path)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in {slug(h) for h in headings(linked)}:
                broken.append(f"{rel(path)}: {target} (no heading with anchor #{anchor})")
    assert not broken, "\n".join(broken)


def test_every_quoted_section_reference_resolves() -> None:
    broken: list[str] = []
    for path in [*MARKDOWN, *OTHER_TEXT]:
        text = path.read_text(encoding="utf-8")
        text = prose(text) if path.suffix == ".md" else text
        flat = re.sub(r"\s*\n\s*(#\s*)?", " ", text)  # references wrap across comment lines
        for name, section in FILE_SECTION.findall(flat):
            doc = resolve_doc(path, name)
            if doc is None:
                broken.append(f"{rel(path)}: {name} does not exist")
            elif not has_section(doc, section):
                broken.append(f'{rel(path)}: {name} has no section "{section}"')
        if path.suffix == ".md":
            for section in SAME_FILE_SECTION.findall(flat):
                if not has_section(path, section):
                    broken.append(f'{rel(path)}: no section "{section}" in the same file')
    assert not broken, "\n".join(broken)


def test_docs_use_one_release_name_and_namespace() -> None:
    found = 0
    wrong: list[str] = []
    for path in [*MARKDOWN, CHART / "templates" / "NOTES.txt"]:
        for verb, _, name, rest in HELM_COMMAND.findall(path.read_text(encoding="utf-8")):
            if name.startswith("<"):
                continue
            found += 1
            namespace = re.search(r"(?:-n|--namespace)[ =]([\w-]+)", rest)
            if name != RELEASE or (namespace and namespace.group(1) != RELEASE_NAMESPACE):
                wrong.append(f"{rel(path)}: helm {verb} {name}{rest}")
    assert found >= 4
    assert not wrong, f"every doc installs release {RELEASE} in {RELEASE_NAMESPACE}:\n" + "\n".join(wrong)


def test_role_names_in_the_docs_are_the_ones_the_chart_renders() -> None:
    """A RoleBinding to a ClusterRole that does not exist is accepted by the API server and grants
    nothing, so a doc naming the role of another release name fails silently for its reader."""
    rendered = yaml.safe_load_all(run(template_args(release=RELEASE, namespace=RELEASE_NAMESPACE)).stdout)
    roles = {d["metadata"]["name"] for d in rendered if d and d["kind"] == "ClusterRole"}
    named: list[tuple[str, str]] = []
    for path in MARKDOWN:
        text = path.read_text(encoding="utf-8")
        named += [(rel(path), r) for r in re.findall(r"--clusterrole[= ]([\w.:-]+)", text)]
        named += [
            (rel(path), r) for r in re.findall(r"^\|\s*`([\w.-]+-(?:edit|view))`\s*\|", text, re.MULTILINE)
        ]
    assert {r for _, r in named} >= {f"{RELEASE}-edit", f"{RELEASE}-view"}
    unknown = [f"{where}: {role}" for where, role in named if role not in roles | BUILTIN_ROLES]
    assert not unknown, f"the chart renders {sorted(roles)} for release {RELEASE}:\n" + "\n".join(unknown)


def test_one_minimum_kubernetes_version() -> None:
    chart = (CHART / "Chart.yaml").read_text(encoding="utf-8")
    match = re.search(r'^kubeVersion:\s*">=\s*(\d+\.\d+)\.0-0"', chart, re.MULTILINE)
    assert match, 'Chart.yaml must state kubeVersion as ">=1.N.0-0"'
    minimum = match.group(1)
    stated = {
        (rel(path), version)
        for path in MARKDOWN
        for version in re.findall(
            r"Kubernetes v?(\d+\.\d+)(?:\.\d+)? or newer", path.read_text(encoding="utf-8")
        )
    }
    assert stated, "the quickstart must name the minimum Kubernetes version"
    assert {v for _, v in stated} == {minimum}, f"Chart.yaml says >= {minimum}; docs say {sorted(stated)}"


def test_crd_apply_commands_take_over_helms_fields() -> None:
    """Helm's server-side field manager owns the CRD fields it installed; `kubectl apply --server-side`
    of a newer CRD stops on conflicts with it unless it forces them."""
    missing: list[str] = []
    for path in [*MARKDOWN, CHART / "templates" / "NOTES.txt"]:
        for line in path.read_text(encoding="utf-8").splitlines():
            if "helm show crds" in line and "kubectl apply" in line and "--force-conflicts" not in line:
                missing.append(f"{rel(path)}: {line.strip()}")
    assert not missing, "\n".join(missing)


def test_commands_that_delete_a_retained_volume_come_after_a_warning() -> None:
    """Deleting a namespace or a checkpoint claim deletes the trained model with it: each doc that shows such
    a command says so (and to copy the model out) within the preceding lines."""
    unwarned: list[str] = []
    for path in MARKDOWN:
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if re.search(r"kubectl delete (namespace|ns|pvc)\b", line):
                before = " ".join(lines[max(0, i - 12) : i + 1]).lower()
                if not ("copy" in before and "model" in before):
                    unwarned.append(f"{rel(path)}:{i + 1}: {line.strip()}")
    assert not unwarned, "\n".join(unwarned)
