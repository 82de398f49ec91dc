"""Per-line rules of docs/API.md "Standard input lines" for one parsed request object.

Each check adds `(field, code, message)` problems; the validator adds the line number. A message
says what to change and never quotes a value from the line: prompts, images and even custom ids are
content (docs/API.md "Limits, retention and privacy"). Field names are shown only when they look
like field names.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.conf import settings

from boardwalk.codes import LineCode
from boardwalk.outbound import OutboundRefused, allowed_targets, parse_target
from inference.capabilities import (
    HONOURED_FIELDS,
    MAX_N,
    MAX_STOP_SEQUENCES,
    MAX_TOOLS,
    MAX_TOP_LOGPROBS,
    NEUTRAL_ONLY,
    REFERENCE_FIELDS,
    RESPONSE_FORMATS,
    ROLES,
    TOOL_CHOICES,
)
from inference.dialects import DIALECTS, EFFORTS, Dialect, GrammarError, check_grammar

from .report import ModelTarget

Problem = tuple[str, str, str]  # field, code, message


class Problems(list[Problem]):
    """The problems of one line: the first `keep` of them, and how many there were.

    A line can hold millions of invalid values; only the first problems the report will show
    are kept, the rest are counted, so memory does not grow with the number of problems.
    """

    def __init__(self, keep: int = 100) -> None:
        super().__init__()
        self.keep = keep
        self.total = 0

    def add(self, field: str, code: str, message: str) -> None:
        self.total += 1
        if len(self) < self.keep:
            self.append((field, code, message))


TOP_LEVEL_KEYS = ("custom_id", "method", "url", "body")
METHOD = "POST"
URL = "/v1/chat/completions"
MAX_CUSTOM_ID_BYTES = 128
MAX_METADATA_KEYS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
IMAGE_DETAILS = ("auto", "low", "high")
AUDIO_FORMATS = ("wav", "mp3")
PART_TYPES = ("text", "image_url", "input_audio")

# Body fields with rules of their own below; every other field goes through the parameter table.
_BODY_OWN_RULES = frozenset({"model", "messages", "max_tokens", "max_completion_tokens"})
_MAX_TOKENS_KEYS = ("max_tokens", "max_completion_tokens")
_ROLE_LIST = ", ".join(ROLES)

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}")
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_\-]{1,64}")
_TOKEN_ID = re.compile(r"[0-9]{1,10}")
_DATA_IMAGE_PREFIX = re.compile(r"data:image/[A-Za-z0-9.+\-]{1,64};base64,", re.IGNORECASE)
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/]*")
_BASE64_END = re.compile(r"[A-Za-z0-9+/]*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})")
# How much of each end of inline media is matched character by character (see _is_base64).
_BASE64_PROBE = 4096


def field_path(prefix: str, key: object) -> str:
    """`prefix.key`, with a placeholder for a key that is not a plain name (it may be content)."""
    name = key if isinstance(key, str) and _PLAIN_KEY.fullmatch(key) else "<field>"
    return f"{prefix}.{name}" if prefix else name


def _is_int(value: object) -> bool:
    return type(value) is int  # JSON true/false arrive as bool, which is not a count


def _is_number(value: object) -> bool:
    return type(value) is int or type(value) is float


def same(value: object, allowed: object) -> bool:
    # `0 == False` in Python; a neutral value must match in type as well.
    return type(value) is type(allowed) and value == allowed


def _is_base64(text: str, start: int = 0) -> bool:
    """Whether `text[start:]` has the shape of padded base64.

    Decoding megabytes here would cost more than parsing the line; the worker decodes when the
    row runs and fails that row with `invalid_media`. So: ASCII throughout (free for a str), a
    length in quads, and both ends matched exactly.
    """
    size = len(text) - start
    if size <= 0 or size % 4 or not text.isascii():
        return False
    end = len(text)
    if not _BASE64_RUN.fullmatch(text, start, max(start, min(start + _BASE64_PROBE, end - 4))):
        return False
    return _BASE64_END.fullmatch(text, max(start, end - _BASE64_PROBE // 4 * 4), end) is not None


# -- the envelope -----------------------------------------------------------------------------


def check_envelope(obj: dict[str, Any], problems: Problems) -> tuple[str | None, dict | None]:
    """Top-level keys, method, url and the shape of custom_id; returns (custom_id, body)."""
    for key in TOP_LEVEL_KEYS:
        if key not in obj:
            problems.add(
                key,
                LineCode.MISSING_FIELD,
                f"add {key}; every line needs custom_id, method, url and body",
            )
    for key in obj:
        if key not in TOP_LEVEL_KEYS:
            field = field_path("", key)
            problems.add(
                field,
                LineCode.UNKNOWN_FIELD,
                f"remove the top-level field {field}; a line holds only custom_id, method, "
                "url and body",
            )

    custom_id = check_custom_id(obj, problems) if "custom_id" in obj else None

    if "method" in obj and not same(obj["method"], METHOD):
        problems.add("method", LineCode.INVALID_METHOD, f'method must be "{METHOD}"')
    if "url" in obj and not same(obj["url"], URL):
        problems.add("url", LineCode.INVALID_URL, f'url must be "{URL}"')

    body = obj.get("body")
    if "body" in obj and type(body) is not dict:
        problems.add("body", LineCode.INVALID_BODY, "body must be a JSON object")
        body = None
    return custom_id, body


def check_custom_id(obj: dict[str, Any], problems: Problems) -> str | None:
    """The shape of `obj["custom_id"]`; uniqueness is the caller's."""
    value = obj["custom_id"]
    if not isinstance(value, str) or not value:
        problems.add(
            "custom_id", LineCode.INVALID_CUSTOM_ID, "custom_id must be a non-empty string"
        )
        return None
    if (size := len(value.encode())) > MAX_CUSTOM_ID_BYTES:
        problems.add(
            "custom_id",
            LineCode.INVALID_CUSTOM_ID,
            f"custom_id is {size} bytes in UTF-8; shorten it to at most {MAX_CUSTOM_ID_BYTES}",
        )
        return None
    return value


