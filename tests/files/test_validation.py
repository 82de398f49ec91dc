"""The upload validator for standard input files (docs/API.md "Standard input lines"): one test per
rule, plus streaming."""

from __future__ import annotations

import base64
import copy
import json

import orjson
import pytest

from files.validation import (
    InputValidator,
    LineError,
    ModelLookupError,
    ModelTarget,
    ValidationReport,
    rules,
)
from inference.capabilities import HONOURED_FIELDS, NEUTRAL_ONLY, REFERENCE_FIELDS

MODEL = "boardwalk/tiny-chat"
TEXT_ONLY = ModelTarget(name=MODEL, context_length=4096, media=frozenset())
MULTIMODAL = ModelTarget(name=MODEL, context_length=4096, media=frozenset({"image", "audio"}))
SECRET = "confidential prompt text"
PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n-not-really").decode()
WAV = base64.b64encode(b"RIFF....WAVEfmt ").decode()


def make_request(custom_id: str = "task-1", **body_fields: object) -> dict:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": SECRET}],
        "max_completion_tokens": 256,
    }
    body.update(body_fields)
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def jsonl(*rows: object, end: bytes = b"\n") -> bytes:
    return b"".join((row if isinstance(row, bytes) else orjson.dumps(row)) + end for row in rows)


def validate(
    data: bytes,
    *,
    target: ModelTarget = TEXT_ONLY,
    chunk: int | None = None,
    **limits: int,
) -> ValidationReport:
    validator = InputValidator(lambda name: target, **limits)
    step = chunk or max(len(data), 1)
    for start in range(0, len(data), step):
        validator.feed(data[start : start + step])
    return validator.finish()


def errors_of(report: ValidationReport) -> list[tuple[int, str, str]]:
    return [(error.line, error.field, error.code) for error in report.errors]


def only_error(report: ValidationReport) -> tuple[int, str, str]:
    assert report.error_count == 1, report.errors
    return errors_of(report)[0]


def body_error(*, target: ModelTarget = TEXT_ONLY, **body_fields: object) -> tuple[int, str, str]:
    """The single error of a two-line file whose second line has these body fields."""
    data = jsonl(make_request("ok"), make_request("bad", **body_fields))
    return only_error(validate(data, target=target))


def edited(edit) -> bytes:
    """A two-line file whose second request is changed in place by `edit(request)`."""
    row = make_request("bad")
    edit(row)
    return jsonl(make_request("ok"), row)


# -- a valid file -----------------------------------------------------------------------------


def test_valid_file_reports_each_line_with_exact_offsets_and_lengths():
    rows = [
        make_request("a", max_tokens=10, max_completion_tokens=None),
        make_request("b", max_completion_tokens=20, n=3),
        make_request("c", max_tokens=30, max_completion_tokens=30, temperature=0.5),
    ]
    data = jsonl(*rows)

    report = validate(data)

    assert report.ok and report.errors == [] and report.error_count == 0
    assert report.model == MODEL
    assert report.total_bytes == len(data)
    assert [(i.custom_id, i.max_tokens, i.n) for i in report.lines] == [
        ("a", 10, 1),
        ("b", 20, 3),
        ("c", 30, 1),
    ]
    for info, row in zip(report.lines, rows, strict=True):
        assert orjson.loads(data[info.offset : info.offset + info.length]) == row
        assert data[info.offset + info.length : info.offset + info.length + 1] == b"\n"


def test_crlf_line_ends_are_accepted_and_excluded_from_length():
    rows = [make_request("a"), make_request("b")]
    data = jsonl(*rows, end=b"\r\n")

    report = validate(data)

    assert report.ok
    for info, row in zip(report.lines, rows, strict=True):
        assert data[info.offset : info.offset + info.length] == orjson.dumps(row)
        assert data[info.offset + info.length : info.offset + info.length + 2] == b"\r\n"


def test_final_line_without_newline_is_a_line():
    data = jsonl(make_request("a")) + orjson.dumps(make_request("b"))

    report = validate(data)

    assert report.ok
    last = report.lines[-1]
    assert last.custom_id == "b"
    assert last.offset + last.length == len(data)


def test_valid_parameters_are_accepted():
    data = jsonl(
        make_request(
            temperature=2,
            top_p=1,
            n=8,
            stop=["a", "b", "c", "d"],
            seed=-1,
            presence_penalty=-2,
            frequency_penalty=2.0,
            logit_bias={"50256": -100, "1": 100},
            user="user-1",
            metadata={"team": "support"},
            store=False,
            stream=False,
            logprobs=None,
            response_format={"type": "text"},
            max_tokens=256,
        ),
        make_request("b", stop="END", stream=None, logprobs=False, temperature=None),
    )
    assert validate(data).ok


