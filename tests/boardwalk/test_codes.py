"""docs/API.md lists every code a client can be shown, and nothing else (STYLE: codes as enums)."""

from __future__ import annotations

import ast
import re
from enum import StrEnum
from pathlib import Path

import pytest

from boardwalk.codes import ErrorCode, ItemCode, LineCode

ROOT = Path(__file__).resolve().parents[2]
API_MD = ROOT / "docs" / "API.md"
APPS = ("boardwalk", "files", "batches", "billing", "inference", "webhooks", "console")

# Each family is one "### …" subsection of "## Codes", one "- `code` …" bullet per member.
SUBSECTIONS = {
    ErrorCode: "### API error codes",
    LineCode: "### Upload line codes",
    ItemCode: "### Item error codes",
}


def _listed(heading: str) -> list[str]:
    text = API_MD.read_text()
    codes = text.split("\n## Codes\n", 1)[1].split("\n## ", 1)[0]
    body = codes.split(f"\n{heading}", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"^- `([a-z0-9_]+)`", body, flags=re.MULTILINE)


@pytest.mark.parametrize("family", list(SUBSECTIONS), ids=lambda f: f.__name__)
def test_api_md_lists_exactly_the_members_of_each_code_family(family: type[StrEnum]) -> None:
    listed = _listed(SUBSECTIONS[family])
    assert len(listed) == len(set(listed)), "a code is listed twice"
    members = {member.value for member in family}
    assert sorted(members - set(listed)) == [], "members missing from docs/API.md"
    assert sorted(set(listed) - members) == [], "docs/API.md lists codes that are no member"


@pytest.mark.parametrize("family", list(SUBSECTIONS), ids=lambda f: f.__name__)
def test_member_names_are_their_values_in_capitals(family: type[StrEnum]) -> None:
    # Call sites read like the wire value, so a grep for either finds both.
    assert all(member.name == member.value.upper() for member in family)


def test_spec_item_codes_are_members() -> None:
    # The item codes docs/API.md "Item error codes" promises at least.
    spec = {
        "context_length_exceeded",
        "image_fetch_failed",
        "invalid_media",
        "output_limit_exceeded",
        "batch_cancelled",
        "batch_expired",
        "insufficient_credit",
        "internal_error",
    }
    assert spec <= {member.value for member in ItemCode}


def test_members_are_their_wire_strings() -> None:
    assert ErrorCode.NOT_FOUND == "not_found"
    assert f"{ItemCode.BATCH_EXPIRED}" == "batch_expired"


def test_model_codes_a_create_answers_are_api_error_codes_too() -> None:
    # batch_create turns the resolver's line code into ErrorCode(code) when the file's model
    # stopped being usable after the upload.
    model_codes = {
        "model_ambiguous",
        "model_disabled",
        "model_not_found",
        "model_not_batch_enabled",
    }
    assert model_codes <= {m.value for m in LineCode} & {m.value for m in ErrorCode}


def _literal_codes(path: Path) -> list[str]:
    """Call sites that pass a code as a plain string: `code="…"`, `error_code="…"`, and the
    code argument of a line problem (`problems.add(field, "…", message)`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        values = [kw.value for kw in node.keywords if kw.arg in ("code", "error_code")]
        name = getattr(node.func, "attr", getattr(node.func, "id", ""))
        if name == "add" and len(node.args) == 3:
            values.append(node.args[1])
        for value in values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {value.value}")
    return found


def test_call_sites_use_members_not_strings() -> None:
    # A new code written as a string would pass every other test and be missing from the docs.
    paths = [p for app in APPS for p in (ROOT / app).rglob("*.py") if "migrations" not in p.parts]
    assert [hit for path in paths for hit in _literal_codes(path)] == []
