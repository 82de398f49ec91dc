"""GPT-OSS's harmony format: a reply is a sequence of messages, each on a channel.

The prompt ends with `<|start|>assistant`; the reply goes on with the first message's header:

    <|channel|>analysis<|message|>User asks simple math. Answer 4.<|end|>
    <|start|>assistant<|channel|>final<|message|>2+2 equals 4.            (ended by <|return|>)

or, for a call (one per turn: `<|call|>` ends the turn after it),

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>
    {"city":"Paris"}                                                       (ended by <|call|>)

(no line breaks in the real text). The recipient may also stand in the role part of the header
(`<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>…`, as the
chat template renders earlier calls), and a call may go out on the analysis channel: both are
read. How each message is read back into OpenAI's message:

- `analysis` → `reasoning_content` (several analysis messages joined by a newline);
- `final` → `content`;
- `commentary` without a recipient (a "preamble", which the format means for the user) →
  `content`, like text written before a call in other dialects;
- a recipient `functions.NAME` (on any channel) → a tool call, its body the arguments; only when
  the request offers tools (`names`): otherwise the message is dropped, as its reply shows no
  calls. A recipient outside `functions` (the built-in `browser`/`python` tools, which Boardwalk
  does not offer) is dropped too.

Every harmony marker is a special token, kept in the decoded text (`markup`); `<|return|>` and
`<|call|>` end the turn (`turn_ends`) and are not in it. The format opens its reasoning itself:
a prompt never leaves the reply inside it (`opened` is always false).

The grammar leaves the analysis channel free and holds the answer: a final message to the
JSON schema, or one call to one of the functions with its arguments to that function's schema
(written `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}`, or with the
recipient in the role, as above). Under `tool_choice` auto the answer is a final message or a
call, and commentary preambles may come before it. Harmony makes one call per turn, so
`parallel_tool_calls` changes nothing: the grammar allows one call either way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inference.structured import (
    function_schema,
    json_rule,
    lark,
    response_schema,
    tool_choice_mode,
)

from .base import Dialect, Marks, Reply, ToolSyntax, compact
from .hermes import cut_name

START, CHANNEL, MESSAGE, END, CONSTRAIN = (
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|constrain|>",
)
MARKUP = (START, CHANNEL, MESSAGE, END, CONSTRAIN)
FUNCTIONS = "functions."

_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]*)")
_RECIPIENT = re.compile(r"\bto=([^\s<]*)")


@dataclass(frozen=True)
class _Message:
    """One message of a reply: its header read, its body so far."""

    at: int  # where it begins in the text (its <|start|>, or 0 for the first)
    channel: str | None
    recipient: str | None
    recipient_done: bool  # the recipient's name is followed by more of the header
    body: str | None  # None: cut inside the header
    closed: bool  # ended by <|end|> or by the next message

    @property
    def function(self) -> str | None:
        recipient = self.recipient
        if recipient is None:
            return None
        if recipient.startswith(FUNCTIONS):
            return recipient[len(FUNCTIONS) :]
        if self.body is None and not self.recipient_done and FUNCTIONS.startswith(recipient):
            return ""  # cut inside `functions.`: no name written yet
        return None

    @property
    def kind(self) -> str:
        """reasoning | content | call | other (a recipient outside `functions`)."""
        if self.recipient is not None:
            return "call" if self.function is not None else "other"
        if self.channel == "analysis":
            return "reasoning"
        return "content"  # final, a commentary preamble, or a message without a channel


def _messages(text: str) -> list[_Message]:
    """The messages of a reply's text (the first one without its `<|start|>assistant`)."""
    found: list[_Message] = []
    pieces = text.split(START)
    offset = 0  # where the piece begins
    for index, piece in enumerate(pieces):
        begins = offset - len(START) if index else 0  # at the message's <|start|>
        offset += len(piece) + len(START)
        if index == 0 and not piece.strip():
            continue  # a reply that begins with <|start|> (not as GPT-OSS writes)
        head, separator, rest = piece.partition(MESSAGE)
        last = index == len(pieces) - 1
        if not separator and index == 0 and _plain(head):
            # No header at all: text written without the format, read as content.
            text_body, ended, _ = head.partition(END)
            found.append(_Message(begins, None, None, False, text_body, bool(ended) or not last))
            continue
        channel = _CHANNEL.search(head)
        recipient = _RECIPIENT.search(head)
        body: str | None = None
        closed = not last
        if separator:
            body, ended, _ = rest.partition(END)
            closed = closed or bool(ended)
        found.append(
            _Message(
                at=begins,
                channel=channel.group(1) if channel else None,
                recipient=recipient.group(1) if recipient else None,
                recipient_done=recipient is not None and recipient.end() < len(head),
                body=body,
                closed=closed,
            )
        )
    return found


