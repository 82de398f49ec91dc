"""Content negotiation that never answers 406.

The OpenAI SDK sends `Accept: application/binary` for file content (SPEC §10a); every
endpoint here has exactly one representation, so the first renderer always wins.
"""

from __future__ import annotations

from typing import Any

from rest_framework.negotiation import BaseContentNegotiation


class LenientContentNegotiation(BaseContentNegotiation):
    def select_parser(self, request: Any, parsers: list[Any]) -> Any:
        content_type = request.content_type or ""
        for parser in parsers:
            if content_type.split(";")[0].strip() == parser.media_type:
                return parser
        return None

    def select_renderer(
        self, request: Any, renderers: list[Any], format_suffix: str | None = None
    ) -> tuple[Any, str]:
        renderer = renderers[0]
        return renderer, renderer.media_type
