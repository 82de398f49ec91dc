"""docs/API.md lists every code a client can be shown, and nothing else (STYLE: codes as enums)."""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path

import pytest

from boardwalk.codes import ErrorCode, ItemCode, LineCode

API_MD = Path(__file__).resolve().parents[2] / "docs" / "API.md"

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
    # SPEC §10's minimum list of item-level error codes.
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
