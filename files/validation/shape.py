"""Cheap looks at a line's JSON text: how many values it holds, and duplicated keys.

orjson builds an object per value and keeps the last of duplicate keys silently. These
helpers bound what parsing a line may cost and find what parsing would hide, without
building anything for the common case.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from .rules import field_path

# At most this many JSON values in a line (an upper bound: commas and openings outside strings).
MAX_LINE_VALUES = 100_000
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_STRING_OR_STRUCTURE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[,\[{]')


# Bytes are counted in windows this long, so the comparison arrays stay small.
_COUNT_WINDOW = 1024 * 1024


def byte_count(text: bytes | bytearray, *values: bytes) -> int:
    """How many bytes of `text` are one of `values` (single bytes), without copying `text`.

    numpy compares a window at SIMD speed; `bytes.count` of one byte scans ~4x slower, and
    the upload counts four bytes over every line (most of its validation time before this).
    """
    if len(text) < _COUNT_WINDOW // 16:
        return sum(text.count(value) for value in values)
    codes = np.frombuffer(text, dtype=np.uint8)
    total = 0
    for start in range(0, len(codes), _COUNT_WINDOW):
        window = codes[start : start + _COUNT_WINDOW]
        for value in values:
            total += int(np.count_nonzero(window == value[0]))
    return total


def _structure(text: bytes | bytearray) -> int:
    return byte_count(text, b",", b"[", b"{")


def too_many_values(text: bytes | bytearray) -> bool:
    """Whether a line holds more than MAX_LINE_VALUES values, found without parsing it.

    Parsing builds an object per value (a 16 MiB line of 8M tiny values costs ~200 MiB in
    orjson alone); no request needs this many, so such a line is refused unparsed. Neither
    path copies the line: memory stays flat whatever the line holds.
    """
    if _structure(text) < MAX_LINE_VALUES:
        return False  # the count includes strings' contents, so it bounds the real one
    # Commas and openings outside strings, counted up to the limit at most.
    count = 0
    for match in _STRING_OR_STRUCTURE.finditer(text):
        if match.end() - match.start() == 1:
            count += 1
            if count >= MAX_LINE_VALUES:
                return True
    return False


def has_duplicate_keys(text: bytes | bytearray, obj: Any) -> bool:
    """Whether the JSON text of `obj` repeats a key in some object (orjson keeps the last)."""
    parsed = parsed_keys(obj)
    if byte_count(text, b":") == parsed:
        return False  # every colon is a key's, and every key survived parsing
    return _STRING.sub(b"", text).count(b":") != parsed


def parsed_keys(obj: Any) -> int:
    count, stack = 0, [obj]
    while stack:
        node = stack.pop()
        if type(node) is dict:
            count += len(node)
            stack.extend(v for v in node.values() if type(v) is dict or type(v) is list)
        elif type(node) is list:
            stack.extend(v for v in node if type(v) is dict or type(v) is list)
    return count


class _Duplicated(dict):  # type: ignore[type-arg]
    duplicate: str = ""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = _Duplicated(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                result.duplicate = key
                break
            seen.add(key)
    return result


def duplicate_key_field(text: bytes | bytearray) -> str:
    """The dotted path of the first duplicated key in a line ("" if it cannot be told)."""
    try:
        obj = json.loads(text, object_pairs_hook=_pairs)
    except (ValueError, RecursionError):
        return ""
    stack: list[tuple[Any, str]] = [(obj, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, _Duplicated):
            if node.duplicate:
                return field_path(path, node.duplicate)
            stack.extend((v, field_path(path, k)) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(node))))
    return ""
