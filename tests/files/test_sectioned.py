"""BatchRouter sectioned JSONL (docs/API.md "BatchRouter sectioned input"): detection, merge
semantics, every line rule."""

from __future__ import annotations

import orjson
import pytest

from files.models import File
from files.validation.sectioned import effective_body
from tests.conftest import Api
from tests.files.test_validation import MODEL, SECRET, errors_of, jsonl, validate

HEADER = {"type": "header", "format": "batchrouter.sectioned.v1"}


def section(section_id: str = "s1", **body: object) -> dict:
    return {
        "type": "section",
        "section_id": section_id,
        "body": {
            "model": MODEL,
            "max_completion_tokens": 64,
            "messages": [{"role": "system", "content": "You are a support agent."}],
            **body,
        },
    }


def request(custom_id: str, section_id: str | None = None, **body: object) -> dict:
    row: dict = {
        "type": "request",
        "custom_id": custom_id,
        "body": {"messages": [{"role": "user", "content": SECRET}], **body},
    }
    if section_id is not None:
        row["section_id"] = section_id
    return row


def test_effective_body_overrides_fields_and_prefixes_messages():
    shared = {
        "model": MODEL,
        "temperature": 0.2,
        "max_completion_tokens": 256,
        "messages": [{"role": "system", "content": "S"}],
    }
    own = {"temperature": 0.7, "messages": [{"role": "user", "content": "U"}]}
    assert effective_body(shared, own) == {
        "model": MODEL,
        "temperature": 0.7,
        "max_completion_tokens": 256,
        "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
    }
    # A request without messages takes the section's; the section is never modified.
    assert effective_body(shared, {})["messages"] == [{"role": "system", "content": "S"}]
    assert shared["temperature"] == 0.2


def test_valid_sectioned_file_indexes_requests_with_their_sections():
    data = jsonl(
        HEADER,
        section("s1"),
        request("task-1"),
        section("s2", max_completion_tokens=32, n=2),
        request("task-2", section_id="s1", temperature=0.7),
        request("task-3"),
    )
    report = validate(data, chunk=7)
    assert report.ok, report.errors
    assert report.format == "sectioned.v1"
    assert report.model == MODEL
    lines = data.split(b"\n")
    offsets = [sum(len(x) + 1 for x in lines[:i]) for i in range(len(lines))]
    assert [(li.custom_id, li.offset, li.section_offset) for li in report.lines] == [
        ("task-1", offsets[2], offsets[1]),
        ("task-2", offsets[4], offsets[1]),  # explicit section_id beats the nearest section
        ("task-3", offsets[5], offsets[3]),  # nearest section above
    ]
    assert [(li.max_tokens, li.n) for li in report.lines] == [(64, 1), (64, 1), (32, 2)]
    assert report.lines[0].section_length == len(lines[1])


def test_request_field_overrides_are_validated_on_the_effective_body():
    # The section's max tokens is fine; the request's override is not.
    report = validate(jsonl(HEADER, section(), request("a", max_completion_tokens=0)))
    assert errors_of(report) == [(3, "body.max_completion_tokens", "invalid_max_tokens")]
    # A section field that is invalid shows up on each request that uses it.
    report = validate(jsonl(HEADER, section(temperature=9), request("a"), request("b")))
    assert [e[0:2] for e in errors_of(report)] == [(3, "body.temperature"), (4, "body.temperature")]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([request("a")], [(2, "section_id", "missing_section")]),
        ([request("a", section_id="nope")], [(2, "section_id", "unknown_section")]),
        (
            [request("a", section_id="s1"), section("s1")],  # defined below its request
            [(2, "section_id", "unknown_section")],
        ),
        (
            [section("s1"), section("s1"), request("a")],
            [(3, "section_id", "duplicate_section_id"), (4, "section_id", "invalid_section")],
        ),
        ([section("s1"), HEADER, request("a")], [(3, "type", "misplaced_header")]),
        ([section("s1"), {"type": "note"}, request("a")], [(3, "type", "invalid_line_type")]),
        (
            [section("s1"), request("a"), request("a")],
            [(4, "custom_id", "duplicate_custom_id")],
        ),
        (
            [section("s1"), {**request("a"), "method": "GET"}],
            [(3, "method", "invalid_method")],
        ),
        (
            [section("s1"), {**request("a"), "url": "/v1/embeddings"}],
            [(3, "url", "invalid_url")],
        ),
        ([section("s1"), {**request("a"), "extra": 1}], [(3, "extra", "unknown_field")]),
        (
            [{"type": "section", "section_id": "", "body": {}}, request("a")],
            [(2, "section_id", "invalid_section_id"), (3, "section_id", "invalid_section")],
        ),
        (
            [{"type": "section", "section_id": "s", "body": {"messages": "x"}}, request("a")],
            [(2, "body.messages", "invalid_messages"), (3, "section_id", "invalid_section")],
        ),
        ([section("s1")], [(0, "", "empty_file")]),
        (
            [section("s1", model="other/model"), request("a"), section("s2"), request("b")],
            [(5, "body.model", "model_mismatch")],
        ),
    ],
)
def test_line_rules_name_the_line_and_field(rows: list, expected: list):
    report = validate(jsonl(HEADER, *rows))
    assert errors_of(report) == expected
    assert not any(SECRET in e.message for e in report.errors)


def test_explicit_method_and_url_are_accepted():
    row = {**request("a"), "method": "POST", "url": "/v1/chat/completions"}
    assert validate(jsonl(HEADER, section(), row)).ok


def test_header_must_name_the_format():
    report = validate(jsonl({"type": "header", "format": "v0"}, section(), request("a")))
    assert errors_of(report) == [(1, "format", "invalid_format")]


def test_a_standard_file_is_not_sectioned():
    report = validate(
        jsonl(
            {
                "custom_id": "a",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "x"}],
                    "max_tokens": 5,
                },
            }
        )
    )
    assert report.ok and report.format is None


@pytest.mark.django_db
def test_upload_stores_the_format_and_section_spans(api: Api, catalog_model):
    data = jsonl(HEADER, section(), request("a"), request("b"))
    response = api.upload(data)
    assert response.status_code == 200, response.content
    file = File.objects.get(id=response.json()["id"])
    assert file.format == "sectioned.v1"
    assert file.line_count == 2
    assert [row[2] for row in file.line_index] == ["a", "b"]
    section_line = data.split(b"\n")[1]
    assert [row[5:] for row in file.line_index] == [
        [len(orjson.dumps(HEADER)) + 1, len(section_line)]
    ] * 2


@pytest.mark.django_db
def test_upload_answers_every_line_error(api: Api, catalog_model):
    response = api.upload(jsonl(HEADER, request("a"), section(), request("b", n=0)))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_input_file"
    assert [(d["line"], d["field"]) for d in error["details"]] == [
        (2, "section_id"),
        (4, "body.n"),
    ]
    assert not File.objects.exists()