def test_every_honoured_parameter_has_a_rule():
    own_rules = {"model", "messages", "max_tokens", "max_completion_tokens"}
    unchecked = HONOURED_FIELDS - own_rules - set(NEUTRAL_ONLY) - set(rules.PARAMETER_CHECKS)
    assert unchecked == set()


# -- lines and streaming ----------------------------------------------------------------------


def test_empty_file_is_rejected():
    assert only_error(validate(b"")) == (0, "", "empty_file")


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (b"\n", 1),
        (jsonl(make_request("a")) + b"\n" + jsonl(make_request("b")), 2),
        (jsonl(make_request("a")) + b"\r\n", 2),
        (jsonl(make_request("a")) + b"  \t \n", 2),
        (jsonl(make_request("a"), end=b"\n\n"), 2),
    ],
)
def test_blank_lines_are_rejected(data, line):
    assert only_error(validate(data)) == (line, "", "blank_line")


def test_a_lone_carriage_return_does_not_end_a_line():
    data = orjson.dumps(make_request("a")) + b"\r" + jsonl(make_request("b"))

    assert only_error(validate(data)) == (1, "", "invalid_json")


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b'{"custom_id": "a",', "invalid_json"),
        (b"{'custom_id': 'a'}", "invalid_json"),
        (b'{"custom_id": "\xff\xfe"}', "invalid_utf8"),
        (b"[1, 2]", "not_an_object"),
        (b'"a string"', "not_an_object"),
        (b"null", "not_an_object"),
    ],
)
def test_a_line_must_be_a_json_object_in_utf8(line, code):
    data = jsonl(make_request("a"), line, make_request("b"))

    assert only_error(validate(data)) == (2, "", code)


def test_byte_order_mark_is_named():
    report = validate(b"\xef\xbb\xbf" + jsonl(make_request()))

    assert only_error(report) == (1, "", "invalid_json")
    assert "BOM" in report.errors[0].message


def test_line_too_large_is_skipped_without_buffering_it():
    limit = 1024 * 1024
    huge = make_request("huge", messages=[{"role": "user", "content": "x" * (3 * limit)}])
    data = jsonl(make_request("a"), huge, make_request("b"))
    validator = InputValidator(lambda name: TEXT_ONLY, max_line_bytes=limit)
    most = 0
    for start in range(0, len(data), 64 * 1024):
        validator.feed(data[start : start + 64 * 1024])
        most = max(most, validator.buffered_bytes)

    report = validator.finish()

    assert most <= limit + 1
    assert only_error(report) == (2, "", "line_too_large")
    assert [info.custom_id for info in report.lines] == ["a", "b"]
    assert report.lines[1].offset == len(jsonl(make_request("a"), huge))


@pytest.mark.parametrize("chunk", [None, 7, 64 * 1024])
def test_line_too_large_inside_one_chunk_and_at_end_of_file(chunk):
    limit = 1000
    big = orjson.dumps(make_request("big", messages=[{"role": "user", "content": "y" * limit}]))
    data = jsonl(make_request("a"), big) + big

    report = validate(data, chunk=chunk, max_line_bytes=limit)

    assert errors_of(report) == [(2, "", "line_too_large"), (3, "", "line_too_large")]
    assert f"{len(big)} bytes" in report.errors[0].message


@pytest.mark.parametrize("chunk", [1, 2, 3, None])
def test_line_of_exactly_the_limit_passes_with_crlf_split_anywhere(chunk):
    line = orjson.dumps(make_request("a"))
    data = line + b"\r\n" + line.replace(b'"a"', b'"b"') + b"\r\n"

    report = validate(data, chunk=chunk, max_line_bytes=len(line))

    assert report.ok
    assert [info.length for info in report.lines] == [len(line), len(line)]
    assert validate(data, chunk=chunk, max_line_bytes=len(line) - 1).error_count == 2


def test_split_between_carriage_return_and_newline():
    first = orjson.dumps(make_request("a"))
    data = first + b"\r\n" + orjson.dumps(make_request("b"))
    validator = InputValidator(lambda name: TEXT_ONLY)
    validator.feed(data[: len(first) + 1])  # ends on "\r"
    validator.feed(data[len(first) + 1 :])

    report = validator.finish()

    assert report.ok
    assert report.lines[0].length == len(first)
    assert report.lines[1].offset == len(first) + 2


def test_split_inside_a_multibyte_character():
    data = jsonl(make_request("a", messages=[{"role": "user", "content": "€ and 😀"}]))
    cut = data.index("€".encode()) + 1
    validator = InputValidator(lambda name: TEXT_ONLY)
    validator.feed(data[:cut])
    validator.feed(data[cut:])

    assert validator.finish().ok


