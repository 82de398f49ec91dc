"""Bounded parsing of uploads and content requests: problem counts, values per
line, duplicate keys, nesting, huge Range numbers, conditional requests, short bodies."""

from __future__ import annotations

import io

import orjson
import pytest

from boardwalk.errors import InvalidRequest
from files.models import File
from files.upload import upload_receive
from files.validation import InputValidator, ModelTarget
from files.validation.shape import MAX_LINE_VALUES, byte_count
from tests.conftest import Api, content_of, jsonl, request_line

TARGET = ModelTarget(name="boardwalk/tiny-chat", context_length=4096, media=frozenset())


def _validate(data: bytes, chunk: int = 1024 * 1024):
    validator = InputValidator(lambda name: TARGET)
    for start in range(0, len(data), chunk):
        validator.feed(data[start : start + chunk])
    return validator.finish()


def _line_with_messages(items: bytes) -> bytes:
    head = orjson.dumps(request_line("task-1"))
    return head.replace(b'"messages":[', b'"messages":[' + items + b",", 1) + b"\n"


def test_problems_past_the_first_100_are_counted_not_kept():
    line = _line_with_messages(b",".join([b"1"] * 20_000))
    report = _validate(line)
    assert len(report.errors) == 100
    assert report.error_count == 20_000
    assert {e.code for e in report.errors} == {"invalid_message"}
    assert [e.field for e in report.errors[:2]] == ["body.messages[0]", "body.messages[1]"]


def test_kept_problems_stop_at_100_across_lines():
    bad = _line_with_messages(b",".join([b"1"] * 60))
    report = _validate(bad * 3)
    assert len(report.errors) == 100
    assert report.error_count == 60 * 3 + 2  # lines 2 and 3 also repeat line 1's custom_id
    assert report.errors[-1].line == 2


def test_a_line_of_millions_of_values_is_refused_unparsed():
    line = _line_with_messages(b",".join([b"1"] * (2 * MAX_LINE_VALUES)))
    report = _validate(line)
    assert report.error_count == 1
    (error,) = report.errors
    assert (error.line, error.field, error.code) == (1, "", "too_many_values")


def test_a_long_line_whose_commas_are_inside_strings_is_not_too_many_values():
    line = orjson.dumps(request_line("task-1", content="a, " * (MAX_LINE_VALUES + 10))) + b"\n"
    report = _validate(line)
    assert report.ok, report.errors


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"custom_id":"a","custom_id":"b",', "custom_id"),
        (b'{"custom_id":"a","body":{"temperature":1,"temperature":2,', "body.temperature"),
    ],
)
def test_duplicate_keys_are_an_upload_error_naming_line_and_field(raw: bytes, field: str):
    good = orjson.dumps(request_line("task-0"))
    row = orjson.dumps(request_line("task-1"))
    # Splice the duplicate into an otherwise valid line (the second one).
    if field == "custom_id":
        line = raw + row[len(b'{"custom_id":"task-1",') :]
    else:
        line = row.replace(b'"body":{', b'"body":{"temperature":1,"temperature":2,', 1)
    report = _validate(good + b"\n" + line + b"\n")
    assert report.error_count == 1
    (error,) = report.errors
    assert (error.line, error.field, error.code) == (2, field, "duplicate_key")
    assert "task-1" not in error.message


def test_duplicate_keys_inside_strings_are_not_duplicates():
    line = orjson.dumps(request_line("task-1", content='{"a":1,"a":2} role: user')) + b"\n"
    assert _validate(line).ok


def test_deeply_nested_line_is_invalid_json():
    line = _line_with_messages(b"[" * 5000 + b"]" * 5000)
    report = _validate(line)
    assert report.error_count == 1
    assert report.errors[0].code == "invalid_json"


