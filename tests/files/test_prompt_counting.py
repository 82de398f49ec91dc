"""The validator counts prompt tokens of each valid line as it streams (issue 6, item 3)."""

from __future__ import annotations

from typing import Any

import orjson

from files.validation import InputValidator, ModelTarget

MODEL = "boardwalk/tiny-chat"


def _line(custom_id: str, content: str, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_completion_tokens": 8,
            **body,
        },
    }


def _validate(rows: list[dict[str, Any]], counter: Any) -> Any:
    target = ModelTarget(
        name=MODEL,
        context_length=4096,
        media=frozenset(),
        revision_id="mcfg_counted",
        count_prompt_tokens=counter,
    )
    validator = InputValidator(lambda name: target)
    for row in rows:
        validator.feed(orjson.dumps(row) + b"\n")
    return validator.finish()


def _words(body: dict[str, Any]) -> int:
    return sum(len(m["content"].split()) for m in body["messages"])


def test_each_valid_line_is_counted_for_the_targets_revision() -> None:
    report = _validate([_line("a", "one two"), _line("b", "one two three")], _words)
    assert report.ok
    assert [line.prompt_tokens for line in report.lines] == [2, 3]
    assert report.prompt_tokens_revision == "mcfg_counted"


def test_sectioned_requests_are_counted_with_their_section_prefix() -> None:
    seen: list[dict[str, Any]] = []

    def counter(body: dict[str, Any]) -> int:
        seen.append(body)
        return _words(body)

    rows = [
        {"type": "header", "format": "batchrouter.sectioned.v1"},
        {
            "type": "section",
            "section_id": "s1",
            "body": {
                "model": MODEL,
                "max_completion_tokens": 8,
                "messages": [{"role": "system", "content": "shared prefix words"}],
            },
        },
        {
            "type": "request",
            "custom_id": "a",
            "body": {"messages": [{"role": "user", "content": "hi"}]},
        },
    ]
    report = _validate(rows, counter)
    assert report.ok
    assert [m["content"] for m in seen[0]["messages"]] == ["shared prefix words", "hi"]
    assert [line.prompt_tokens for line in report.lines] == [4]
    assert report.prompt_tokens_revision == "mcfg_counted"


def test_a_file_with_errors_stops_counting_and_reports_no_counts() -> None:
    calls: list[str] = []

    def counter(body: dict[str, Any]) -> int:
        calls.append(body["messages"][0]["content"])
        return 1

    bad = _line("b", "two")
    bad["body"]["temperature"] = 7  # out of range: the file is refused
    report = _validate([_line("a", "one"), bad, _line("c", "three")], counter)
    assert not report.ok
    assert calls == ["one"]  # nothing counted once the file cannot be accepted
    assert report.prompt_tokens_revision is None


def test_a_counter_that_raises_leaves_the_file_uncounted_but_valid() -> None:
    def counter(body: dict[str, Any]) -> int:
        raise OSError("tokenizer.json unreadable")

    report = _validate([_line("a", "one"), _line("b", "two")], counter)
    assert report.ok
    assert report.prompt_tokens_revision is None
    assert [line.prompt_tokens for line in report.lines] == [None, None]


def test_without_a_counter_nothing_is_counted() -> None:
    report = _validate([_line("a", "one")], None)
    assert report.ok and report.prompt_tokens_revision is None