def check_model(body: dict[str, Any], problems: Problems) -> str | None:
    """The shape of body.model; consistency across lines and resolution are the caller's."""
    if "model" not in body:
        problems.add("body.model", LineCode.MISSING_FIELD, "add body.model, the name of the model")
        return None
    model = body["model"]
    if not isinstance(model, str) or not model:
        problems.add("body.model", LineCode.INVALID_MODEL, "body.model must be a non-empty string")
        return None
    return model


# -- the body ---------------------------------------------------------------------------------


def check_body(
    body: dict[str, Any], target: ModelTarget | None, problems: Problems
) -> tuple[int, int] | None:
    """Everything in body but the model; returns (max_tokens, n) when those two are valid.

    `target` is None when the model is unknown; the rules that need it are then skipped.
    """
    _check_messages(body, target, problems)
    max_tokens = _check_max_tokens(body, target, problems)
    n_ok = True
    for key, value in body.items():
        if key in _BODY_OWN_RULES:
            continue
        field = field_path("body", key)
        problem = _check_parameter(key, value, field)
        if problem is not None:
            problems.add(field, *problem)
            n_ok = n_ok and key != "n"
    _check_structured(body, target, {field for field, _, _ in problems}, problems)
    n = body.get("n")
    if n is None:
        n = 1
    if max_tokens is None or not n_ok:
        return None
    return max_tokens, n