def test_upload_shorter_than_its_content_length_is_refused(settings, tmp_path):
    body = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\n\r\n'
        + jsonl(request_line("task-1"))
        + b"\r\n--b--\r\n"
    )
    with pytest.raises(InvalidRequest) as raised:
        upload_receive(
            io.BytesIO(body).read,
            boundary=b"b",
            content_length=len(body) + 100,
            resolver=lambda name: TARGET,
        )
    assert raised.value.code == "incomplete_upload"
    staged = tmp_path / "content" / ".incoming"
    assert not staged.exists() or not any(staged.iterdir())
    form = upload_receive(
        io.BytesIO(body).read, boundary=b"b", content_length=len(body), resolver=lambda n: TARGET
    )
    assert form.upload is not None and form.upload.report is not None and form.upload.report.ok
    form.discard()


# -- over HTTP ------------------------------------------------------------------------------


@pytest.fixture
def stored(api: Api, catalog_model) -> tuple[str, bytes]:
    body = jsonl(*(request_line(f"task-{i}") for i in range(20)))
    response = api.upload(body)
    assert response.status_code == 200, response.content
    return response.json()["id"], body


@pytest.mark.django_db
def test_upload_with_duplicate_keys_is_400_naming_line_and_field(api: Api, catalog_model):
    line = orjson.dumps(request_line("task-1")).replace(
        b'"method":"POST"', b'"method":"POST","method":"POST"'
    )
    response = api.upload(line + b"\n")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_input_file"
    assert error["details"][0]["line"] == 1
    assert error["details"][0]["field"] == "method"
    assert error["details"][0]["code"] == "duplicate_key"
    assert not File.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("header", "status", "part"),
    [
        ("bytes=" + "9" * 5000 + "-", 416, None),
        ("bytes=0-" + "9" * 5000, 206, slice(0, None)),
        ("bytes=-" + "9" * 5000, 206, slice(0, None)),
        ("bytes=" + "0" * 5000 + "5-9", 206, slice(5, 10)),
    ],
)
def test_huge_range_numbers_follow_the_range_rules(
    api: Api, stored: tuple[str, bytes], header: str, status: int, part: slice | None
):
    file_id, body = stored
    response = api.get(f"/v1/files/{file_id}/content", HTTP_RANGE=header)
    assert response.status_code == status
    if part is not None:
        assert content_of(response) == body[part]
    else:
        assert response.json()["error"]["code"] == "range_not_satisfiable"


@pytest.mark.django_db
def test_if_none_match_answers_304_and_if_match_412(api: Api, stored: tuple[str, bytes]):
    file_id, body = stored
    path = f"/v1/files/{file_id}/content"
    etag = api.get(path)["ETag"]
    unchanged = api.get(path, HTTP_IF_NONE_MATCH=etag)
    assert unchanged.status_code == 304
    assert unchanged["ETag"] == etag
    assert content_of(unchanged) == b""
    assert api.get(path, HTTP_IF_NONE_MATCH=f'"other", W/{etag}').status_code == 304
    assert api.get(path, HTTP_IF_NONE_MATCH="*").status_code == 304
    changed = api.get(path, HTTP_IF_NONE_MATCH='"other"')
    assert changed.status_code == 200
    assert content_of(changed) == body

    assert api.get(path, HTTP_IF_MATCH=etag).status_code == 200
    assert api.get(path, HTTP_IF_MATCH="*").status_code == 200
    failed = api.get(path, HTTP_IF_MATCH='"other"')
    assert failed.status_code == 412
    assert failed.json()["error"]["code"] == "precondition_failed"
    assert failed["x-should-retry"] == "false"
    # Strong comparison for If-Match: a weak tag never matches.
    assert api.get(path, HTTP_IF_MATCH="W/" + etag).status_code == 412


def test_byte_count_agrees_with_bytes_count_across_windows():
    text = (b'{"a":[1,2],"b":"x,y"}' * 200_000)[: 3 * 1024 * 1024 + 7]
    expected = text.count(b",") + text.count(b"[") + text.count(b"{")
    assert byte_count(text, b",", b"[", b"{") == expected
    assert byte_count(bytearray(text), b":") == text.count(b":")
    assert byte_count(b"a,b", b",") == 1
