"""What every dialect shares: the reply read back, the grammar around the answer, the knobs.

A dialect is a tool-call syntax (or none) and a way of reasoning (or none), with the template
variables that carry `reasoning_effort`. `Dialect` implements the families that write their
reasoning between two markers before the answer (`<think>` … `</think>`) and their calls after
it; a family that writes its reply otherwise (GPT-OSS's channels) subclasses it.

The text a dialect reads is the engine's output decoded with the dialect's markup tokens kept
(inference/engine/decoding.py), and without the token that ended the turn.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inference.structured import json_rule, lark, response_schema, tool_choice_mode

# reasoning_effort values of the reference (Chat Completions), in increasing effort.
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


@dataclass(frozen=True)
class Reply:
    """A reply read back: the answer, the reasoning before it, the calls it made."""

    content: str | None
    reasoning: str | None = None
    calls: list[tuple[str, str]] | None = None  # (name, arguments as JSON text); None: no calls
    # Where the answer begins in the text read (after the reasoning and its markup): the
    # tokens before it are reasoning tokens.
    answer_at: int = 0


class Marks:
    """How a grammar writes a marker: as the single token it is in the revision's vocabulary
    (`<name>` in llguidance's Lark, which also makes it the only way to write it; `<[id]>` for
    a token whose name is not of that form, such as Mistral's `[TOOL_CALLS]`, given its id in
    `ids`), or as text where the vocabulary has no such token (and at upload, where no
    vocabulary is loaded)."""

    def __init__(
        self, single_tokens: frozenset[str] = frozenset(), ids: Mapping[str, int] | None = None
    ) -> None:
        self.single_tokens = single_tokens
        self.ids = dict(ids or {})

    @classmethod
    def in_vocabulary(cls, vocab: Mapping[str, int], markers: Iterable[str]) -> Marks:
        """The markers that are single tokens of `vocab`, with their ids."""
        present = {marker: int(vocab[marker]) for marker in markers if marker in vocab}
        return cls(frozenset(present), ids=present)

    def __call__(self, marker: str) -> str:
        if marker in self.single_tokens:
            if marker.startswith("<") and marker.endswith(">"):
                return marker
            if marker in self.ids:
                return f"<[{self.ids[marker]}]>"
        return json.dumps(marker)


class ToolSyntax:
    """How a family writes its tool calls. Subclasses define the grammar of the calls (a Lark
    rule named `calls`) and read them back."""

    name = ""
    trigger = ""  # the text every reply that calls a tool begins its calls with
    markup: tuple[str, ...] = ()  # special tokens of the syntax, kept in the decoded text
    # Whether the family may write text before its calls (the content, then the calls): the
    # grammar under tool_choice auto then lets text that does not write `trigger` precede them
    # (`Dialect.lead_rule`); else the answer is either text or calls.
    text_before_calls = False

    def calls_rules(
        self, tools: list[dict[str, Any]], *, parallel: bool, marks: Marks
    ) -> list[str]:
        raise NotImplementedError

    def read_calls(self, text: str, names: Sequence[str]) -> list[tuple[str, str]] | None:
        """The calls of `text` (which begins with `trigger`, and may be cut anywhere by
        `max_tokens`): complete calls whole, a cut call with its arguments so far (once its name
        is known); None when `text` is not calls in this syntax."""
        raise NotImplementedError


@dataclass(frozen=True)
class Thinking:
    """Reasoning written between two markers before the answer."""

    open: str = "<think>"
    close: str = "</think>"


@dataclass(frozen=True)
class Dialect:
    name: str
    families: str  # who speaks it, for people (docs/API.md, `model inspect`)
    tools: ToolSyntax | None = None
    thinking: Thinking | None = None
    # reasoning_effort → the template variables that carry it; empty: the field is refused.
    efforts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    turn_ends: tuple[str, ...] = ()  # tokens that end a reply, beside the model's EOS ids
    # The message field the template reads an earlier turn's reasoning from.
    reasoning_field: str = "reasoning_content"
    # The role a `developer` message reaches the template under: "system" where the template
    # knows no developer role (ChatML, Gemma and Phi templates drop such a message, or refuse it).
    developer_role: str = "developer"
    # Template variables of every prompt, beside those of `reasoning_effort` (which win).
    variables: Mapping[str, Any] = field(default_factory=dict)

    # -- prompts --------------------------------------------------------------------------

    @property
    def markup(self) -> tuple[str, ...]:
        """Tokens kept in the decoded text: the call syntax's, and the reasoning markers (a
        tokenizer that marks `<think>` special would otherwise drop them, and the reasoning
        would read back as the answer)."""
        found = self.tools.markup if self.tools is not None else ()
        if self.thinking is not None:
            found += (self.thinking.open, self.thinking.close)
        return tuple(dict.fromkeys(found))

    @property
    def markers(self) -> tuple[str, ...]:
        """Every marker the dialect's grammars write (a vocabulary's single tokens among them
        are written as tokens)."""
        found = list(self.markup)
        if self.thinking is not None:
            found += [self.thinking.open, self.thinking.close]
        if self.tools is not None and self.tools.trigger:
            found.append(self.tools.trigger.strip())
        return tuple(dict.fromkeys(found))

    def template_options(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The template variables of a body's prompt: the dialect's own, and those its
        `reasoning_effort` sets (validated at upload)."""
        options = dict(self.variables)
        effort = body.get("reasoning_effort")
        if effort is not None:
            options.update(self.efforts.get(effort, {}))
        return options

    def template_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Messages as the template reads them: an earlier turn's `reasoning_content` under
        the field the template reads, a `developer` message under `developer_role`."""
        if self.reasoning_field == "reasoning_content" and self.developer_role == "developer":
            return messages
        renamed = []
        for message in messages:
            if "reasoning_content" in message and self.reasoning_field != "reasoning_content":
                message = dict(message)
                message[self.reasoning_field] = message.pop("reasoning_content")
            if message.get("role") == "developer":
                message = {**message, "role": self.developer_role}
            renamed.append(message)
        return renamed

    def closed(self, prompt_tail: str) -> bool:
        """Whether the prompt (ending with `prompt_tail`) already closed an empty reasoning, so
        the reply is the answer alone (Qwen3 and DeepSeek V3.1 with thinking off)."""
        return self.thinking is not None and prompt_tail.rstrip().endswith(self.thinking.close)

    def opened(self, prompt_tail: str) -> bool:
        """Whether the prompt (ending with `prompt_tail`) already opened the reasoning, so the
        reply begins inside it (R1 distills always; Qwen3 and DeepSeek V3.1 never do)."""
        return self.thinking is not None and prompt_tail.rstrip().endswith(self.thinking.open)

    # -- grammars -------------------------------------------------------------------------

    def grammar(
        self,
        body: Mapping[str, Any],
        *,
        opened: bool = False,
        marks: Marks | None = None,
        closed: bool = False,
    ) -> str | None:
        """The llguidance grammar of a body's reply; None when it is free text. Reasoning is
        free; the answer after it is held to the schema or the tool calls. `closed`: the
        prompt closed the reasoning, so the reply is the answer alone."""
        marks = marks or Marks()
        answer = self.answer_rules(body, marks=marks)
        if answer is None:
            return None
        if closed:
            return lark(["start: answer", *answer])
        return lark(self.reasoning_rules(opened=opened, marks=marks) + answer)

    def reasoning_rules(self, *, opened: bool, marks: Marks) -> list[str]:
        if self.thinking is None:
            return ["start: answer"]
        close = marks(self.thinking.close)
        # The blanks between the reasoning and the answer are bounded (the templates write
        # "\n\n"): unbounded, a model that favours a blank token could write them until
        # max_tokens and never reach the answer the grammar holds it to.
        lines = [f"thought: THOUGHT {close} /\\s{{0,8}}/", "THOUGHT: /(.|\\n)*/"]
        if opened:
            return ["start: thought answer", *lines]
        return [f"start: ({marks(self.thinking.open)} thought)? answer", *lines]

    def answer_rules(self, body: Mapping[str, Any], *, marks: Marks) -> list[str] | None:
        """Rules defining `answer`; None when the answer is free text."""
        schema = response_schema(body.get("response_format"))
        tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
        mode, named = tool_choice_mode(dict(body)) if tools else ("none", None)
        if mode == "function":
            tools = [t for t in tools if t["function"]["name"] == named]
        if mode == "none" or not tools:
            return None if schema is None else [f"answer: {json_rule(schema)}"]
        if self.tools is None:
            raise ValueError(f"dialect {self.name} has no tool-call syntax")
        parallel = mode != "function" and body.get("parallel_tool_calls") is not False
        lines = self.tools.calls_rules(tools, parallel=parallel, marks=marks)
        if mode in ("required", "function"):
            return ["answer: calls", *lines]
        if schema is not None:
            return ["answer: json_answer | calls", f"json_answer: {json_rule(schema)}", *lines]
        if self.tools.text_before_calls:
            return [
                "answer: TEXT | lead calls",
                self.lead_rule(marks),
                self.free_text_rule(),
                *lines,
            ]
        return ["answer: TEXT | calls", self.free_text_rule(), *lines]

    def lead_rule(self, marks: Marks) -> str:
        """The text before the calls. Where the trigger is a token, text can never write it;
        where it is text, a lazy lexeme ends at its first occurrence (llguidance's lexer does not
        backtrack, so a greedy one would have eaten the trigger's first bytes), and the calls
        write it again."""
        trigger = marks(self.tools.trigger.strip()) if self.tools is not None else ""
        if trigger.startswith('"'):
            return f"lead[stop={trigger}]: /(.|\\n)*/"
        return "lead: TEXT"

    def free_text_rule(self) -> str:
        """Free text under tool_choice auto: text that never writes the trigger where text may
        precede the calls, else text that does not begin like the calls."""
        if self.tools is not None and self.tools.text_before_calls and self.tools.trigger:
            holding = "(.|\\n)*" + _regex_escape(self.tools.trigger) + "(.|\\n)*"
            return f"TEXT: /(.|\\n)*/ & ~/{holding}/"
        first = self.tools.trigger[:1] if self.tools is not None else ""
        if not first or first == "{":
            return "TEXT: /([^{](.|\\n)*)?/"
        return "TEXT: /([^" + _class_escape(first) + "](.|\\n)*)?/"

    # -- reading replies back -------------------------------------------------------------

    def read(self, text: str, *, names: Sequence[str] = (), opened: bool = False) -> Reply:
        """A reply's text as OpenAI's message: reasoning, then content or tool calls."""
        reasoning, answer, at = self.split_reasoning(text, opened=opened)
        if answer is None:
            return Reply(content=None, reasoning=reasoning, answer_at=len(text))
        calls = None
        content: str | None = answer
        if self.tools is not None and names:
            content, calls = self.read_answer(answer, names)
        return Reply(content=content, reasoning=reasoning, calls=calls, answer_at=at)

    def split_reasoning(self, text: str, *, opened: bool) -> tuple[str | None, str | None, int]:
        """(reasoning, answer, where the answer begins); answer None: cut inside reasoning."""
        thinking = self.thinking
        if thinking is None:
            return None, text, 0
        start = 0
        if not opened:
            stripped = text.lstrip()
            if not stripped.startswith(thinking.open):
                return None, text, 0
            start = len(text) - len(stripped) + len(thinking.open)
        end = text.find(thinking.close, start)
        if end < 0:
            return text[start:].strip() or None, None, len(text)
        reasoning = text[start:end].strip()
        after = end + len(thinking.close)
        answer = text[after:]
        at = after + len(answer) - len(answer.lstrip())
        return reasoning or None, answer.lstrip(), at

    def read_answer(
        self, answer: str, names: Sequence[str]
    ) -> tuple[str | None, list[tuple[str, str]] | None]:
        """(content, calls) of an answer: text before the calls is content."""
        if self.tools is None:
            return answer, None
        at = _trigger_at(answer, self.tools.trigger)
        if at is None:
            return answer, None
        calls = self.tools.read_calls(answer[at:], names)
        if calls is None:
            return answer, None
        before = answer[:at].strip()
        return before or None, calls

    def stream_view(
        self, text: str, *, opened: bool = False, calls: bool = True
    ) -> tuple[str, str]:
        """(reasoning, content) that can be sent so far of a reply that goes on: markup, any
        tail that could still become markup, and blanks `read` could strip held back, so that
        each view extends the one before and ends as `read` will. `calls`: the request has
        tools, so tool-call markup may begin in the answer (without tools `read` reads none,
        and the answer streams as it comes, trailing blanks included)."""
        thinking = self.thinking
        if thinking is not None and not opened and thinking.open.startswith(text.lstrip()):
            return "", ""  # the open marker may still be coming
        reasoning, answer, _ = self.split_reasoning(text, opened=opened)
        if answer is None:  # inside the reasoning
            close = thinking.close if thinking is not None else ""
            return _without_partial(reasoning or "", close).rstrip(), ""
        content = answer
        if self.tools is None or not calls:
            return reasoning or "", content
        at = _trigger_at(content, self.tools.trigger)
        content = content[:at] if at is not None else content
        content = _without_partial(content, self.tools.trigger)
        # Trailing blanks wait for what follows: `read` strips those before a call, and the
        # stream's closing chunk sends any the reply ends with.
        return reasoning or "", content.rstrip()


def call_id(seed: str, index: int) -> str:
    return "call_" + hashlib.sha256(f"{seed}:{index}".encode()).hexdigest()[:24]


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _trigger_at(text: str, trigger: str) -> int | None:
    """Where the calls begin in an answer: at the trigger, or at the answer's start when all of
    it is the beginning of the trigger (a call cut inside its first marker)."""
    at = text.find(trigger)
    if at >= 0:
        return at
    stripped = text.strip()
    if stripped and trigger.startswith(stripped):
        return text.find(stripped)
    return None


def _without_partial(text: str, marker: str) -> str:
    """`text` less a tail that begins `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return text[:-k]
    return text


def _regex_escape(text: str) -> str:
    """`text` as a literal of an llguidance regex (which reads `\\<` and `\\>` as word
    boundaries, so those stay as they are)."""
    escaped = []
    for char in text:
        if char == "\n":
            escaped.append("\\n")
        elif char.isascii() and not char.isalnum() and char not in "<>_":
            escaped.append("\\" + char)
        else:
            escaped.append(char)
    return "".join(escaped)


def _class_escape(char: str) -> str:
    return "\\" + char if char in "\\]^-[/" else char
