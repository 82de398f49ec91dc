"""Model dialects: how each model family writes its reasoning, its tool calls and the end of
its turn, read back into OpenAI's message (docs/API.md "Model dialects").

A revision's dialect is chosen when it is created, from its chat template
(`detect`), recorded on it (`ModelRevision.dialect`) and shown by `manage.py model inspect`;
`--dialect` overrides it. One module per syntax; this module is the registry. Plain Python and
llguidance: the web process (upload checks, streaming) and the workers both use it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from inference.structured import GrammarError, validate

from .base import EFFORTS, Dialect, Marks, Reply, Thinking, ToolSyntax, call_id
from .deepseek import DeepSeekV3
from .harmony import HARMONY
from .hermes import Hermes
from .llama3 import Llama3Dialect, Llama3Json
from .mistral import MistralCalls, MistralDialect, MistralV11Calls
from .qwen3_coder import Qwen3CoderXml

__all__ = [
    "DIALECTS",
    "EFFORTS",
    "Dialect",
    "GrammarError",
    "Marks",
    "Reply",
    "ToolSyntax",
    "call_id",
    "check_grammar",
    "detect",
    "dialect_named",
]

# A switch between thinking and answering straight away: reasoning_effort "none" and
# "minimal" answer straight away, any other value thinks (docs/API.md).
_NO_THINKING = ("none", "minimal")


def _switch(variable: str) -> dict[str, dict[str, Any]]:
    return {effort: {variable: effort not in _NO_THINKING} for effort in EFFORTS}


PLAIN = Dialect(
    "plain",
    "Gemma 3, Phi-3.5 and any template without tool calls or reasoning",
    developer_role="system",
)
# ChatML turns end with <|im_end|>: a reply stops there wherever it is one token, whichever
# end-of-sequence ids the release names.
_IM_END = ("<|im_end|>",)
HERMES = Dialect(
    "hermes",
    "Hermes 2 Pro and 3, Qwen2.5",
    tools=Hermes(),
    turn_ends=_IM_END,
    developer_role="system",
)
QWEN3 = Dialect(
    "qwen3",
    "Qwen3 (thinking on or off)",
    tools=Hermes(),
    thinking=Thinking(),
    efforts=_switch("enable_thinking"),
    turn_ends=_IM_END,
    developer_role="system",
)
# llama.cpp's copy of QwQ's template closes the reasoning at once unless enable_thinking is
# set (the release's template ignores it and always opens it).
QWQ = Dialect(
    "qwq",
    "QwQ (always thinks)",
    tools=Hermes(),
    thinking=Thinking(),
    variables={"enable_thinking": True},
    turn_ends=_IM_END,
    developer_role="system",
)
# DeepSeek's templates know no developer role (they drop such a message); they gather every
# system message at the prompt's start. llama.cpp's copy of the Qwen distill's template closes
# the reasoning at once unless enable_thinking is set (the release's template always opens it;
# the Llama distill's ignores the variable).
DEEPSEEK_R1 = Dialect(
    "deepseek_r1",
    "DeepSeek-R1 and its Qwen and Llama distills (always think)",
    thinking=Thinking(),
    variables={"enable_thinking": True},
    developer_role="system",
)
DEEPSEEK_V3 = Dialect(
    "deepseek_v3",
    "DeepSeek V3.1 (thinking on or off)",
    tools=DeepSeekV3(),
    thinking=Thinking(),
    efforts=_switch("thinking"),
    developer_role="system",
)
QWEN3_CODER = Dialect(
    "qwen3_coder",
    "Qwen3-Coder",
    tools=Qwen3CoderXml(),
    turn_ends=_IM_END,
    developer_role="system",
)
LLAMA3 = Llama3Dialect(
    "llama3_json",
    "Llama 3.1, 3.2 and 3.3",
    tools=Llama3Json(),
    turn_ends=("<|eot_id|>", "<|eom_id|>"),
    developer_role="system",
)
MISTRAL = MistralDialect("mistral", "Mistral Nemo", tools=MistralCalls(), developer_role="system")
MISTRAL_V11 = MistralDialect(
    "mistral_v11", "Mistral Small 3.2", tools=MistralV11Calls(), developer_role="system"
)

DIALECTS: Mapping[str, Dialect] = {
    d.name: d
    for d in (
        HERMES,
        QWEN3,
        QWQ,
        QWEN3_CODER,
        LLAMA3,
        HARMONY,
        DEEPSEEK_V3,
        DEEPSEEK_R1,
        MISTRAL,
        MISTRAL_V11,
        PLAIN,
    )
}


def dialect_named(name: str) -> Dialect:
    """The dialect recorded on a revision (KeyError for a name no release knows)."""
    return DIALECTS[name]


def detect(chat_template: str) -> Dialect:
    """The dialect a chat template speaks, from the markup it renders; PLAIN when it renders
    neither tool calls nor reasoning in a syntax a dialect knows (then `tools` and
    `reasoning_effort` are refused for it, and its replies are plain text)."""
    t = chat_template
    if "<|channel|>" in t and "<|message|>" in t:
        return HARMONY
    if "DSML" in t:  # DeepSeek V3.2 and later: a syntax of their own, not read here
        return PLAIN
    if "<｜tool▁call▁begin｜>" in t and re.search(r"\bthinking\b", t):
        return DEEPSEEK_V3
    if "<｜Assistant｜><think>\\n" in t:  # the reply always begins inside the reasoning
        return DEEPSEEK_R1
    if "<tool_call>" in t and "<function=" in t:
        return QWEN3_CODER
    if "[TOOL_CALLS]" in t:  # a call per [TOOL_CALLS] with [ARGS] (v11), or a JSON list
        return MISTRAL_V11 if "[ARGS]" in t else MISTRAL
    if re.search(r'<tool_call>.{0,20}?\{"name"', t, re.DOTALL):
        if "<think>" in t and "assistant\\n<think>\\n" in t:
            return QWQ
        if "<think>" in t and "enable_thinking" in t:
            return QWEN3
        return HERMES
    if "<|python_tag|>" in t or ("<|eot_id|>" in t and "tools" in t and "parameters" in t):
        return LLAMA3
    return PLAIN


def check_grammar(body: dict[str, Any], dialect: Dialect) -> None:
    """Raise GrammarError unless the body's grammar compiles in `dialect` (a no-op for
    free-text bodies)."""
    try:
        grammar = dialect.grammar(body)
    except RecursionError:
        raise GrammarError(
            "the schema nests deeper than structured outputs support", unsupported=True
        ) from None
    if grammar is not None:
        validate(grammar)
