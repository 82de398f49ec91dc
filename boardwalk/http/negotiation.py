"""Content negotiation that never answers 406.

The OpenAI SDK sends `Accept: application/binary` for file content (docs/API.md "Files"); every
endpoint here has exactly one representation, so the first renderer always wins.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer


class LenientContentNegotiation(BaseContentNegotiation):
    def select_parser(self, request: Any, parsers: Iterable[BaseParser]) -> BaseParser | None:
        content_type = request.content_type or ""
        for parser in parsers:
            if content_type.split(";")[0].strip() == parser.media_type:
                return parser
        return None

    def select_renderer(
        self, request: Any, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type
