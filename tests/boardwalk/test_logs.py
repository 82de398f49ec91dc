"""Exceptions are logged with their type and frames, never their message (boardwalk.logs)."""

from __future__ import annotations

import logging

import pytest

from boardwalk.logs import exception_trace

PROMPT = "my secret prompt: the launch code is 0000"


def _decode(text: str) -> dict[str, str]:
    return {}[text]  # KeyError quoting the text


def _admit(text: str) -> None:
    try:
        _decode(text)
    except KeyError as exc:
        raise ValueError(f"cannot admit {text!r}") from exc


def test_the_trace_names_type_file_function_and_line_of_each_exception_never_the_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("tests.logs")
    with caplog.at_level(logging.ERROR, logger="tests.logs"):
        try:
            _admit(PROMPT)
        except ValueError as exc:
            logger.error("request could not be admitted: %s", exception_trace(exc))

    text = caplog.text
    assert "request could not be admitted: ValueError" in text
    assert 'tests/boardwalk/test_logs.py", line' in text
    assert "in _admit" in text and "in _decode" in text
    assert "return {}[text]" in text  # the source line of the frame
    assert "caused by KeyError" in text
    assert PROMPT not in text and "launch code" not in text