def _check_parameter(key: str, value: Any, field: str) -> tuple[str, str] | None:
    if key not in REFERENCE_FIELDS:
        return LineCode.UNKNOWN_PARAMETER, f"{field} is not a Chat Completions parameter; remove it"
    if key not in HONOURED_FIELDS:
        return LineCode.UNSUPPORTED_PARAMETER, f"{field} is not supported by this engine; remove it"
    if key in NEUTRAL_ONLY:
        allowed = NEUTRAL_ONLY[key]
        if any(same(value, neutral) for neutral in allowed):
            return None
        shown = " or ".join("null" if a is None else str(a).lower() for a in allowed)
        return (
            LineCode.UNSUPPORTED_PARAMETER,
            f"{field} is supported by this engine only as {shown}; remove it",
        )
    if value is None:  # the reference's optional parameters are nullable: null means unset
        return None
    check = PARAMETER_CHECKS.get(key)
    return check(value, field) if check is not None else None


def _check_max_tokens(
    body: dict[str, Any], target: ModelTarget | None, problems: Problems
) -> int | None:
    values: dict[str, int] = {}
    valid = True
    for key in _MAX_TOKENS_KEYS:
        value = body.get(key)
        if value is None:
            continue
        field = f"body.{key}"
        if not _is_int(value) or value <= 0:
            problems.add(field, LineCode.INVALID_MAX_TOKENS, f"{field} must be a positive integer")
            valid = False
        elif target is not None and value > target.context_length:
            problems.add(
                field,
                LineCode.MAX_TOKENS_EXCEEDS_CONTEXT,
                f"{field} must be at most {target.context_length}, the model's context length",
            )
            valid = False
        else:
            values[key] = value
    if not valid:
        return None
    if not values:
        problems.add(
            "body.max_completion_tokens",
            LineCode.MISSING_MAX_TOKENS,
            "add body.max_completion_tokens (or body.max_tokens): the most tokens to generate",
        )
        return None
    if len(values) == 2 and values["max_tokens"] != values["max_completion_tokens"]:
        problems.add(
            "body.max_tokens",
            LineCode.CONFLICTING_MAX_TOKENS,
            "body.max_tokens and body.max_completion_tokens differ; keep only one of them",
        )
        return None
    return next(iter(values.values()))


# -- messages ---------------------------------------------------------------------------------


def _check_messages(body: dict[str, Any], target: ModelTarget | None, problems: Problems) -> None:
    if "messages" not in body:
        problems.add(
            "body.messages", LineCode.MISSING_FIELD, "add body.messages, a list of messages"
        )
        return
    messages = body["messages"]
    if type(messages) is not list or not messages:
        problems.add(
            "body.messages",
            LineCode.INVALID_MESSAGES,
            "body.messages must be a non-empty list of messages",
        )
        return
    for index, message in enumerate(messages):
        _check_message(message, f"body.messages[{index}]", target, problems)


def _check_message(message: Any, path: str, target: ModelTarget | None, problems: Problems) -> None:
    if type(message) is not dict:
        problems.add(
            path, LineCode.INVALID_MESSAGE, f"{path} must be an object with a role and a content"
        )
        return
    role = message.get("role")
    if "role" not in message:
        problems.add(
            f"{path}.role", LineCode.MISSING_FIELD, f"add {path}.role, one of {_ROLE_LIST}"
        )
        role = None
    elif not isinstance(role, str) or role not in ROLES:
        problems.add(
            f"{path}.role", LineCode.INVALID_ROLE, f"{path}.role must be one of {_ROLE_LIST}"
        )
        role = None

    for key, value in message.items():
        if key in ("role", "content"):
            continue
        field = field_path(path, key)
        if key == "name" or (key == "tool_call_id" and role == "tool"):
            if not isinstance(value, str) or not value:
                problems.add(field, LineCode.INVALID_MESSAGE, f"{field} must be a non-empty string")
        elif key == "tool_calls" and role == "assistant":
            _check_history_calls(value, field, problems)
        elif key == "reasoning_content" and role == "assistant":
            # An earlier reply's reasoning, sent back as the reply gave it (docs/API.md).
            if value is not None and not isinstance(value, str):
                problems.add(field, LineCode.INVALID_MESSAGE, f"{field} must be a string or null")
        else:
            problems.add(
                field,
                LineCode.UNKNOWN_FIELD,
                f"remove {field}; a message holds role, content and optionally name "
                "(tool messages: tool_call_id; assistant messages: tool_calls and "
                "reasoning_content)",
            )
    if role == "tool" and "tool_call_id" not in message:
        problems.add(
            f"{path}.tool_call_id",
            LineCode.MISSING_FIELD,
            f"add {path}.tool_call_id to the tool message",
        )

    if role == "assistant" and "tool_calls" in message and message.get("content") is None:
        return  # an assistant turn that only called tools has no content
    if "content" not in message:
        problems.add(f"{path}.content", LineCode.MISSING_FIELD, f"add {path}.content")
        return
    content = message["content"]
    if isinstance(content, str):
        return
    if type(content) is not list or not content:
        problems.add(
            f"{path}.content",
            LineCode.INVALID_CONTENT,
            f"{path}.content must be a string or a non-empty list of content parts",
        )
        return
    for index, part in enumerate(content):
        _check_part(part, f"{path}.content[{index}]", role, target, problems)


