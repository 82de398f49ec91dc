"""What the generation engine honours, in one place.

The upload validator (files/validation) and the engine (inference/engine) both read this:
a Chat Completions field the engine cannot honour is an upload error naming the field
(docs/API.md "Input rules the engine imposes"), never silently ignored.
"""

from __future__ import annotations

# Every top-level field of the Chat Completions request reference.
REFERENCE_FIELDS = frozenset(
    {
        "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
        "max_completion_tokens", "max_tokens", "messages", "metadata", "modalities", "model",
        "n", "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key",
        "reasoning_effort", "response_format", "safety_identifier", "seed", "service_tier",
        "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
        "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
    }
)  # fmt: skip

# Fields the engine honours (sampling, stopping, constrained decoding, log probabilities) or
# that carry no behaviour (user, metadata, store: accepted, nothing stored). `tools` and
# `reasoning_effort` also need a revision whose dialect takes them (inference/dialects).
HONOURED_FIELDS = frozenset(
    {
        "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
        "n", "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "user",
        "metadata", "store", "stream", "logprobs", "top_logprobs", "response_format", "tools",
        "tool_choice", "parallel_tool_calls", "reasoning_effort",
    }
)  # fmt: skip

# Honoured only with these values (anything else is "unsupported_parameter").
NEUTRAL_ONLY = {
    "stream": (False, None),
}
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
TOOL_CHOICES = ("none", "auto", "required")

MAX_TOP_LOGPROBS = 20
MAX_TOOLS = 128

MAX_N = 8
MAX_STOP_SEQUENCES = 4
ROLES = ("system", "developer", "user", "assistant", "tool")