def test_byte_at_a_time_gives_the_same_report_as_one_chunk():
    data = (
        jsonl(make_request("é-1", messages=[{"role": "user", "content": "naïve 😀"}]), end=b"\r\n")
        + jsonl(make_request("é-2", max_tokens=1))
        + b"\n"
        + b'{"custom_id": \xff}\r\n'
        + orjson.dumps(make_request("é-3", max_tokens=9000))
    )

    whole = validate(data)
    bytewise = validate(data, chunk=1)

    assert bytewise == whole
    assert errors_of(whole) == [
        (2, "body.max_tokens", "conflicting_max_tokens"),
        (3, "", "blank_line"),
        (4, "", "invalid_utf8"),
        (5, "body.max_tokens", "max_tokens_exceeds_context"),
    ]
    assert [info.custom_id for info in whole.lines] == ["é-1"]


def test_lines_beyond_the_limit_are_one_error_and_not_checked():
    data = jsonl(*(make_request(f"t{i}") for i in range(3)), b"not json", b"", b"[]")

    report = validate(data, max_lines=3)

    assert only_error(report) == (4, "", "too_many_lines")
    assert "6 lines" in report.errors[0].message
    assert len(report.lines) == 3


@pytest.mark.parametrize("chunk", [None, 5])
def test_exactly_the_line_limit_is_accepted(chunk):
    rows = [make_request(f"t{i}") for i in range(3)]
    assert validate(jsonl(*rows), max_lines=3, chunk=chunk).ok
    assert validate(jsonl(*rows)[:-1], max_lines=3, chunk=chunk).ok
    assert only_error(validate(jsonl(*rows) + b"x", max_lines=3, chunk=chunk)) == (
        4,
        "",
        "too_many_lines",
    )


def test_errors_are_capped_and_counted():
    data = jsonl(*([b"{"] * 150))

    report = validate(data, max_lines=1000)

    assert report.error_count == 150
    assert len(report.errors) == 100
    assert [error.line for error in report.errors] == list(range(1, 101))
    assert not report.ok


def test_feed_after_finish_is_refused():
    validator = InputValidator(lambda name: TEXT_ONLY)
    validator.feed(jsonl(make_request()))
    validator.finish()
    with pytest.raises(RuntimeError):
        validator.feed(b"")


# -- the envelope -----------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["custom_id", "method", "url", "body"])
def test_missing_top_level_key(key):
    data = edited(lambda row: row.pop(key))
    assert only_error(validate(data)) == (2, key, "missing_field")


def test_unknown_top_level_key():
    data = edited(lambda row: row.update(extra=1))
    assert only_error(validate(data)) == (2, "extra", "unknown_field")


def test_unknown_key_that_is_not_a_plain_name_is_not_echoed():
    data = edited(lambda row: row.update({SECRET + " !": 1}))
    report = validate(data)

    assert only_error(report) == (2, "<field>", "unknown_field")
    assert SECRET not in report.errors[0].message


@pytest.mark.parametrize("method", ["GET", "post", None, ["POST"]])
def test_method_must_be_post(method):
    data = edited(lambda row: row.update(method=method))
    assert only_error(validate(data)) == (2, "method", "invalid_method")


@pytest.mark.parametrize("url", ["/v1/completions", "/v1/chat/completions/", "", 1])
def test_url_must_be_chat_completions(url):
    data = edited(lambda row: row.update(url=url))
    assert only_error(validate(data)) == (2, "url", "invalid_url")


@pytest.mark.parametrize("custom_id", ["", 7, None, ["a"], "é" * 65])
def test_invalid_custom_id(custom_id):
    data = edited(lambda row: row.update(custom_id=custom_id))
    assert only_error(validate(data)) == (2, "custom_id", "invalid_custom_id")


def test_custom_id_of_128_bytes_is_accepted():
    assert validate(jsonl(make_request("é" * 64))).ok


def test_duplicate_custom_id_names_the_earlier_line():
    data = jsonl(make_request("a"), make_request("b"), make_request("a"))

    report = validate(data)

    assert only_error(report) == (3, "custom_id", "duplicate_custom_id")
    assert "line 1" in report.errors[0].message
    assert '"a"' not in report.errors[0].message


@pytest.mark.parametrize("body", [[], "x", None, 1])
def test_body_must_be_an_object(body):
    data = edited(lambda row: row.update(body=body))
    assert only_error(validate(data)) == (2, "body", "invalid_body")


# -- the model --------------------------------------------------------------------------------


def test_model_is_required():
    data = edited(lambda row: row["body"].pop("model"))
    assert only_error(validate(data)) == (2, "body.model", "missing_field")


@pytest.mark.parametrize("model", ["", 1, None, ["m"]])
def test_model_must_be_a_string(model):
    assert body_error(model=model) == (2, "body.model", "invalid_model")