def _check_history_calls(calls: Any, path: str, problems: Problems) -> None:
    """`tool_calls` of an assistant message in the input history."""
    if type(calls) is not list or not calls:
        problems.add(
            path, LineCode.INVALID_MESSAGE, f"{path} must be a non-empty list of tool calls"
        )
        return
    for index, call in enumerate(calls):
        where = f"{path}[{index}]"
        function = call.get("function") if type(call) is dict else None
        if (
            type(call) is not dict
            or set(call) - {"id", "type", "function"}
            or not isinstance(call.get("id"), str)
            or call.get("type") != "function"
            or type(function) is not dict
            or set(function) - {"name", "arguments"}
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments"), str)
        ):
            problems.add(
                where,
                LineCode.INVALID_MESSAGE,
                f'{where} must be {{"id", "type": "function", "function": '
                '{"name", "arguments"}}, with string id, name and arguments',
            )


def _check_part(
    part: Any, path: str, role: str | None, target: ModelTarget | None, problems: Problems
) -> None:
    if type(part) is not dict:
        problems.add(path, LineCode.INVALID_CONTENT_PART, f"{path} must be an object with a type")
        return
    kind = part.get("type")
    if kind == "text":
        _check_part_keys(part, path, "text", problems)
        if "text" in part and not isinstance(part["text"], str):
            problems.add(
                f"{path}.text", LineCode.INVALID_CONTENT_PART, f"{path}.text must be a string"
            )
        return
    if kind == "image_url":
        modality, noun = "image", "images"
    elif kind == "input_audio":
        modality, noun = "audio", "audio"
    else:
        problems.add(
            f"{path}.type",
            LineCode.INVALID_CONTENT_PART,
            f"{path}.type must be one of {', '.join(PART_TYPES)}",
        )
        return

    if target is not None and modality not in target.media:
        problems.add(
            path,
            LineCode.UNSUPPORTED_MODALITY,
            f"{path} is {'an image' if modality == 'image' else 'audio'}, but the model does "
            f"not accept {noun} in batch; remove it or choose a model that does",
        )
        return
    if role is not None and role != "user":
        problems.add(
            path, LineCode.INVALID_CONTENT_PART, f"{path}: {noun} are allowed only in user messages"
        )
        return
    _check_part_keys(part, path, kind, problems)
    if kind not in part:
        return
    if kind == "image_url":
        _check_image(part[kind], f"{path}.image_url", problems)
    else:
        _check_audio(part[kind], f"{path}.input_audio", problems)


def _check_part_keys(part: dict[str, Any], path: str, kind: str, problems: Problems) -> None:
    for key in part:
        if key not in ("type", kind):
            field = field_path(path, key)
            problems.add(
                field,
                LineCode.INVALID_CONTENT_PART,
                f"remove {field}; a {kind} part holds type and {kind}",
            )
    if kind not in part:
        problems.add(f"{path}.{kind}", LineCode.INVALID_CONTENT_PART, f"add {path}.{kind}")


