"""DeepSeek V3.1 tool calls: each call between two markers, all of them between two more.

    <｜tool▁calls▁begin｜>
    <｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"zone": "CET"}<｜tool▁call▁end｜>
    <｜tool▁calls▁end｜>

(on one line: nothing between the markers). Text before the calls is the answer's content, and
the turn ends after `<｜tool▁calls▁end｜>`. This is how V3.1's chat template writes an earlier
turn's calls, and so how the model writes them. (DeepSeek V3 and R1 wrote a type before the
separator and the arguments in a ```json fence after the name: not read here.)

The five markers are single tokens of DeepSeek's vocabulary (added tokens, not special ones,
so a decoder keeps them anyway); they are the syntax's markup, so that a grammar writes them as
those tokens. The grammar writes each call's arguments compactly, against the function's
`parameters`; reading accepts any JSON layout (and blanks between the markers) and
re-serialises the arguments compactly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from inference.structured import function_schema, json_rule

from .base import Marks, ToolSyntax, _without_partial, compact
from .hermes import cut_name

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
SEP = "<｜tool▁sep｜>"
CALL_END = "<｜tool▁call▁end｜>"
_MARKERS = (CALLS_BEGIN, CALL_BEGIN, SEP, CALL_END, CALLS_END)


class DeepSeekV3(ToolSyntax):
    name = "deepseek_v3"
    trigger = CALLS_BEGIN
    markup = _MARKERS
    text_before_calls = True  # the content, then the calls

    def calls_rules(
        self, tools: list[dict[str, Any]], *, parallel: bool, marks: Marks
    ) -> list[str]:
        lines = [
            f"calls: {marks(CALLS_BEGIN)} {'call+' if parallel else 'call'} {marks(CALLS_END)}",
            f"call: {marks(CALL_BEGIN)} call_body {marks(CALL_END)}",
            "call_body: " + " | ".join(f"call_{i}" for i in range(len(tools))),
        ]
        for i, tool in enumerate(tools):
            name = json.dumps(tool["function"]["name"], ensure_ascii=False)
            lines.append(f"call_{i}: {name} {marks(SEP)} arguments_{i}")
            lines.append(f"arguments_{i}: {json_rule(function_schema(tool))}")
        return lines

    def read_calls(self, text: str, names: Sequence[str]) -> list[tuple[str, str]] | None:
        if len(text) <= len(CALLS_BEGIN) and CALLS_BEGIN.startswith(text):
            return _with(cut_name("", names), [])  # cut inside the first marker
        if not text.startswith(CALLS_BEGIN):
            return None
        calls: list[tuple[str, str]] = []
        rest = text[len(CALLS_BEGIN) :]
        while True:
            rest = rest.lstrip()
            if not rest:
                return calls  # cut between calls (or the turn ended without the last marker)
            if rest.startswith(CALLS_END):
                return calls if not rest[len(CALLS_END) :].strip() else None
            if _is_cut_marker(rest):
                return _with(cut_name("", names), calls) if CALL_BEGIN.startswith(rest) else calls
            if not rest.startswith(CALL_BEGIN):
                return None
            rest = rest[len(CALL_BEGIN) :]
            name, sep, after = rest.partition(SEP)
            if not sep:  # cut inside the name (or inside the separator, written as text)
                written = _without_partial(name, SEP)
                if any(m in written for m in _MARKERS) or "\n" in written.strip():
                    return None
                return _with(cut_name(written.strip(), names), calls)
            arguments, end, rest = after.partition(CALL_END)
            if not end:  # cut inside the arguments: what is written so far
                return [*calls, (name.strip(), _without_partial(arguments, CALL_END).lstrip())]
            read = _arguments(arguments)
            if read is None:
                return None
            calls.append((name.strip(), read))


def _arguments(written: str) -> str | None:
    """A complete call's arguments, compact; None when they are not JSON."""
    try:
        value = json.loads(written)
    except ValueError:
        return None
    return value if isinstance(value, str) else compact(value)


def _with(cut: tuple[str, str] | None, calls: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [*calls, cut] if cut is not None else calls


def _is_cut_marker(text: str) -> bool:
    """Whether `text` is all of it the beginning of a marker (cut inside it)."""
    return any(len(text) < len(m) and m.startswith(text) for m in (CALL_BEGIN, CALLS_END))