def test_every_line_must_use_the_same_model_and_it_is_resolved_once():
    calls = []

    def resolve(name: str) -> ModelTarget:
        calls.append(name)
        return TEXT_ONLY

    data = jsonl(make_request("a"), make_request("b"), make_request("c", model="other"))
    validator = InputValidator(resolve)
    validator.feed(data)

    report = validator.finish()

    assert only_error(report) == (3, "body.model", "model_mismatch")
    assert f'line 1 ("{MODEL}")' in report.errors[0].message
    assert calls == [MODEL]
    assert report.model == MODEL


def test_resolver_error_carries_its_code_once():
    def resolve(name: str) -> ModelTarget:
        raise ModelLookupError("model_not_found", f"The model {name} does not exist")

    validator = InputValidator(resolve)
    validator.feed(jsonl(make_request("a"), make_request("b")))

    report = validator.finish()

    assert report.errors == [
        LineError(
            line=1,
            field="body.model",
            code="model_not_found",
            message=f"Line 1: The model {MODEL} does not exist",
        )
    ]


# -- max tokens -------------------------------------------------------------------------------


def test_max_tokens_is_required():
    data = edited(lambda row: row["body"].pop("max_completion_tokens"))
    assert only_error(validate(data)) == (2, "body.max_completion_tokens", "missing_max_tokens")


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [0, -1, 1.5, 10.0, True, "5", [5]])
def test_max_tokens_must_be_a_positive_integer(key, value):
    data = edited(lambda row: row["body"].update({"max_completion_tokens": None, key: value}))
    report = validate(data)

    assert only_error(report) == (2, f"body.{key}", "invalid_max_tokens")
    assert report.errors[0].message == f"Line 2: body.{key} must be a positive integer"


def test_max_tokens_may_not_exceed_the_context_length():
    assert body_error(max_completion_tokens=4097) == (
        2,
        "body.max_completion_tokens",
        "max_tokens_exceeds_context",
    )
    assert validate(jsonl(make_request(max_completion_tokens=4096))).ok


def test_max_tokens_and_max_completion_tokens_must_agree():
    assert body_error(max_tokens=100, max_completion_tokens=200) == (
        2,
        "body.max_tokens",
        "conflicting_max_tokens",
    )


# -- streaming parameters ---------------------------------------------------------------------


@pytest.mark.parametrize("value", [True, 0, "false"])
def test_stream_must_be_absent_or_false(value):
    assert body_error(stream=value) == (2, "body.stream", "unsupported_parameter")


def test_stream_options_are_rejected():
    assert body_error(stream_options={"include_usage": True}) == (
        2,
        "body.stream_options",
        "unsupported_parameter",
    )


# -- messages ---------------------------------------------------------------------------------


def test_messages_are_required():
    data = edited(lambda row: row["body"].pop("messages"))
    assert only_error(validate(data)) == (2, "body.messages", "missing_field")


@pytest.mark.parametrize("messages", [[], {}, "hi", None])
def test_messages_must_be_a_non_empty_list(messages):
    assert body_error(messages=messages) == (2, "body.messages", "invalid_messages")


def test_a_message_must_be_an_object():
    messages = [{"role": "system", "content": "x"}, "hi"]
    assert body_error(messages=messages) == (2, "body.messages[1]", "invalid_message")


def test_role_is_required():
    assert body_error(messages=[{"content": "x"}]) == (
        2,
        "body.messages[0].role",
        "missing_field",
    )


@pytest.mark.parametrize("role", ["bot", "function", "", None, 1])
def test_role_must_be_known(role):
    assert body_error(messages=[{"role": role, "content": "x"}]) == (
        2,
        "body.messages[0].role",
        "invalid_role",
    )


def test_every_role_is_accepted():
    messages = [
        {"role": "system", "content": "a"},
        {"role": "developer", "content": "b", "name": "dev"},
        {"role": "user", "content": [{"type": "text", "text": "c"}]},
        {"role": "assistant", "content": ""},
        {"role": "tool", "content": "d", "tool_call_id": "call_1"},
    ]
    assert validate(jsonl(make_request(messages=messages))).ok


def test_content_is_required():
    assert body_error(messages=[{"role": "user"}]) == (
        2,
        "body.messages[0].content",
        "missing_field",
    )


@pytest.mark.parametrize("content", [None, [], 1, {"type": "text", "text": "x"}])
def test_content_must_be_a_string_or_a_list_of_parts(content):
    assert body_error(messages=[{"role": "assistant", "content": content}]) == (
        2,
        "body.messages[0].content",
        "invalid_content",
    )