def _check_image(image: Any, path: str, problems: Problems) -> None:
    if type(image) is not dict:
        problems.add(path, LineCode.INVALID_CONTENT_PART, f"{path} must be an object with a url")
        return
    for key in image:
        if key not in ("url", "detail"):
            field = field_path(path, key)
            problems.add(
                field,
                LineCode.INVALID_CONTENT_PART,
                f"remove {field}; image_url holds url and detail",
            )
    detail = image.get("detail")
    if detail is not None and (not isinstance(detail, str) or detail not in IMAGE_DETAILS):
        problems.add(
            f"{path}.detail",
            LineCode.INVALID_CONTENT_PART,
            f"{path}.detail must be one of {', '.join(IMAGE_DETAILS)}",
        )
    url = image.get("url")
    if not isinstance(url, str):
        problems.add(f"{path}.url", LineCode.INVALID_IMAGE_URL, f"{path}.url must be a string")
    elif not _is_image_url(url):
        problems.add(
            f"{path}.url",
            LineCode.INVALID_IMAGE_URL,
            f"{path}.url must be a data:image/<type>;base64,<data> URL or an https:// URL "
            "with a host and no whitespace, control characters or credentials",
        )
    elif url[:5].lower() == "data:":
        _check_media_size(url, f"{path}.url", problems)


def _check_media_size(encoded: str, path: str, problems: Problems) -> None:
    # Base64 holds 3 bytes in 4 characters: known too large without decoding a byte.
    limit = settings.MEDIA_MAX_BYTES
    if len(encoded) // 4 * 3 > limit + 64:  # 64: the data URL's prefix, generously
        problems.add(
            path,
            LineCode.MEDIA_TOO_LARGE,
            f"{path} is larger than {limit} bytes once decoded; send a smaller file",
        )


def _is_image_url(url: str) -> bool:
    head = url[:8].lower()
    if head.startswith("data:"):
        prefix = _DATA_IMAGE_PREFIX.match(url)
        return prefix is not None and _is_base64(url, prefix.end())
    if head == "https://" or head.startswith("http://"):
        # The worker fetches it and enforces the address rules
        # (docs/API.md "Limits, retention and privacy"); here, the URL rules the fetch applies too
        # (one host, no whitespace or controls, no credentials), and http only to a target
        # BOARDWALK_OUTBOUND_ALLOW names (docs/API.md "Images and audio").
        try:
            scheme, host, port = parse_target(url)
        except OutboundRefused:
            return False
        return scheme == "https" or (host, port) in allowed_targets()
    return False


def _check_audio(audio: Any, path: str, problems: Problems) -> None:
    if type(audio) is not dict:
        problems.add(
            path, LineCode.INVALID_CONTENT_PART, f"{path} must be an object with data and format"
        )
        return
    for key in audio:
        if key not in ("data", "format"):
            field = field_path(path, key)
            problems.add(
                field,
                LineCode.INVALID_CONTENT_PART,
                f"remove {field}; input_audio holds data and format",
            )
    data = audio.get("data")
    if not isinstance(data, str) or not _is_base64(data):
        problems.add(
            f"{path}.data",
            LineCode.INVALID_CONTENT_PART,
            f"{path}.data must be base64-encoded audio",
        )
    else:
        _check_media_size(data, f"{path}.data", problems)
    audio_format = audio.get("format")
    if not isinstance(audio_format, str) or audio_format not in AUDIO_FORMATS:
        problems.add(
            f"{path}.format",
            LineCode.INVALID_CONTENT_PART,
            f"{path}.format must be one of {', '.join(AUDIO_FORMATS)}",
        )


# -- other parameters -------------------------------------------------------------------------

ParameterCheck = Callable[[Any, str], "tuple[str, str] | None"]


