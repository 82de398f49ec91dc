"""BatchRouter sectioned JSONL (`batchrouter.sectioned.v1`,
docs/API.md "BatchRouter sectioned input"): line shapes and merge.

```
{"type":"header","format":"batchrouter.sectioned.v1"}
{"type":"section","section_id":"s1","body":{...shared parameters and prefix messages...}}
{"type":"request","custom_id":"task-1","body":{...}}            # nearest section above
{"type":"request","custom_id":"task-2","section_id":"s1","body":{...}}
```

The header is the first line. A request belongs to the section its `section_id` names, or else
to the nearest section above it; a section must be defined above the requests that use it, so a
file is checked in one streaming pass **[decision]**. The effective body of a request is the
section body with each request field overriding it, except `messages`, which is the section's
messages (the shared prefix) followed by the request's. The effective body then obeys every
rule of the standard format.
"""

from __future__ import annotations

from typing import Any

from boardwalk.codes import LineCode

from . import rules

FORMAT = "batchrouter.sectioned.v1"
FILE_FORMAT = "sectioned.v1"  # what File.format and `batchrouter_input_format` say
HEADER_KEYS = ("type", "format")
SECTION_KEYS = ("type", "section_id", "body")
REQUEST_KEYS = ("type", "custom_id", "section_id", "method", "url", "body")
MAX_SECTION_ID_BYTES = 128
# Sections are held while the file is checked (their bodies are merged into every request
# below them), so what they may hold in all is capped.
MAX_SECTION_BYTES = 64 * 1024 * 1024


def is_header(obj: Any) -> bool:
    return type(obj) is dict and obj.get("type") == "header"


def effective_body(section: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The section body, overridden field by field by the request's; messages concatenated."""
    body = {**section, **request}
    prefix, own = section.get("messages"), request.get("messages")
    if isinstance(prefix, list) and isinstance(own, list):
        body["messages"] = prefix + own
    return body


def check_header(obj: dict[str, Any], problems: rules.Problems) -> None:
    for key in obj:
        if key not in HEADER_KEYS:
            field = rules.field_path("", key)
            problems.add(
                field,
                LineCode.UNKNOWN_FIELD,
                f"remove {field}; the header holds only type and format",
            )
    if obj.get("format") != FORMAT:
        problems.add("format", LineCode.INVALID_FORMAT, f'the header\'s format must be "{FORMAT}"')


def check_section(obj: dict[str, Any], problems: rules.Problems) -> tuple[str | None, dict | None]:
    """A section line's shape; returns (section_id, body) when each is usable."""
    _check_keys(obj, SECTION_KEYS, ("section_id", "body"), "a section", problems)
    section_id = _check_section_id(obj, problems)
    body = obj.get("body")
    if "body" in obj and type(body) is not dict:
        problems.add("body", LineCode.INVALID_BODY, "body must be a JSON object")
        body = None
    elif body is not None and "messages" in body and type(body["messages"]) is not list:
        problems.add(
            "body.messages",
            LineCode.INVALID_MESSAGES,
            "a section's messages must be a list (a prefix)",
        )
        body = None
    return section_id, body


def check_request(
    obj: dict[str, Any], problems: rules.Problems
) -> tuple[str | None, str | None, dict | None]:
    """A request line's shape; returns (custom_id, section_id or None, body)."""
    _check_keys(obj, REQUEST_KEYS, ("custom_id", "body"), "a request", problems)
    custom_id = rules.check_custom_id(obj, problems) if "custom_id" in obj else None
    if "method" in obj and not rules.same(obj["method"], rules.METHOD):
        problems.add("method", LineCode.INVALID_METHOD, f'method must be "{rules.METHOD}"')
    if "url" in obj and not rules.same(obj["url"], rules.URL):
        problems.add("url", LineCode.INVALID_URL, f'url must be "{rules.URL}"')
    section_id = _check_section_id(obj, problems) if "section_id" in obj else None
    body = obj.get("body")
    if "body" in obj and type(body) is not dict:
        problems.add("body", LineCode.INVALID_BODY, "body must be a JSON object")
        body = None
    return custom_id, section_id, body


def _check_keys(
    obj: dict[str, Any],
    allowed: tuple[str, ...],
    required: tuple[str, ...],
    what: str,
    problems: rules.Problems,
) -> None:
    for key in required:
        if key not in obj:
            problems.add(key, LineCode.MISSING_FIELD, f"add {key}; every {what[2:]} line needs it")
    for key in obj:
        if key not in allowed:
            field = rules.field_path("", key)
            problems.add(
                field,
                LineCode.UNKNOWN_FIELD,
                f"remove the field {field}; {what} line holds only {', '.join(allowed)}",
            )


def _check_section_id(obj: dict[str, Any], problems: rules.Problems) -> str | None:
    value = obj.get("section_id")
    if not isinstance(value, str) or not value:
        problems.add(
            "section_id", LineCode.INVALID_SECTION_ID, "section_id must be a non-empty string"
        )
        return None
    if len(value.encode()) > MAX_SECTION_ID_BYTES:
        problems.add(
            "section_id",
            LineCode.INVALID_SECTION_ID,
            f"section_id may be at most {MAX_SECTION_ID_BYTES} bytes in UTF-8",
        )
        return None
    return value