@pytest.mark.parametrize(
    ("part", "field"),
    [
        ("text", "body.messages[0].content[1]"),
        ({"text": "x"}, "body.messages[0].content[1].type"),
        ({"type": "file", "file": {}}, "body.messages[0].content[1].type"),
        ({"type": "text"}, "body.messages[0].content[1].text"),
        ({"type": "text", "text": 1}, "body.messages[0].content[1].text"),
        ({"type": "text", "text": "x", "extra": 1}, "body.messages[0].content[1].extra"),
    ],
)
def test_text_parts_are_checked(part, field):
    content = [{"type": "text", "text": "ok"}, part]
    assert body_error(messages=[{"role": "user", "content": content}]) == (
        2,
        field,
        "invalid_content_part",
    )


@pytest.mark.parametrize(
    ("message", "field", "code"),
    [
        ({"role": "user", "content": "x", "name": 1}, "name", "invalid_message"),
        ({"role": "user", "content": "x", "tool_calls": []}, "tool_calls", "unknown_field"),
        ({"role": "user", "content": "x", "tool_call_id": "c"}, "tool_call_id", "unknown_field"),
        ({"role": "tool", "content": "x"}, "tool_call_id", "missing_field"),
        ({"role": "tool", "content": "x", "tool_call_id": ""}, "tool_call_id", "invalid_message"),
    ],
)
def test_message_keys_are_checked(message, field, code):
    assert body_error(messages=[message]) == (2, f"body.messages[0].{field}", code)


# -- images and audio -------------------------------------------------------------------------


def image_part(url: str = PNG, **extra: object) -> dict:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def audio_part(data: str = WAV, audio_format: object = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": data, "format": audio_format}}


def user_parts(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "look"}, *parts]}]


def test_images_and_audio_are_accepted_where_the_model_takes_them():
    messages = user_parts(
        image_part(),
        image_part("https://example.com/cat.png", detail="low"),
        image_part("DATA:IMAGE/JPEG;BASE64,AAAA"),
        audio_part(),
        audio_part(audio_format="mp3"),
    )
    assert validate(jsonl(make_request(messages=messages)), target=MULTIMODAL).ok


@pytest.mark.parametrize(
    ("part", "target"),
    [
        (image_part(), TEXT_ONLY),
        (audio_part(), TEXT_ONLY),
        (audio_part(), ModelTarget(name=MODEL, context_length=4096, media=frozenset({"image"}))),
    ],
)
def test_media_the_model_does_not_take_is_rejected(part, target):
    assert body_error(messages=user_parts(part), target=target) == (
        2,
        "body.messages[0].content[1]",
        "unsupported_modality",
    )


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/cat.png",
        "ftp://example.com/cat.png",
        "https://",
        "https://[::1/x",
        # Whitespace, controls and forbidden code points in the host: not the host a fetch
        # would connect to (urlsplit drops tabs and newlines, keeps spaces and NULs).
        "https://exa mple.com/cat.png",
        "https://exa\tmple.com/cat.png",
        "https://exa\nmple.com/cat.png",
        "https://exa\x00mple.com/cat.png",
        "https://exa%20mple.com/cat.png",
        "https://exa<mple.com/cat.png",
        "https://example.com/c at.png",
        " https://example.com/cat.png",
        "https://user:secret@example.com/cat.png",
        "file:///etc/passwd",
        "data:text/plain;base64,AAAA",
        "data:image/png,raw",
        "data:image/png;base64,",
        "data:image/png;base64,AAA",
        "data:image/png;base64,AA=A",
        "data:image/png;base64,AA A",
        "data:image/png;base64,AAAé",
        "cat.png",
        7,
    ],
)
def test_image_url_must_be_a_base64_image_data_url_or_https(url):
    assert body_error(messages=user_parts(image_part(url)), target=MULTIMODAL) == (
        2,
        "body.messages[0].content[1].image_url.url",
        "invalid_image_url",
    )


def test_damaged_base64_at_either_end_of_a_large_image_is_caught():
    payload = base64.b64encode(bytes(range(256)) * 1024).decode()
    for damaged in ("!" + payload[1:], payload[:-5] + "!" + payload[-4:]):
        messages = user_parts(image_part("data:image/png;base64," + damaged))
        assert body_error(messages=messages, target=MULTIMODAL)[2] == "invalid_image_url"