def _invalid(message: str) -> tuple[str, str]:
    return LineCode.INVALID_PARAMETER, message


def _number_check(low: float, high: float, *, low_open: bool = False) -> ParameterCheck:
    if low_open:
        wanted = f"a number greater than {low:g} and at most {high:g}"
    else:
        wanted = f"a number from {low:g} to {high:g}"

    def check(value: Any, field: str) -> tuple[str, str] | None:
        if _is_number(value) and (low < value if low_open else low <= value) and value <= high:
            return None
        return _invalid(f"{field} must be {wanted}")

    return check


def _check_n(value: Any, field: str) -> tuple[str, str] | None:
    if _is_int(value) and 1 <= value <= MAX_N:
        return None
    return _invalid(f"{field} must be an integer from 1 to {MAX_N}")


def _check_stop(value: Any, field: str) -> tuple[str, str] | None:
    if isinstance(value, str) and value:
        return None
    if (
        type(value) is list
        and 1 <= len(value) <= MAX_STOP_SEQUENCES
        and all(isinstance(item, str) and item for item in value)
    ):
        return None
    return _invalid(
        f"{field} must be a non-empty string or a list of 1 to {MAX_STOP_SEQUENCES} "
        "non-empty strings"
    )


def _check_seed(value: Any, field: str) -> tuple[str, str] | None:
    if _is_int(value) and -(2**63) <= value < 2**63:
        return None
    return _invalid(f"{field} must be a 64-bit integer")


def _check_logit_bias(value: Any, field: str) -> tuple[str, str] | None:
    if type(value) is dict and all(
        _TOKEN_ID.fullmatch(token) and _is_number(bias) and -100 <= bias <= 100
        for token, bias in value.items()
    ):
        return None
    return _invalid(f"{field} must map token ids (strings of digits) to numbers from -100 to 100")


def _check_user(value: Any, field: str) -> tuple[str, str] | None:
    return None if isinstance(value, str) else _invalid(f"{field} must be a string")


def _check_metadata(value: Any, field: str) -> tuple[str, str] | None:
    if (
        type(value) is dict
        and len(value) <= MAX_METADATA_KEYS
        and all(
            len(key) <= MAX_METADATA_KEY_CHARS
            and isinstance(item, str)
            and len(item) <= MAX_METADATA_VALUE_CHARS
            for key, item in value.items()
        )
    ):
        return None
    return _invalid(
        f"{field} must be an object of at most {MAX_METADATA_KEYS} string values, keys of at "
        f"most {MAX_METADATA_KEY_CHARS} characters and values of at most "
        f"{MAX_METADATA_VALUE_CHARS}"
    )


def _check_store(value: Any, field: str) -> tuple[str, str] | None:
    return None if type(value) is bool else _invalid(f"{field} must be true or false")


def _check_bool(value: Any, field: str) -> tuple[str, str] | None:
    return None if type(value) is bool else _invalid(f"{field} must be true or false")


def _check_top_logprobs(value: Any, field: str) -> tuple[str, str] | None:
    if _is_int(value) and 0 <= value <= MAX_TOP_LOGPROBS:
        return None
    return _invalid(f"{field} must be an integer from 0 to {MAX_TOP_LOGPROBS}")


def _check_response_format(value: Any, field: str) -> tuple[str, str] | None:
    kind = value.get("type") if type(value) is dict else None
    shown = ", ".join(f'"{name}"' for name in RESPONSE_FORMATS)
    if not isinstance(kind, str) or kind not in RESPONSE_FORMATS:
        return _invalid(f"{field} must be an object whose type is one of {shown}")
    if kind != "json_schema":
        if len(value) != 1:
            return _invalid(f'{field} of type "{kind}" holds only type')
        return None
    if set(value) != {"type", "json_schema"}:
        return _invalid(f'{field} of type "json_schema" holds type and json_schema')
    spec = value["json_schema"]
    where = f"{field}.json_schema"
    if type(spec) is not dict or set(spec) - {"name", "description", "schema", "strict"}:
        return _invalid(
            f"{where} must be an object with name, and optionally description, schema and strict"
        )
    name = spec.get("name")
    if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name):
        return _invalid(f"{where}.name must be 1 to 64 letters, digits, underscores or dashes")
    if not isinstance(spec.get("description", ""), str):
        return _invalid(f"{where}.description must be a string")
    if spec.get("schema") is not None and type(spec["schema"]) is not dict:
        return _invalid(f"{where}.schema must be a JSON Schema object")
    if spec.get("strict") is not None and type(spec["strict"]) is not bool:
        return _invalid(f"{where}.strict must be true or false")
    return None


