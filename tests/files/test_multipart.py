"""The streaming multipart/form-data reader (RFC 7578) and POST /v1/files over it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from boardwalk.errors import InvalidRequest, PayloadTooLarge
from files.models import File
from files.multipart import (
    IncompleteBody,
    MultipartError,
    MultipartReader,
    Part,
    multipart_boundary,
)
from files.upload import upload_receive
from files.validation import ModelTarget
from tests.conftest import Api, jsonl, request_line

BOUNDARY = "b0undary"
CT = f"multipart/form-data; boundary={BOUNDARY}"


def form(
    *parts: tuple[str, bytes],
    preamble: bytes = b"",
    epilogue: bytes = b"\r\n",
    encoding: str = "strict",
) -> bytes:
    """A body with one part per (header block, value); header blocks end without CRLF."""
    body = preamble
    for headers, value in parts:
        body += f"--{BOUNDARY}\r\n{headers}\r\n\r\n".encode("utf-8", encoding) + value + b"\r\n"
    return body + f"--{BOUNDARY}--".encode() + epilogue


def field(name: str, value: bytes) -> tuple[str, bytes]:
    return f'Content-Disposition: form-data; name="{name}"', value


def file_part(value: bytes, *, name: str = "file", filename: str = "r.jsonl") -> tuple[str, bytes]:
    return (
        f'Content-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream",
        value,
    )


def reads(body: bytes, *, first: int | None = None) -> Callable[[int], bytes]:
    """A `read(n)` over `body`: the first read stops at `first`, later ones return up to n."""
    state = {"pos": 0, "first": first}

    def read(n: int) -> bytes:
        pos = state["pos"]
        limit = state["first"]
        if limit is not None:
            state["first"] = None
            n = min(n, limit - pos)
        data = body[pos : pos + n]
        state["pos"] = pos + len(data)
        return data

    return read


def parse(
    read: Callable[[int], bytes], *, read_size: int = 1024 * 1024
) -> list[tuple[Part, bytes]]:
    reader = MultipartReader(read, BOUNDARY.encode(), read_size=read_size)
    found = []
    while (part := reader.next_part()) is not None:
        found.append((part, b"".join(reader.chunks())))
    reader.drain()
    return found


TRICKY = (
    b'{"a":1}\r\n'  # CRLF line ends belong to the content
    b"\r\n-\r\n--\r\n--b0\r\n--b0undar\r\r\n--x"  # delimiter prefixes that are not one
    b"--b0undary in the middle of a line\r\n"
    b"\r"
)


# -- boundary ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        (CT, BOUNDARY.encode()),
        ('multipart/form-data; boundary="a b:c"', b"a b:c"),
        ("Multipart/Form-Data; charset=utf-8; Boundary=xyz", b"xyz"),
        ("multipart/form-data; boundary=" + "z" * 70, b"z" * 70),
        ("application/json", None),
        ("multipart/mixed; boundary=xyz", None),
        ("", None),
        (None, None),
    ],
)
def test_boundary_of_the_content_type(content_type: str | None, expected: bytes | None) -> None:
    assert multipart_boundary(content_type) == expected


@pytest.mark.parametrize(
    "content_type",
    [
        "multipart/form-data",
        "multipart/form-data; boundary=",
        "multipart/form-data; boundary=" + "z" * 71,
        'multipart/form-data; boundary="ends with space "',
        "multipart/form-data; boundary=semi{colon}",
        'multipart/form-data; boundary="caf\u00e9"',
    ],
)
def test_malformed_boundary_is_refused(content_type: str) -> None:
    with pytest.raises(MultipartError):
        multipart_boundary(content_type)


# -- framing ----------------------------------------------------------------------------


def test_fields_and_file_in_order() -> None:
    body = form(field("purpose", b"batch"), file_part(b"line 1\nline 2\n"))
    parts = parse(reads(body))
    assert [(p.name, p.filename, value) for p, value in parts] == [
        ("purpose", None, b"batch"),
        ("file", "r.jsonl", b"line 1\nline 2\n"),
    ]


@pytest.mark.parametrize("read_size", [1, 2, 7, 64])
def test_tiny_reads(read_size: int) -> None:
    body = form(file_part(TRICKY), field("purpose", b"batch"), preamble=b"pre\r\n", epilogue=b"epi")
    parts = parse(reads(body), read_size=read_size)
    assert [(p.name, value) for p, value in parts] == [("file", TRICKY), ("purpose", b"batch")]


def test_a_delimiter_split_at_every_position_across_two_reads() -> None:
    body = form(
        field("purpose", b"batch"),
        file_part(TRICKY),
        field("expires_after[anchor]", b"created_at"),
        preamble=b"ignored\r\n",
    )
    expected = [
        ("purpose", b"batch"),
        ("file", TRICKY),
        ("expires_after[anchor]", b"created_at"),
    ]
    for split in range(1, len(body)):
        for read_size in (len(body), 5):
            parts = parse(reads(body, first=split), read_size=read_size)
            assert [(p.name, value) for p, value in parts] == expected, (split, read_size)


def test_many_carriage_returns_in_a_part() -> None:
    value = b"\r" * 100 + b"\r\n--b0undar\r" * 50 + b"\r\n-- b0undary"
    for read_size in (1 << 20, 33):
        parts = parse(
            reads(form(file_part(value), field("purpose", b"batch"))), read_size=read_size
        )
        assert [v for _, v in parts] == [value, b"batch"]


def test_whole_reads_of_a_file_part_are_handed_on_as_they_came() -> None:
    pieces = [b"x" * 1000 + b"\n", b"y" * 1000 + b"\n"]
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"\r\n\r\n'.encode()
    tail = f"\r\n--{BOUNDARY}--\r\n".encode()
    queue = [head, *pieces, tail]
    reader = MultipartReader(lambda n: queue.pop(0) if queue else b"", BOUNDARY.encode())
    assert reader.next_part() == Part(name="file", filename=None)
    chunks = list(reader.chunks())
    assert chunks[0] is pieces[0] and chunks[1] is pieces[1]  # no copy
    assert reader.next_part() is None


def test_crlf_before_a_delimiter_belongs_to_the_delimiter() -> None:
    body = form(field("a", b""), field("b", b"\r\n"), field("c", b"x\r\n\r\n"))
    assert [value for _, value in parse(reads(body))] == [b"", b"\r\n", b"x\r\n\r\n"]


def test_preamble_epilogue_and_transport_padding_are_ignored() -> None:
    body = (
        b"This is a preamble.\r\n"
        + f"--{BOUNDARY} \t\r\n".encode()
        + b'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        + f"--{BOUNDARY}--  \r\nAn epilogue, with --{BOUNDARY} in it.\r\n".encode()
    )
    assert [(p.name, value) for p, value in parse(reads(body))] == [("purpose", b"batch")]


def test_a_body_of_only_the_closing_delimiter_has_no_part() -> None:
    assert parse(reads(f"--{BOUNDARY}--".encode())) == []


@pytest.mark.parametrize(
    "disposition",
    [
        'form-data; name="file"; filename="r\u00e9sum\u00e9 \u2603.jsonl"',
        "form-data; name=file; filename*=UTF-8''r%C3%A9sum%C3%A9%20%E2%98%83.jsonl",
        'FORM-DATA;name="file";  filename="r\u00e9sum\u00e9 \u2603.jsonl"',
    ],
)
def test_quoted_unquoted_and_unicode_names(disposition: str) -> None:
    body = form((f"content-disposition: {disposition}\r\nX-Other: ignored", b"data"))
    [(part, value)] = parse(reads(body))
    assert part == Part(name="file", filename="r\u00e9sum\u00e9 \u2603.jsonl")
    assert value == b"data"


DISPOSITION_A = 'Content-Disposition: form-data; name="a"'


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="empty body"),
        pytest.param(b"no boundary anywhere", id="no boundary"),
        pytest.param(form(field("purpose", b"batch")).replace(b"b0undary", b"other"), id="other"),
        pytest.param(form(field("a", b"1"))[: -len("--\r\n")], id="no closing delimiter"),
        pytest.param(form(field("a", b"1"))[:-4] + b"xx\r\n", id="garbage after boundary"),
        pytest.param(form(("Content-Type: text/plain", b"1")), id="no disposition"),
        pytest.param(form(("", b"1")), id="no header"),
        pytest.param(form(('Content-Disposition: attachment; name="a"', b"1")), id="not form-data"),
        pytest.param(form(("Content-Disposition: form-data", b"1")), id="no name"),
        pytest.param(form(('Content-Disposition: form-data; name=""', b"1")), id="empty name"),
        pytest.param(
            form(('Content-Disposition: form-data;\r\n name="a"', b"1")), id="folded header"
        ),
        pytest.param(form(("Content-Disposition form-data", b"1")), id="no colon"),
        pytest.param(
            form(('Content-Disposition: form-data; name="a"\r\nContent-Disposition: x', b"1")),
            id="two dispositions",
        ),
        pytest.param(
            form((f"{DISPOSITION_A}\r\nContent-Transfer-Encoding: base64", b"MQ==")),
            id="base64",
        ),
        pytest.param(
            form((f"{DISPOSITION_A}\r\nX-Other: \udcff", b"1"), encoding="surrogateescape"),
            id="header not utf-8",
        ),
    ],
)
def test_malformed_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(MultipartError):
        parse(reads(body))


def test_incomplete_bodies_say_so() -> None:
    body = form(field("purpose", b"batch"), file_part(b"line\n"))
    for cut in (len(body) - 10, body.index(b"line"), body.index(b"Content-Type")):
        with pytest.raises(IncompleteBody):
            parse(reads(body[:cut]))


def test_identity_transfer_encodings_are_accepted() -> None:
    headers = 'Content-Disposition: form-data; name="a"\r\nContent-Transfer-Encoding: BINARY'
    assert parse(reads(form((headers, b"1"))))[0][1] == b"1"


def test_oversized_header_block_is_refused() -> None:
    headers = 'Content-Disposition: form-data; name="a"\r\nX-Pad: ' + "p" * 20_000
    with pytest.raises(MultipartError, match="headers are longer"):
        parse(reads(form((headers, b"1"))), read_size=4096)


def test_read_value_is_capped() -> None:
    reader = MultipartReader(reads(form(field("purpose", b"x" * 100))), BOUNDARY.encode())
    reader.next_part()
    with pytest.raises(MultipartError, match="larger than 99 bytes"):
        reader.read_value(99)


# -- upload_receive: what the view calls ------------------------------------------------


def resolve(name: str) -> ModelTarget:
    return ModelTarget(name=name, context_length=2048, media=frozenset())


def receive(body: bytes, **kwargs: Any) -> Any:
    options: dict[str, Any] = {
        "boundary": BOUNDARY.encode(),
        "content_length": len(body),
        "resolver": resolve,
        **kwargs,
    }
    return upload_receive(reads(body), **options)


def stored_files(root: Path) -> list[Path]:
    return [p for p in (root / "content").rglob("*") if p.is_file()]


def test_upload_receive_streams_the_file_and_reports_the_other_fields(tmp_path: Path) -> None:
    data = jsonl(request_line("a"), request_line("b"))
    body = form(
        file_part(data),
        field("purpose", b"batch"),
        field("expires_after[anchor]", b"created_at"),
        file_part(b"second file", filename="again.jsonl"),
        field("purpose", b"again"),
    )
    received = receive(body)
    try:
        assert received.text == {"purpose": "batch"}
        assert received.unexpected == ["expires_after[anchor]", "file", "purpose"]
        upload = received.upload
        assert upload is not None and upload.size == len(data)
        assert upload.report is not None and upload.report.ok
        assert len(upload.report.lines) == 2
    finally:
        received.discard()
    assert stored_files(tmp_path) == []


def test_declared_length_over_the_limit_is_413_before_reading(monkeypatch) -> None:
    monkeypatch.setattr("files.upload.MAX_INPUT_BYTES", 4096)

    def read(n: int) -> bytes:
        raise AssertionError("the body must not be read")

    with pytest.raises(PayloadTooLarge):
        upload_receive(
            read,
            boundary=BOUNDARY.encode(),
            content_length=4096 + 1024 * 1024 + 1,
            resolver=resolve,
        )


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (form(file_part(b"x\n"))[:-20], "incomplete_upload"),
        (form(field("purpose", b"\xff")), "invalid_multipart"),
        (form(field("purpose", b"b" * 70_000)), "invalid_multipart"),
        (b"junk", "invalid_multipart"),
        (form(*(field(f"f{i}", b"1") for i in range(17))), "invalid_multipart"),
    ],
)
def test_bad_bodies_are_400_and_keep_nothing(body: bytes, code: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest) as raised:
        receive(body)
    assert raised.value.code == code
    assert stored_files(tmp_path) == []


# -- over HTTP --------------------------------------------------------------------------


def post(api: Api, body: bytes, content_type: str = CT) -> Any:
    return api.client.generic(
        "POST",
        "/v1/files",
        body,
        content_type=content_type,
        HTTP_AUTHORIZATION=f"Bearer {api.key}",
    )


@pytest.mark.django_db
def test_purpose_after_the_file_is_accepted(api: Api, catalog_model: Any) -> None:
    data = jsonl(request_line("a"))
    response = post(api, form(file_part(data), field("purpose", b"batch")))
    assert response.status_code == 200, response.content
    assert response.json()["bytes"] == len(data)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("parts", "param"),
    [
        ([field("purpose", b"batch"), file_part(b"x"), file_part(b"y")], "file"),
        ([field("purpose", b"batch"), field("purpose", b"batch"), file_part(b"x")], "purpose"),
        ([field("expires_after[seconds]", b"3600"), field("purpose", b"batch")], "expires_after"),
    ],
)
def test_extra_or_repeated_fields_are_400_naming_the_field(
    api: Api, catalog_model: Any, tmp_path: Path, parts: list[tuple[str, bytes]], param: str
) -> None:
    response = post(api, form(*parts))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "unsupported_field"
    assert error["param"].startswith(param)
    assert File.objects.count() == 0
    assert stored_files(tmp_path) == []


@pytest.mark.django_db
def test_missing_closing_boundary_is_an_incomplete_upload(
    api: Api, catalog_model: Any, tmp_path: Path
) -> None:
    body = form(field("purpose", b"batch"), file_part(jsonl(request_line("a"))))
    response = post(api, body[: -len(f"\r\n--{BOUNDARY}--\r\n")])
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "incomplete_upload"
    assert File.objects.count() == 0
    assert stored_files(tmp_path) == []


@pytest.mark.django_db
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_multipart_is_415(api: Api, content_type: str) -> None:
    response = post(api, b"purpose=batch", content_type=content_type)
    assert response.status_code == 415
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "unsupported_media_type")
    assert "multipart/form-data" in error["message"]


@pytest.mark.django_db
def test_multipart_without_a_boundary_is_400(api: Api) -> None:
    response = post(api, b"", content_type="multipart/form-data")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_multipart"


@pytest.mark.django_db
def test_oversized_upload_is_413_and_keeps_nothing(
    api: Api, catalog_model: Any, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr("files.upload.MAX_INPUT_BYTES", 4096)
    monkeypatch.setattr("files.upload.MULTIPART_OVERHEAD", 100)
    data = jsonl(*(request_line(f"t{i}") for i in range(100)))
    assert len(data) > 8192
    declared = post(api, form(field("purpose", b"batch"), file_part(data)))
    assert declared.status_code == 413
    assert declared.json()["error"]["code"] == "file_too_large"

    # Within the declared allowance, but the file part alone is over: found while streaming.
    monkeypatch.setattr("files.upload.MULTIPART_OVERHEAD", 1024 * 1024)
    monkeypatch.setattr("files.services.writes.MAX_INPUT_BYTES", 4096)
    streamed = post(api, form(field("purpose", b"batch"), file_part(data)))
    assert streamed.status_code == 413
    assert streamed.json()["error"]["code"] == "file_too_large"
    assert File.objects.count() == 0
    assert stored_files(tmp_path) == []


@pytest.mark.django_db
def test_a_rejected_file_leaves_no_blob_or_staging_file(
    api: Api, catalog_model: Any, tmp_path: Path
) -> None:
    body = form(field("purpose", b"fine-tune"), file_part(jsonl(request_line("a"))))
    response = post(api, body)
    assert response.json()["error"]["code"] == "invalid_purpose"
    assert stored_files(tmp_path) == []