@pytest.mark.parametrize(
    ("part", "field"),
    [
        ({"type": "image_url"}, "content[1].image_url"),
        ({"type": "image_url", "image_url": PNG}, "content[1].image_url"),
        ({"type": "image_url", "image_url": {"url": PNG}, "x": 1}, "content[1].x"),
        (image_part(detail="ultra"), "content[1].image_url.detail"),
        (image_part(size=1), "content[1].image_url.size"),
        ({"type": "input_audio"}, "content[1].input_audio"),
        ({"type": "input_audio", "input_audio": WAV}, "content[1].input_audio"),
        (audio_part(audio_format="ogg"), "content[1].input_audio.format"),
        (audio_part(audio_format=None), "content[1].input_audio.format"),
        (audio_part(data="not base64!"), "content[1].input_audio.data"),
        (audio_part(data=""), "content[1].input_audio.data"),
        (
            {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav", "x": 1}},
            "content[1].input_audio.x",
        ),
    ],
)
def test_media_part_shapes_are_checked(part, field):
    assert body_error(messages=user_parts(part), target=MULTIMODAL) == (
        2,
        f"body.messages[0].{field}",
        "invalid_content_part",
    )


def test_media_only_in_user_messages():
    messages = [{"role": "system", "content": [image_part()]}]
    assert body_error(messages=messages, target=MULTIMODAL) == (
        2,
        "body.messages[0].content[0]",
        "invalid_content_part",
    )


# -- other parameters -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["foo", "max_token", "temprature"])
def test_unknown_parameter(name):
    assert body_error(**{name: 1}) == (2, f"body.{name}", "unknown_parameter")


@pytest.mark.parametrize("name", sorted(REFERENCE_FIELDS - HONOURED_FIELDS))
def test_parameter_the_engine_cannot_honour_is_rejected(name):
    data = jsonl(make_request("ok"), make_request("bad", **{name: None}))

    report = validate(data)

    assert only_error(report) == (2, f"body.{name}", "unsupported_parameter")
    assert report.errors[0].message == (
        f"Line 2: body.{name} is not supported by this engine; remove it"
    )


TOOLS_TARGET = ModelTarget(name=MODEL, context_length=4096, media=frozenset(), dialect="hermes")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def json_schema_format(schema: object, **extra: object) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, **extra}}


@pytest.mark.parametrize(
    "fields",
    [
        {"logprobs": True},
        {"logprobs": True, "top_logprobs": 0},
        {"logprobs": True, "top_logprobs": 20},
        {"response_format": {"type": "json_object"}},
        {"response_format": json_schema_format({"type": "object"}, strict=True)},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        {"tools": [WEATHER]},
        {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False},
        {"tools": [WEATHER], "tool_choice": "none"},
        {
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
        {
            "tools": [WEATHER],
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
        },
    ],
)
def test_chat_completions_surface_is_accepted(fields):
    report = validate(jsonl(make_request("ok", **fields)), target=TOOLS_TARGET)
    assert report.ok, report.errors


def test_invalid_schema_is_an_upload_error_naming_the_line_and_response_format():
    data = jsonl(
        make_request("ok"),
        make_request("bad", response_format=json_schema_format({"type": "strng"})),
    )

    report = validate(data)

    assert only_error(report) == (
        2,
        "body.response_format.json_schema.schema",
        "invalid_parameter",
    )
    assert report.errors[0].message.startswith("Line 2: body.response_format")
    assert report.lines[0].custom_id == "ok" and len(report.lines) == 1


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "object", "not": {"required": ["a"]}}, "not"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "string", "pattern": "(?=secret)a"}, None),
    ],
)
def test_unsupported_schema_feature_is_an_upload_error(schema, named):
    data = jsonl(
        make_request("ok"), make_request("bad", response_format=json_schema_format(schema))
    )

    report = validate(data)

    assert only_error(report) == (
        2,
        "body.response_format.json_schema.schema",
        "unsupported_parameter",
    )
    message = report.errors[0].message
    if named:
        assert named in message
    assert "secret" not in message  # never quotes the schema's content


def test_tool_parameters_schema_is_compiled_at_upload():
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}
    assert body_error(tools=[WEATHER, bad], target=TOOLS_TARGET) == (
        2,
        "body.tools[1].function.parameters",
        "invalid_parameter",
    )


# Schemas no finite value matches: every way through their $ref recursion comes back.
ENDLESS_SCHEMAS = {
    "self": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}},
    "a-b-a": {
        "$ref": "#/$defs/a",
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
    },
    "required property": {
        "$ref": "#/$defs/node",
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"next": {"$ref": "#/$defs/node"}},
                "required": ["next"],
            }
        },
    },
    "root": {"type": "object", "properties": {"me": {"$ref": "#"}}, "required": ["me"]},
    "non-empty array": {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    "every branch": {
        "anyOf": [
            {"$ref": "#"},
            {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
        ]
    },
}
# Recursive schemas with a way out: accepted.
ENDING_SCHEMAS = {
    "tree, optional children": {
        "$ref": "#/$defs/node",
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["value"],
            }
        },
    },
    "linked list ending in null": {
        "type": "object",
        "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        "required": ["next"],
    },
    "plain local reference": {
        "type": "object",
        "properties": {"city": {"$ref": "#/$defs/city"}},
        "$defs": {"city": {"type": "string", "maxLength": 20}},
    },
}


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("schema", ENDLESS_SCHEMAS.values(), ids=ENDLESS_SCHEMAS)
def test_a_response_schema_no_finite_value_matches_is_refused(schema, strict):
    report = validate(
        jsonl(
            make_request("ok"),
            make_request("bad", response_format=json_schema_format(schema, strict=strict)),
        )
    )

    assert only_error(report) == (2, "body.response_format.json_schema.schema", "invalid_parameter")
    assert "$ref" in report.errors[0].message
    assert [line.custom_id for line in report.lines] == ["ok"]