def _check_tools(value: Any, field: str) -> tuple[str, str] | None:
    if type(value) is not list or not 1 <= len(value) <= MAX_TOOLS:
        return _invalid(f"{field} must be a list of 1 to {MAX_TOOLS} tools")
    names: set[str] = set()
    for index, tool in enumerate(value):
        where = f"{field}[{index}]"
        if type(tool) is not dict or tool.get("type") != "function":
            return (
                LineCode.UNSUPPORTED_PARAMETER,
                f'{where} must be a function tool ({{"type": "function", "function": ...}}); '
                "other tool types are not supported",
            )
        function = tool.get("function")
        if set(tool) != {"type", "function"} or type(function) is not dict:
            return _invalid(f'{where} holds type "function" and a function object')
        extra = set(function) - {"name", "description", "parameters", "strict"}
        if extra:
            return _invalid(
                f"{where}.function holds name, and optionally description, parameters and strict"
            )
        name = function.get("name")
        if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name):
            return _invalid(
                f"{where}.function.name must be 1 to 64 letters, digits, underscores or dashes"
            )
        if name in names:
            return _invalid(f"{where}.function.name repeats an earlier tool's name")
        names.add(name)
        if not isinstance(function.get("description", ""), str):
            return _invalid(f"{where}.function.description must be a string")
        if function.get("parameters") is not None and type(function["parameters"]) is not dict:
            return _invalid(f"{where}.function.parameters must be a JSON Schema object")
        if function.get("strict") is not None and type(function["strict"]) is not bool:
            return _invalid(f"{where}.function.strict must be true or false")
    return None


def _check_tool_choice(value: Any, field: str) -> tuple[str, str] | None:
    if isinstance(value, str) and value in TOOL_CHOICES:
        return None
    function = value.get("function") if type(value) is dict else None
    if (
        type(value) is dict
        and set(value) == {"type", "function"}
        and value["type"] == "function"
        and type(function) is dict
        and set(function) == {"name"}
        and isinstance(function["name"], str)
    ):
        return None
    choices = ", ".join(f'"{c}"' for c in TOOL_CHOICES)
    return _invalid(
        f'{field} must be one of {choices} or {{"type": "function", "function": {{"name": ...}}}}'
    )


def _check_effort(value: Any, field: str) -> tuple[str, str] | None:
    # Whether the model takes it is the dialect's (_check_reasoning_effort).
    if isinstance(value, str) and value in EFFORTS:
        return None
    return LineCode.INVALID_PARAMETER, f"{field} must be one of {', '.join(EFFORTS)}"


PARAMETER_CHECKS: dict[str, ParameterCheck] = {
    "reasoning_effort": _check_effort,
    "temperature": _number_check(0, 2),
    "top_p": _number_check(0, 1, low_open=True),
    "presence_penalty": _number_check(-2, 2),
    "frequency_penalty": _number_check(-2, 2),
    "n": _check_n,
    "stop": _check_stop,
    "seed": _check_seed,
    "logit_bias": _check_logit_bias,
    "user": _check_user,
    "metadata": _check_metadata,
    "store": _check_store,
    "logprobs": _check_bool,
    "top_logprobs": _check_top_logprobs,
    "response_format": _check_response_format,
    "tools": _check_tools,
    "tool_choice": _check_tool_choice,
    "parallel_tool_calls": _check_bool,
}


