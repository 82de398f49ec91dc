"""The repository owns its contract: every citation in code and docs names something it holds.

Code and docs cite API rules as `docs/API.md "Heading"` and the foundations as
`docs/ARCHITECTURE.md decision N`. A citation of a file outside the repository (a shared spec or
design note), of a path the repository lacks, of a heading a doc does not have or of a decision
ARCHITECTURE.md does not number leaves a reader with nothing to read, so it fails here, named by
file and line.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# This file quotes bad citations on purpose, as the cases its scanner must refuse.
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

SCANNED_SUFFIXES = (".py", ".md", ".toml", ".txt", ".jinja", ".html", ".cfg")
SCANNED_NAMES = ("Makefile", ".env.example")

# Documents outside the repository that older text used to cite.
OUTSIDE = re.compile(r"SPEC §|SPEC\.md|DESIGN\.md|DESIGN decisions?|\.\./shared")
# Repository-relative paths to a Python module or a Markdown page.
TOP_DIRS = (
    "docs|tests|inference|batches|billing|boardwalk|boardwalk_cli|files|webhooks|console"
    "|project|benchmarks|templates"
)
PATH = re.compile(rf"(?<![\w/.-])((?:{TOP_DIRS})/[\w./-]*\.(?:md|py))(?![\w/])")
DECISION = re.compile(r"ARCHITECTURE\.md,? decisions? (\d+)(?: and (\d+))?")
HEADING_CITE = re.compile(r'docs/([\w-]+\.md),? ((?:"[^"\n]+"(?:, )?)+)')
QUOTED = re.compile(r'"([^"\n]+)"')


@dataclass(frozen=True)
class Bad:
    path: str
    line: int
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.why}"


def architecture_decisions(text: str) -> set[int]:
    """The numbers of the list under ARCHITECTURE.md's "## Decisions" heading."""
    section = text.split("## Decisions", 1)[1].split("\n## ", 1)[0]
    return {int(number) for number in re.findall(r"^(\d+)\. ", section, re.MULTILINE)}


def headings(text: str) -> list[str]:
    return [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")]


def line_problems(
    path: str,
    lines: Iterable[str],
    exists: Callable[[str], bool],
    decisions: set[int],
    doc_headings: Callable[[str], list[str] | None],
) -> list[Bad]:
    """Every bad citation in one file's lines; `doc_headings(name)` is None for a missing doc."""
    bad: list[Bad] = []
    for number, line in enumerate(lines, start=1):
        for match in OUTSIDE.finditer(line):
            bad.append(Bad(path, number, f"cites {match.group(0)!r}, outside the repository"))
        for match in PATH.finditer(line):
            if not exists(match.group(1)):
                bad.append(Bad(path, number, f"cites {match.group(1)}, which does not exist"))
        for match in DECISION.finditer(line):
            for cited in filter(None, match.groups()):
                if int(cited) not in decisions:
                    bad.append(Bad(path, number, f"cites ARCHITECTURE.md decision {cited}"))
        for match in HEADING_CITE.finditer(line):
            known = doc_headings(match.group(1))
            if known is None:
                continue  # the path check names the missing doc
            for title in QUOTED.findall(match.group(2)):
                if not any(heading.startswith(title) for heading in known):
                    bad.append(Bad(path, number, f'docs/{match.group(1)} has no heading "{title}"'))
    return bad


def scanned(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return path.endswith(SCANNED_SUFFIXES) or name in SCANNED_NAMES or path.startswith(".ci/")


def tracked_files() -> list[str]:
    try:
        listed = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files")
    return [path for path in listed.stdout.splitlines() if scanned(path) and path != SELF]


def repository_problems(root: Path, paths: Iterable[str]) -> list[Bad]:
    decisions = architecture_decisions((root / "docs/ARCHITECTURE.md").read_text())
    cache: dict[str, list[str] | None] = {}

    def doc_headings(name: str) -> list[str] | None:
        if name not in cache:
            doc = root / "docs" / name
            cache[name] = headings(doc.read_text()) if doc.is_file() else None
        return cache[name]

    def exists(relative: str) -> bool:
        return (root / relative).exists()

    bad: list[Bad] = []
    for path in paths:
        file = root / path
        if not file.is_file():
            continue  # deleted in the work tree, not yet in the index
        text = file.read_text(errors="replace")
        bad += line_problems(path, text.splitlines(), exists, decisions, doc_headings)
    return bad


def test_every_citation_names_something_the_repository_holds() -> None:
    bad = repository_problems(ROOT, tracked_files())
    assert not bad, "citations of what the repository lacks:\n" + "\n".join(map(str, bad))


def _problems(line: str, path: str = "batches/example.py") -> list[str]:
    return [
        str(problem)
        for problem in line_problems(
            path,
            ["first line", line],
            exists=lambda relative: (
                relative in {"docs/API.md", "docs/ARCHITECTURE.md", "batches/models.py"}
            ),
            decisions={1, 2, 3},
            doc_headings=lambda name: (
                ["API decisions", "Errors", "Upload line codes (`x`)"] if name == "API.md" else None
            ),
        )
    ]


@pytest.mark.parametrize(
    "line",
    [
        '"""Retention (SPEC §9): unused input after 24 h."""',
        "The contract is `SPEC.md` (shared).",
        "# the broker only wakes workers (DESIGN decision 1)",
        "see ../shared/DESIGN.md",
        "as docs/SPEC.md says",
        "# (tests/batches/test_gone.py shows it)",
        "the engine decides (docs/ARCHITECTURE.md decision 10)",
        "claims (docs/ARCHITECTURE.md decisions 1 and 4)",
        '(docs/API.md "Retention")',
        '(docs/API.md "Errors", "Limits")',
    ],
)
def test_a_bad_citation_is_named_by_file_and_line(line: str) -> None:
    problems = _problems(line)
    assert problems, line
    assert all(problem.startswith("batches/example.py:2: ") for problem in problems)


@pytest.mark.parametrize(
    "line",
    [
        '(docs/API.md "Errors")',
        '(docs/API.md "Upload line codes"; docs/API.md, "Errors")',
        "(docs/ARCHITECTURE.md decisions 1 and 2)",
        "the model (batches/models.py) and docs/API.md",
        "RFC 9110 §13.2.2, the template tests/<app>/test_<module>.py",
        "SPECIAL tokens and DESIGNER names are words, not citations",
    ],
)
def test_a_citation_of_what_exists_passes(line: str) -> None:
    assert _problems(line) == []


def test_decisions_are_read_from_the_numbered_list() -> None:
    text = (
        "# A\n\n1. one\n\n## Decisions\n\n1. **a**\n   more\n2. **b**\n10. **c**\n\n## Next\n3. x"
    )
    assert architecture_decisions(text) == {1, 2, 10}
