"""A reply's text as it streams, split into reasoning and content deltas by its dialect."""

from __future__ import annotations

from .base import Dialect


class ReplyStream:
    """One choice of a streaming reply. `push` takes the next piece of its text (markup kept,
    as the engine decodes it) and gives the reasoning and content to send now: each is what
    the dialect can show beyond what was sent, so the deltas join into the reply's
    `reasoning_content` and `content` (tool-call markup never reaches either)."""

    def __init__(self, dialect: Dialect, *, opened: bool = False, calls: bool = True) -> None:
        self.dialect = dialect
        self.opened = opened
        self.calls = calls  # the request has tools: call markup may begin in the answer
        self.text = ""
        self.reasoning = ""  # sent so far
        self.content = ""

    def push(self, piece: str) -> tuple[str, str]:
        self.text += piece
        reasoning, content = self.dialect.stream_view(
            self.text, opened=self.opened, calls=self.calls
        )
        return self._delta(reasoning, "reasoning"), self._delta(content, "content")

    def _delta(self, shown: str, which: str) -> str:
        sent = getattr(self, which)
        if len(shown) <= len(sent) or not shown.startswith(sent):
            return ""  # nothing new, or a view that no longer extends what was sent
        setattr(self, which, shown)
        return shown[len(sent) :]