@pytest.mark.parametrize("schema", ENDLESS_SCHEMAS.values(), ids=ENDLESS_SCHEMAS)
def test_tool_parameters_no_finite_value_matches_are_refused_by_the_same_check(schema):
    endless = {"type": "function", "function": {"name": "f", "parameters": schema}}
    report = validate(
        jsonl(make_request("ok"), make_request("bad", tools=[WEATHER, endless])),
        target=TOOLS_TARGET,
    )

    assert only_error(report) == (2, "body.tools[1].function.parameters", "invalid_parameter")
    assert "$ref" in report.errors[0].message


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("schema", ENDING_SCHEMAS.values(), ids=ENDING_SCHEMAS)
def test_recursive_schemas_that_can_end_are_accepted(schema, strict):
    tool = {"type": "function", "function": {"name": "f", "parameters": schema, "strict": strict}}
    data = jsonl(
        make_request("format", response_format=json_schema_format(schema, strict=strict)),
        # A tool's $ref resolves against its own parameters.
        make_request("tool", tools=[tool], tool_choice="required"),
    )

    report = validate(data, target=TOOLS_TARGET)

    assert report.ok, report.errors


@pytest.mark.parametrize("depth", [100, 400])  # past the compiler's limit; past Python's
def test_a_schema_nested_past_what_the_compiler_takes_is_unsupported_not_a_crash(depth):
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    row = make_request("deep", response_format=json_schema_format(schema))

    report = validate(jsonl(make_request("ok"), json.dumps(row).encode()))  # past orjson's 255

    assert only_error(report) == (
        2,
        "body.response_format.json_schema.schema",
        "unsupported_parameter",
    )


def test_tools_on_a_revision_without_tool_support_are_refused():
    data = jsonl(make_request("ok"), make_request("bad", tools=[WEATHER]))

    report = validate(data, target=TEXT_ONLY)

    assert only_error(report) == (2, "body.tools", "unsupported_parameter")
    assert "tool" in report.errors[0].message


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"logprobs": True, "top_logprobs": 21}, "body.top_logprobs"),
        ({"logprobs": True, "top_logprobs": -1}, "body.top_logprobs"),
        ({"top_logprobs": 3}, "body.top_logprobs"),
        ({"logprobs": "yes"}, "body.logprobs"),
        ({"response_format": {"type": "xml"}}, "body.response_format"),
        ({"response_format": {"type": "json_schema"}}, "body.response_format"),
        ({"response_format": json_schema_format([1])}, "body.response_format"),
        ({"response_format": {"type": "json_object", "schema": {}}}, "body.response_format"),
        ({"tool_choice": "auto"}, "body.tool_choice"),
        ({"parallel_tool_calls": True}, "body.parallel_tool_calls"),
        ({"tools": []}, "body.tools"),
        ({"tools": [WEATHER, WEATHER]}, "body.tools"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "body.tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "body.tool_choice",
        ),
        ({"tools": [WEATHER], "parallel_tool_calls": 1}, "body.parallel_tool_calls"),
    ],
)
def test_invalid_surface_values_are_refused(fields, field):
    assert body_error(target=TOOLS_TARGET, **fields) == (2, field, "invalid_parameter")


def test_other_tool_types_are_unsupported():
    tool = {"type": "custom", "custom": {"name": "grep"}}
    assert body_error(tools=[tool], target=TOOLS_TARGET) == (
        2,
        "body.tools",
        "unsupported_parameter",
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("temperature", -0.1),
        ("temperature", 2.01),
        ("temperature", "1"),
        ("temperature", True),
        ("top_p", 0),
        ("top_p", 1.5),
        ("n", 0),
        ("n", 9),
        ("n", 2.0),
        ("n", True),
        ("stop", ""),
        ("stop", []),
        ("stop", ["a", "b", "c", "d", "e"]),
        ("stop", ["a", ""]),
        ("stop", ["a", 1]),
        ("stop", 5),
        ("seed", 1.5),
        ("seed", "1"),
        ("seed", False),
        ("seed", 2**63),
        ("presence_penalty", -2.5),
        ("presence_penalty", 3),
        ("frequency_penalty", 2.1),
        ("frequency_penalty", "0"),
        ("logit_bias", {"abc": 1}),
        ("logit_bias", {"50256": 101}),
        ("logit_bias", {"50256": "1"}),
        ("logit_bias", []),
        ("user", 1),
        ("metadata", {"k": 1}),
        ("metadata", {f"k{i}": "v" for i in range(17)}),
        ("metadata", {"k" * 65: "v"}),
        ("metadata", {"k": "v" * 513}),
        ("metadata", "k=v"),
        ("store", "yes"),
        ("store", 1),
        ("response_format", "text"),
        ("response_format", {"type": "xml"}),
        ("response_format", {"type": "text", "x": 1}),
        ("response_format", {}),
    ],
)
def test_parameter_types_and_ranges(name, value):
    assert body_error(**{name: value}) == (2, f"body.{name}", "invalid_parameter")