def _plain(head: str) -> bool:
    """Whether the start of a reply is text without a header (not one being written)."""
    stripped = head.lstrip()
    if not stripped or CHANNEL in head or _RECIPIENT.match(stripped):
        return False
    return not any(m.startswith(stripped) for m in (CHANNEL, "to=functions."))


def _call(message: _Message, names: Sequence[str]) -> tuple[str, str] | None:
    """(name, arguments) of a call message: complete arguments compact, cut ones as written so
    far; None while its name is not known."""
    name = message.function
    if name is None:
        return None
    if message.body is None and not message.recipient_done:
        return cut_name(name, names)  # the name may still be growing
    if not name:
        return None
    arguments = (message.body or "").lstrip()
    try:
        return name, compact(json.loads(arguments))
    except ValueError:
        return name, arguments  # cut by max_tokens (or not JSON): as written so far


class HarmonyCalls(ToolSyntax):
    """Calls as messages to a recipient `functions.NAME`, one per turn."""

    name = "harmony"
    trigger = CHANNEL + "commentary to=" + FUNCTIONS  # as the grammar writes a call's header
    markup = MARKUP

    def calls_rules(
        self, tools: list[dict[str, Any]], *, parallel: bool, marks: Marks
    ) -> list[str]:
        # One call per turn whatever `parallel` says: <|call|> ends the turn after it.
        channel, message, constrain = marks(CHANNEL), marks(MESSAGE), marks(CONSTRAIN)
        lines = [
            "calls: " + " | ".join(f"call_{i}" for i in range(len(tools))),
            f'content_type: (" "? {constrain} "json" | " json")?',
        ]
        for i, tool in enumerate(tools):
            recipient = json.dumps(" to=" + FUNCTIONS + tool["function"]["name"])
            in_channel = json.dumps("commentary to=" + FUNCTIONS + tool["function"]["name"])
            lines += [
                f"call_{i}: head_{i} {message} arguments_{i}",
                f"head_{i}: {channel} {in_channel} content_type"
                f' | {recipient} {channel} "commentary" content_type',
                f"arguments_{i}: {json_rule(function_schema(tool))}",
            ]
        return lines

    def read_calls(self, text: str, names: Sequence[str]) -> list[tuple[str, str]] | None:
        """The calls of `text`, which begins with a call message's header (either form, or
        after `<|start|>assistant`); None when some message of it is not a call."""
        calls = []
        for message in _messages(text):
            if message.kind != "call":
                return None
            call = _call(message, names)
            if call is not None:
                calls.append(call)
        return calls