# -- rules across fields: log probabilities, tools, grammars ----------------------------------


def _dialect(target: ModelTarget | None) -> Dialect:
    """The target's dialect; an unresolved model's rows are checked as hermes (the grammar's
    schemas compile the same in every syntax)."""
    if target is None:
        return DIALECTS["hermes"]
    return DIALECTS.get(target.dialect, DIALECTS["plain"])


def _check_reasoning_effort(
    body: dict[str, Any],
    target: ModelTarget | None,
    dialect: Dialect,
    failed: set[str],
    problems: Problems,
) -> None:
    effort = body.get("reasoning_effort")
    if effort is None or "body.reasoning_effort" in failed:
        return
    field = "body.reasoning_effort"
    if target is None:
        return
    if not dialect.efforts:
        problems.add(
            field,
            LineCode.UNSUPPORTED_PARAMETER,
            f"{field}: model {target.name!r} has no reasoning setting (dialect "
            f"{dialect.name}); remove it",
        )
    elif effort not in dialect.efforts:
        problems.add(
            field,
            LineCode.UNSUPPORTED_PARAMETER,
            f"{field}: model {target.name!r} takes {', '.join(dialect.efforts)}",
        )


def _check_structured(
    body: dict[str, Any], target: ModelTarget | None, failed: set[str], problems: Problems
) -> None:
    """Rules that read several fields; each runs only when its fields passed alone."""
    if (
        body.get("top_logprobs") is not None
        and "body.top_logprobs" not in failed
        and body.get("logprobs") is not True
    ):
        problems.add(
            "body.top_logprobs",
            LineCode.INVALID_PARAMETER,
            "body.top_logprobs needs body.logprobs set to true",
        )

    dialect = _dialect(target)
    _check_reasoning_effort(body, target, dialect, failed, problems)
    tools = body.get("tools")
    choice = body.get("tool_choice")
    tools_ok = "body.tools" not in failed
    if tools is None:
        for key in ("tool_choice", "parallel_tool_calls"):
            if body.get(key) is not None and f"body.{key}" not in failed:
                problems.add(
                    f"body.{key}",
                    LineCode.INVALID_PARAMETER,
                    f"body.{key} needs body.tools; add tools",
                )
    elif tools_ok and target is not None and dialect.tools is None:
        problems.add(
            "body.tools",
            LineCode.UNSUPPORTED_PARAMETER,
            f"body.tools: model {target.name!r} has no tool-call syntax (dialect "
            f"{dialect.name}), so it cannot take tools; remove them or choose a model that "
            "supports tools",
        )
        tools_ok = False
    elif tools_ok and type(choice) is dict and "body.tool_choice" not in failed:
        names = {tool["function"]["name"] for tool in tools}
        if choice["function"]["name"] not in names:
            problems.add(
                "body.tool_choice",
                LineCode.INVALID_PARAMETER,
                "body.tool_choice names a function that is not in body.tools",
            )

    # Compile each schema on its own, so that an error names the schema at fault.
    parts: list[tuple[str, dict[str, Any]]] = []
    if body.get("response_format") is not None and "body.response_format" not in failed:
        parts.append(
            (
                "body.response_format.json_schema.schema",
                {"response_format": body["response_format"]},
            )
        )
    if tools is not None and tools_ok:
        for index, tool in enumerate(tools):
            parts.append(
                (
                    f"body.tools[{index}].function.parameters",
                    {"tools": [tool], "tool_choice": "required"},
                )
            )
    for field, part in parts:
        try:
            check_grammar(part, dialect if dialect.tools is not None else DIALECTS["hermes"])
        except GrammarError as exc:
            code = LineCode.UNSUPPORTED_PARAMETER if exc.unsupported else LineCode.INVALID_PARAMETER
            problems.add(field, code, f"{field}: {exc.message}")