# -- messages stay free of content ------------------------------------------------------------


def test_error_messages_never_quote_the_line():
    bad = make_request(SECRET, max_tokens=0, method=SECRET)
    bad["method"] = SECRET
    bad["url"] = SECRET
    bad["body"]["model"] = MODEL
    bad["body"]["messages"] = [
        {"role": SECRET, "content": SECRET},
        {"role": "user", "content": [{"type": SECRET}]},
        {"role": "user", "content": SECRET, SECRET: SECRET},
    ]
    bad["body"]["metadata"] = {SECRET: SECRET * 100}
    bad["body"]["stop"] = [SECRET] * 5
    other = copy.deepcopy(bad)
    other["body"]["model"] = SECRET + "/model with spaces"
    data = jsonl(bad, other, bad, b'{"' + SECRET.encode() + b'": ')

    report = validate(data)

    assert report.error_count > 10
    for error in report.errors:
        assert SECRET not in error.message and SECRET not in error.field
        assert error.message.startswith(f"Line {error.line}: ")


# -- what a model's dialect takes (docs/API.md "Model dialects") -------------------------------

QWEN3_TARGET = ModelTarget(name=MODEL, context_length=4096, media=frozenset(), dialect="qwen3")
HARMONY_TARGET = ModelTarget(name=MODEL, context_length=4096, media=frozenset(), dialect="harmony")


def test_tools_on_a_model_without_a_tool_syntax_are_refused_naming_the_model():
    # TEXT_ONLY speaks the plain dialect (Gemma 3, Phi-3.5, unknown templates).
    assert body_error(tools=[WEATHER]) == (2, "body.tools", "unsupported_parameter")
    report = validate(jsonl(make_request("bad", tools=[WEATHER])))
    assert f"model {MODEL!r} has no tool-call syntax (dialect plain)" in report.errors[0].message


@pytest.mark.parametrize(
    ("target", "effort"),
    [
        (QWEN3_TARGET, "none"),
        (QWEN3_TARGET, "minimal"),
        (QWEN3_TARGET, "high"),
        (HARMONY_TARGET, "low"),
        (HARMONY_TARGET, "medium"),
        (HARMONY_TARGET, "high"),
        (QWEN3_TARGET, None),
    ],
)
def test_reasoning_effort_is_taken_where_the_dialect_has_the_value(target, effort):
    report = validate(jsonl(make_request("ok", reasoning_effort=effort)), target=target)
    assert report.ok, report.errors


@pytest.mark.parametrize(
    ("target", "effort", "code", "says"),
    [
        (TEXT_ONLY, "high", "unsupported_parameter", "has no reasoning setting (dialect plain)"),
        (TOOLS_TARGET, "low", "unsupported_parameter", "has no reasoning setting (dialect hermes)"),
        (HARMONY_TARGET, "minimal", "unsupported_parameter", "takes low, medium, high"),
        (QWEN3_TARGET, "extreme", "invalid_parameter", "must be one of none, minimal"),
        (QWEN3_TARGET, 3, "invalid_parameter", "must be one of none, minimal"),
    ],
)
def test_reasoning_effort_a_model_cannot_honour_is_refused(target, effort, code, says):
    report = validate(
        jsonl(make_request("ok"), make_request("bad", reasoning_effort=effort)), target=target
    )
    assert only_error(report) == (2, "body.reasoning_effort", code)
    assert says in report.errors[0].message


def test_an_earlier_turn_may_carry_its_reasoning_and_nothing_else_new():
    history = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Simple sum."},
        {"role": "user", "content": "And 3+3?"},
    ]
    assert validate(jsonl(make_request("ok", messages=history)), target=QWEN3_TARGET).ok
    bad = [*history[:1], {**history[1], "reasoning_content": 7}, history[2]]
    report = validate(jsonl(make_request("ok"), make_request("bad", messages=bad)))
    assert only_error(report) == (2, "body.messages[1].reasoning_content", "invalid_message")
    stray = [{**history[0], "reasoning_content": "x"}]
    report = validate(jsonl(make_request("ok"), make_request("bad", messages=stray)))
    assert only_error(report) == (2, "body.messages[0].reasoning_content", "unknown_field")
