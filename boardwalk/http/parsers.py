"""The JSON body parser for every API view: orjson, with the nesting depth bounded.

DRF's stdlib parser recurses once per nesting level, so a body of 100,000 nested arrays
raised RecursionError (a 500). orjson stops at 1,024 levels; no request here needs more than a
few, so anything deeper than MAX_JSON_DEPTH is refused with 400 before a serializer walks it.
Numbers are bounded too: orjson refuses integers beyond 64 bits that overflow a double.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_JSON_DEPTH = 32


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether `value` nests dicts/lists deeper than `limit` levels (iteratively: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


class BoundedJSONParser(JSONParser):
    def parse(
        self,
        stream: Any,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        raw = stream.read() if stream is not None else b""
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ParseError(str(exc).split(":", 1)[0] + ".") from None
        if json_depth_exceeds(data, MAX_JSON_DEPTH):
            raise ParseError(f"it nests objects or arrays deeper than {MAX_JSON_DEPTH} levels.")
        return data