@dataclass(frozen=True)
class Harmony(Dialect):
    """A dialect whose reply is channel messages rather than reasoning, then an answer."""

    @property
    def markup(self) -> tuple[str, ...]:
        return MARKUP

    @property
    def markers(self) -> tuple[str, ...]:
        return MARKUP

    def opened(self, prompt_tail: str) -> bool:
        return False  # every reply opens its first message's header itself

    def template_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Messages as the template reads them: reasoning under `thinking`. The template
        refuses an assistant call message with both content and thinking (it renders one of
        them as the analysis before the call): the reasoning is kept, the content (a preamble)
        dropped. A reasoning of None is left out (the template reads the field as text)."""
        renamed = []
        for message in messages:
            if "reasoning_content" in message:
                message = dict(message)
                reasoning = message.pop("reasoning_content")
                if reasoning:
                    message[self.reasoning_field] = reasoning
                    if message.get("tool_calls") and message.get("content"):
                        message["content"] = ""
            renamed.append(message)
        return super().template_messages(renamed)

    # -- grammars -------------------------------------------------------------------------

    def grammar(
        self,
        body: Mapping[str, Any],
        *,
        opened: bool = False,
        marks: Marks | None = None,
        closed: bool = False,
    ) -> str | None:
        """Free analysis messages, then the answer: a final message held to the schema, or a
        call (under `tool_choice` auto, either, with commentary preambles allowed before).
        `opened` and `closed` never hold: the reply writes its messages' headers itself."""
        marks = marks or Marks()
        schema = response_schema(body.get("response_format"))
        tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
        mode, named = tool_choice_mode(dict(body)) if tools else ("none", None)
        if mode == "function":
            tools = [t for t in tools if t["function"]["name"] == named]
        if mode == "none" or not tools:
            tools = []
        if not tools and schema is None:
            return None
        channel, message, end = marks(CHANNEL), marks(MESSAGE), marks(END)
        steps, answers = ["analysis"], []
        lines = [
            f'next: {marks(START)} "assistant"',
            f'analysis: {channel} "analysis" {message} TEXT {end}',
            "TEXT: /(.|\\n)*/",
        ]
        if not tools or mode == "auto":
            answers.append("final")
            held = "json_answer" if schema is not None else "TEXT"
            lines.append(f'final: {channel} "final" {message} {held}')
            if schema is not None:
                lines.append(f"json_answer: {json_rule(schema)}")
        if tools:
            answers.append("calls")
            if self.tools is None:
                raise ValueError(f"dialect {self.name} has no tool-call syntax")
            parallel = mode != "function" and body.get("parallel_tool_calls") is not False
            lines += self.tools.calls_rules(tools, parallel=parallel, marks=marks)
            if mode == "auto":
                steps.append("preamble")
                lines.append(f'preamble: {channel} "commentary" {message} TEXT {end}')
        head = [
            "start: (step next)* answer",
            "step: " + " | ".join(steps),
            "answer: " + " | ".join(answers),
        ]
        return lark(head + lines)

    # -- reading replies back -------------------------------------------------------------

    def read(self, text: str, *, names: Sequence[str] = (), opened: bool = False) -> Reply:
        """The messages of a reply as OpenAI's message (see the module's docstring). A reply
        cut inside its reasoning has content None; a call cut by `max_tokens` keeps its
        arguments so far."""
        reasoning: list[str] = []
        content: list[str] | None = None
        calls: list[tuple[str, str]] | None = [] if names else None
        answer_at: int | None = None
        for message in _messages(text):
            kind = message.kind
            if kind == "reasoning":
                if message.body is not None:
                    reasoning.append(message.body.strip())
                continue
            if kind == "content" and message.body is not None:
                content = (content or []) + [message.body.strip()]
            elif kind == "call" and calls is not None:
                call = _call(message, names)
                if call is None:
                    continue
                calls.append(call)
            else:
                continue
            answer_at = message.at if answer_at is None else answer_at
        thought = "\n".join(part for part in reasoning if part) or None
        if answer_at is None:
            at = len(text) if reasoning else 0
            return Reply(content=None, reasoning=thought, answer_at=at)
        said = "\n".join(part for part in content or [] if part)
        if calls:
            return Reply(content=said or None, reasoning=thought, calls=calls, answer_at=answer_at)
        return Reply(
            content=said if content is not None else None,
            reasoning=thought,
            calls=None,
            answer_at=answer_at,
        )

    def stream_view(
        self, text: str, *, opened: bool = False, calls: bool = True
    ) -> tuple[str, str]:
        """(reasoning, content) so far: bodies of messages whose header is complete, the last
        one less a tail that could still become markup, and trailing blanks held back."""
        shown: dict[str, list[str]] = {"reasoning": [], "content": []}
        for message in _messages(text):
            if message.body is None or message.kind not in shown:
                continue
            body = message.body if message.closed else _held_back(message.body)
            shown[message.kind].append(body.strip())
        reasoning, content = ("\n".join(p for p in shown[k] if p) for k in shown)
        return reasoning, content


def _held_back(body: str) -> str:
    """`body` less a tail that begins a marker ending it (markup written as text)."""
    for marker in (END, START):
        for k in range(min(len(marker) - 1, len(body)), 0, -1):
            if body.endswith(marker[:k]):
                return body[:-k]
    return body


HARMONY = Harmony(
    "harmony",
    "GPT-OSS",
    tools=HarmonyCalls(),
    efforts={effort: {"reasoning_effort": effort} for effort in ("low", "medium", "high")},
    turn_ends=("<|return|>", "<|call|>"),
    reasoning_field="thinking",
)
