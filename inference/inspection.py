"""What a local Hugging Face model directory would be as a revision, without loading weights.

`model_inspect(path)` reads `config.json`, `generation_config.json`, the tokenizer files and the
safetensors headers (a few KiB each, whatever the weights weigh) and either describes the
revision (`Inspection`) or refuses with the reason (`InspectionRefused`). `manage.py model` and
the admin's revision form both call it, so neither creates a revision the engine would refuse.
`external_inspect(path, engine_url=…)` describes a revision an external engine answers, from
its tokenizer directory alone (no weights; inference/external/). No torch, no transformers
model code, no network.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError

from inference.dialects import DIALECTS, Dialect, detect
from inference.engine.families import context_length_of, kv_heads_of, refusal, text_config
from inference.engine.parallel import device_refusal, tensor_parallel_refusal
from inference.engine.quantization import (
    quantization_machine_refusal,
    quantization_of,
    quantization_refusal,
)
from inference.external.upstream import UpstreamConfigError, api_key_env_refusal, normalized_url
from inference.media_layout import LayoutUnavailable, json_object, media_layout
from inference.tokenization import ChatTokenizer, RenderLimitExceeded, TokenizerUnavailable

# Bytes per element of the dtypes safetensors and configs name.
_ELEMENT_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "float32": 4, "float16": 2, "bfloat16": 2, "fp32": 4, "fp16": 2, "bf16": 2,
}  # fmt: skip
_DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
_PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth")
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit
# Sizes past these are a broken or hostile config, not a model: the largest served today
# have ~130 layers, hidden sizes of ~16k, vocabularies of ~260k, contexts of ~10M tokens.
MAX_CONTEXT_LENGTH = 1 << 24
_CONFIG_BOUNDS = {
    "num_hidden_layers": 1024, "n_layer": 1024,
    "hidden_size": 1 << 17, "n_embd": 1 << 17, "intermediate_size": 1 << 20,
    "num_attention_heads": 1 << 12, "n_head": 1 << 12, "num_key_value_heads": 1 << 12,
    "head_dim": 1 << 12, "vocab_size": 1 << 24,
    "max_position_embeddings": MAX_CONTEXT_LENGTH, "n_positions": MAX_CONTEXT_LENGTH,
    "max_sequence_length": MAX_CONTEXT_LENGTH, "seq_length": MAX_CONTEXT_LENGTH,
}  # fmt: skip
# A tensor dimension past this is no weight (2^40 elements of one byte is a terabyte).
_MAX_DIMENSION = 1 << 40
# The conversation `inspect` renders with the chat template, under render's bounds.
_PROBE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hello, how can I help?"},
    {"role": "user", "content": "Say hello again."},
]


class InspectionRefused(Exception):
    """The directory cannot become a revision; the message says why and what to change."""


@dataclass(frozen=True)
class Inspection:
    path: str
    architecture: str
    model_type: str
    context_length: int
    dtype: str
    parameters: int
    weight_bytes: int
    kv_bytes_per_token: int
    modalities: list[str]
    dialect: str
    eos_token_ids: list[int]
    quantization: dict[str, Any] | None = None
    tensor_parallel_size: int = 1
    notes: list[str] = field(default_factory=list)
    # An external engine's revision (`external_inspect`): url, model, api_key_env,
    # max_in_flight, gpus. None: Boardwalk's own engine loads the weights at `path`.
    engine: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def revision_fields(self, *, label: str) -> dict[str, Any]:
        """The fields of a `ModelRevision` built from this inspection."""
        fields = {
            "label": label,
            "weights": self.path,
            "context_length": self.context_length,
            "dtype": self.dtype,
            "modalities": self.modalities,
            "dialect": self.dialect,
            "tensor_parallel_size": self.tensor_parallel_size,
        }
        if self.engine is not None:
            fields |= {
                "tokenizer": self.path,
                "engine_url": self.engine["url"],
                "engine_model": self.engine["model"],
                "engine_api_key_env": self.engine["api_key_env"],
                "max_in_flight": self.engine["max_in_flight"],
                "engine_gpus": self.engine["gpus"],
            }
        return fields


def model_inspect(
    path: str | Path,
    *,
    context_length: int | None = None,
    dtype: str | None = None,
    tensor_parallel_size: int = 1,
    dialect: str | None = None,
) -> Inspection:
    """Describe `path` as a revision, or raise InspectionRefused naming the reason.

    `tensor_parallel_size`: the devices the engine is to be split across. `dialect` overrides
    the dialect found in the chat template (inference/dialects). What depends on the
    serving machine (its GPUs, the kernel packages installed) is `machine_refusal`'s."""
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise InspectionRefused(f"{directory} is not a directory (download the model first)")
    directory = directory.resolve()
    config = _json(directory / "config.json", required=True)
    model_type = str(config.get("model_type") or "")
    _check_sizes(config)
    native = context_length_of(config)
    if context_length is None:
        if native is None:
            raise InspectionRefused(
                "config.json names no context length (max_position_embeddings); "
                "pass --context-length"
            )
        context_length = native
    if context_length <= 0 or (native is not None and context_length > native):
        raise InspectionRefused(
            f"context length {context_length} must be between 1 and the model's {native}"
        )
    reason = refusal(config, context_length=context_length)
    if reason:
        raise InspectionRefused(reason)
    quantization = quantization_of(config.get("quantization_config") or None)
    reason = tensor_parallel_refusal(config, tensor_parallel_size) or quantization_refusal(
        quantization
    )
    if reason is None and quantization is not None and tensor_parallel_size > 1:
        reason = "quantized weights are served with tensor_parallel_size 1"
    if reason:
        raise InspectionRefused(reason)
    parameters, weight_bytes, stored_dtype, ignored = _weights(directory)
    chosen_dtype = dtype or "auto"
    if chosen_dtype != "auto" and chosen_dtype.lower() not in _ELEMENT_BYTES:
        raise InspectionRefused(
            f"unknown dtype {chosen_dtype!r}; use auto, bfloat16, float16 or float32"
        )
    tokenizer = _tokenizer(directory)
    _probe_template(tokenizer)
    spoken = _dialect(tokenizer.chat_template, dialect)
    layout = _media_layout(directory)
    modalities = ["text", *([layout.modality] if layout else [])]
    if tensor_parallel_size > 1 and layout:
        raise InspectionRefused(
            "a model with a media encoder is served with tensor_parallel_size 1 (its "
            "encoder has no tensor-parallel plan)"
        )
    kv_bytes = _kv_bytes_per_token(config, chosen_dtype, stored_dtype)
    return Inspection(
        path=str(directory),
        architecture=str((config.get("architectures") or [model_type])[0]),
        model_type=model_type,
        context_length=context_length,
        dtype=chosen_dtype,
        parameters=parameters,
        weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_bytes,
        modalities=modalities,
        dialect=spoken.name,
        eos_token_ids=_eos_ids(directory, config, tokenizer),
        quantization=quantization,
        tensor_parallel_size=tensor_parallel_size,
        notes=[
            dialect_note(spoken, chosen=dialect is not None),
            *ignored,
            *_notes(chosen_dtype, stored_dtype, quantization, tensor_parallel_size, kv_bytes),
        ],
    )


# A cap past this is no fleet's concurrency but a typo (vLLM's max_num_seqs is 256 to 1024 a
# replica); the limit adapts below the cap anyway.
MAX_IN_FLIGHT = 100_000


def external_inspect(
    path: str | Path,
    *,
    engine_url: str,
    engine_model: str,
    engine_api_key_env: str = "",
    max_in_flight: int = 32,
    gpus: int = 0,
    context_length: int | None = None,
    dialect: str | None = None,
    served_context_length: int | None = None,
) -> Inspection:
    """Describe a revision an external engine answers, or raise InspectionRefused.

    `path` is its tokenizer directory: `config.json`, the fast tokenizer and its chat
    template, no weights. It is checked as a local model's tokenizer is (the template renders
    under the same bounds, the dialect is found in it, the end-of-sequence ids are tokens),
    since uploads are validated, counted and estimated with it exactly as for a local
    revision. The context length is the config's, never more than `served_context_length`
    (what the server says it serves, from `inference.external.check`), or `context_length`
    within both. Nothing here asks the server: `upstream_check` does."""
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise InspectionRefused(
            f"{directory} is not a directory: --tokenizer names the model's tokenizer "
            "directory (config.json, tokenizer.json, chat template; no weights needed)"
        )
    directory = directory.resolve()
    try:
        url = normalized_url(engine_url)
    except UpstreamConfigError as exc:
        raise InspectionRefused(str(exc)) from exc
    if not engine_model.strip():
        raise InspectionRefused("--engine-model is the model id the server lists at /v1/models")
    refused = api_key_env_refusal(engine_api_key_env) if engine_api_key_env else None
    if refused:
        raise InspectionRefused(refused)
    if not 1 <= max_in_flight <= MAX_IN_FLIGHT:
        raise InspectionRefused(f"--max-in-flight must be from 1 to {MAX_IN_FLIGHT}")
    if gpus < 0:
        raise InspectionRefused("--gpus counts the GPUs the server holds: 0 or more")
    config = _json(directory / "config.json", required=True)
    _check_sizes(config)
    native = context_length_of(config)
    known = [n for n in (native, served_context_length) if n]
    ceiling = min(known) if known else None
    if context_length is None:
        if ceiling is None:
            raise InspectionRefused(
                "neither config.json nor the server names a context length; pass --context-length"
            )
        context_length = ceiling
    if context_length <= 0 or (ceiling is not None and context_length > ceiling):
        said = " (what the server serves)" if ceiling == served_context_length else ""
        raise InspectionRefused(
            f"context length {context_length} must be between 1 and {ceiling}{said}"
        )
    tokenizer = _tokenizer(directory)
    _probe_template(tokenizer)
    spoken = _dialect(tokenizer.chat_template, dialect)
    model_type = str(config.get("model_type") or "")
    return Inspection(
        path=str(directory),
        architecture=str((config.get("architectures") or [model_type])[0]),
        model_type=model_type,
        context_length=context_length,
        dtype="auto",
        parameters=0,
        weight_bytes=0,
        kv_bytes_per_token=0,
        modalities=["text"],
        dialect=spoken.name,
        eos_token_ids=_eos_ids(directory, config, tokenizer),
        notes=[
            dialect_note(spoken, chosen=dialect is not None),
            f"answered by the external engine at {url} (model {engine_model!r}); the "
            "directory gives the tokenizer, template and context, no weights are loaded",
            "text rows only: media parts are not sent to external engines yet",
        ],
        engine={
            "url": url,
            "model": engine_model,
            "api_key_env": engine_api_key_env,
            "max_in_flight": max_in_flight,
            "gpus": gpus,
        },
    )


def _dialect(chat_template: str, chosen: str | None) -> Dialect:
    if chosen is None:
        return detect(chat_template)
    if chosen not in DIALECTS:
        raise InspectionRefused(f"unknown dialect {chosen!r}; choose one of {', '.join(DIALECTS)}")
    return DIALECTS[chosen]


def dialect_note(dialect: Dialect, *, chosen: bool = False) -> str:
    """What a revision's dialect means for its requests, in words for an operator."""
    how = "chosen with --dialect" if chosen else "found in the chat template"
    if dialect.tools is None and dialect.thinking is None and not dialect.efforts:
        if dialect.name != "plain":
            return f"dialect {dialect.name} ({how}): {dialect.families}"
        return (
            f"dialect plain ({how}): no tool-call syntax or reasoning this release knows; "
            "replies are plain text, and rows with tools or reasoning_effort are refused at "
            "upload (--dialect chooses another)"
        )
    what = [f"tool calls in the {dialect.tools.name} syntax" if dialect.tools else "no tools"]
    if dialect.thinking is not None or dialect.name == "harmony":
        what.append("reasoning returned as reasoning_content")
    if dialect.efforts:
        what.append("reasoning_effort " + "/".join(dict.fromkeys(dialect.efforts)))
    return f"dialect {dialect.name} ({how}): {dialect.families}; " + ", ".join(what)


def machine_refusal(inspection: Inspection, *, cuda_devices: int) -> str | None:
    """Why a machine with `cuda_devices` GPUs (0: its engines run on the CPU) cannot serve
    what `inspection` describes, or None: more devices than it has, quantized kernels it
    lacks."""
    return device_refusal(inspection.tensor_parallel_size, cuda_devices) or (
        quantization_machine_refusal(inspection.quantization, cuda=cuda_devices > 0)
    )


def _json(path: Path, *, required: bool = False) -> dict[str, Any]:
    if not path.exists():
        if required:
            raise InspectionRefused(f"{path.name} is missing in {path.parent}")
        return {}
    try:
        return json_object(path)
    except LayoutUnavailable as exc:
        raise InspectionRefused(f"{exc} (it must be a JSON object)") from exc


def _check_sizes(config: dict[str, Any]) -> None:
    """Refuse sizes no model has (a context of 2^62, -5 layers): they are a broken config,
    and would reach the engine's arithmetic and the revision's fields."""
    text = text_config(config)
    for key, bound in _CONFIG_BOUNDS.items():
        value = text.get(key)
        if value is None:
            continue
        if not _is_int(value) or not 0 < value <= bound:
            raise InspectionRefused(
                f"config.json's {key} is {value!r}: it must be a whole number from 1 to {bound}"
            )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _weights(directory: Path) -> tuple[int, int, str, list[str]]:
    """(parameters, bytes, stored dtype, notes on files not loaded) from the safetensors
    headers, each checked against its file: a header whose tensors do not add up to the
    file (truncated, or shapes that are no weights) is refused here, not at load."""
    files = sorted(directory.glob("*.safetensors"))
    pickled = sorted(path.name for pattern in _PICKLED_WEIGHTS for path in directory.glob(pattern))
    if not files:
        if pickled:
            raise InspectionRefused(
                "the weights are pickled (.bin/.pt), which the engine does not load; "
                "convert them to safetensors"
            )
        raise InspectionRefused(f"no weights (*.safetensors) in {directory}")
    parameters = weight_bytes = 0
    dtypes: dict[str, int] = {}
    for file in files:
        header, data_bytes = _safetensors_header(file)
        covered = 0
        for name, tensor in header.items():
            if name == "__metadata__":
                continue
            count, size = _tensor_size(file, name, tensor, data_bytes)
            parameters += count
            weight_bytes += size
            covered = max(covered, int(tensor["data_offsets"][1]))
            dtypes[tensor["dtype"]] = dtypes.get(tensor["dtype"], 0) + count
        if covered != data_bytes:
            raise InspectionRefused(
                f"{file.name} is truncated or padded: its header describes {covered} bytes of "
                f"tensors and the file holds {data_bytes} (download it again)"
            )
    stored = max(dtypes, key=lambda d: dtypes[d]) if dtypes else "F32"
    notes = (
        [f"ignored: {', '.join(pickled)} (pickled weights are never loaded, only *.safetensors)"]
        if pickled
        else []
    )
    return parameters, weight_bytes, _DTYPE_NAMES.get(stored, stored), notes


def _tensor_size(file: Path, name: str, tensor: Any, data_bytes: int) -> tuple[int, int]:
    """(elements, bytes) of one header entry, refused unless its shape, dtype and offsets
    describe bytes inside the file that its shape fills exactly."""
    refused = InspectionRefused(f"{file.name}: tensor {name!r} has an impossible header entry")
    if not isinstance(tensor, dict):
        raise refused
    shape, offsets, dtype = tensor.get("shape"), tensor.get("data_offsets"), tensor.get("dtype")
    ends = offsets[1] if isinstance(offsets, list) and len(offsets) == 2 else None
    if isinstance(ends, int) and ends > data_bytes:
        raise InspectionRefused(
            f"{file.name} is truncated: tensor {name!r} ends at byte {ends} of the data and "
            f"the file holds {data_bytes} (download it again)"
        )
    if not (
        isinstance(shape, list)
        and all(_is_int(d) and 0 <= d <= _MAX_DIMENSION for d in shape)
        and isinstance(offsets, list)
        and len(offsets) == 2
        and all(_is_int(o) for o in offsets)
        and 0 <= offsets[0] <= offsets[1] <= data_bytes
        and isinstance(dtype, str)
    ):
        raise refused
    count = 1
    for dim in shape:
        count *= dim
    size = offsets[1] - offsets[0]
    element = _ELEMENT_BYTES.get(dtype)
    if element is not None and count * element != size:
        raise InspectionRefused(
            f"{file.name}: tensor {name!r} of shape {shape} ({dtype}) would take "
            f"{count * element} bytes and its offsets give {size}"
        )
    return count, size


def _safetensors_header(file: Path) -> tuple[dict[str, Any], int]:
    """The header and how many bytes of tensor data follow it."""
    try:
        with file.open("rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > MAX_HEADER_BYTES:
                raise ValueError("header too large")
            header = json.loads(handle.read(size))
        data_bytes = file.stat().st_size - 8 - size
    except (OSError, ValueError, struct.error) as exc:
        raise InspectionRefused(f"{file.name} is not a readable safetensors file") from exc
    if not isinstance(header, dict) or data_bytes < 0:
        raise InspectionRefused(f"{file.name} is not a readable safetensors file")
    return header, data_bytes


def _tokenizer(directory: Path) -> ChatTokenizer:
    if not (directory / "tokenizer.json").exists():
        raise InspectionRefused(
            "tokenizer.json is missing: the web tier counts prompt tokens with the fast "
            "tokenizer's file (save the tokenizer with transformers to write it)"
        )
    try:
        return ChatTokenizer(directory)
    except TokenizerUnavailable as exc:
        if "no chat template" in str(exc):
            raise InspectionRefused(
                "the tokenizer has no chat template (a base model, not a chat model): add one "
                "as chat_template.jinja or in tokenizer_config.json"
            ) from exc
        raise InspectionRefused(f"the tokenizer does not load offline: {exc}") from exc


def _media_layout(directory: Path) -> Any:
    try:
        return media_layout(directory)
    except LayoutUnavailable as exc:
        raise InspectionRefused(f"the model's media encoder cannot be used: {exc}") from exc


def _kv_bytes_per_token(config: dict[str, Any], dtype: str, stored: str) -> int:
    text = text_config(config)
    layers = int(text.get("num_hidden_layers") or text.get("n_layer") or 0)
    heads = int(text.get("num_attention_heads") or text.get("n_head") or 1)
    hidden = int(text.get("hidden_size") or text.get("n_embd") or 0)
    head_dim = int(text.get("head_dim") or hidden // heads)
    # `auto` serves bf16 on a GPU (loading.resolve_dtype); the figure is for a GPU.
    name = "bfloat16" if dtype == "auto" else dtype.lower()
    return layers * kv_heads_of(config) * head_dim * 2 * _ELEMENT_BYTES.get(name, 2)


def _probe_template(tokenizer: ChatTokenizer) -> None:
    """Render a short conversation as requests will be, under the bounds every request's
    rendering has (inference.tokenization): a template that loops for minutes, builds huge
    strings or fails on plain messages is refused now, not at each request."""
    try:
        tokenizer.render(_PROBE)
    except RenderLimitExceeded as exc:
        raise InspectionRefused(f"{exc} (a four-message probe conversation)") from exc
    except TemplateError as exc:
        try:  # some templates refuse a system message: a user message alone must render
            tokenizer.render(_PROBE[1:])
        except Exception as inner:  # any failure of the template is a refusal, not a crash
            raise InspectionRefused(
                f"the chat template fails on a plain conversation: {type(inner).__name__}: {inner}"
            ) from exc
    except Exception as exc:  # any failure of the template is a refusal, not a crash
        raise InspectionRefused(
            f"the chat template fails on a plain conversation: {type(exc).__name__}: {exc}"
        ) from exc


def _eos_ids(directory: Path, config: dict[str, Any], tokenizer: ChatTokenizer) -> list[int]:
    """The end-of-sequence ids, each a token of the vocabulary (the engine compares every
    sampled token with them and indexes the logits by them)."""
    generation = _json(directory / "generation_config.json")
    source = "generation_config.json" if "eos_token_id" in generation else "config.json"
    value = generation.get("eos_token_id", config.get("eos_token_id"))
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    vocabulary = text_config(config).get("vocab_size") or tokenizer.backend.get_vocab_size(
        with_added_tokens=True
    )
    for token in values:
        if not _is_int(token) or not 0 <= token < vocabulary:
            raise InspectionRefused(
                f"{source}'s eos_token_id holds {token!r}: each end-of-sequence id must be a "
                f"token id from 0 to {vocabulary - 1} (the vocabulary's size is {vocabulary})"
            )
    return list(values)


def _notes(
    dtype: str,
    stored: str,
    quantization: dict[str, Any] | None,
    tensor_parallel_size: int,
    kv_bytes: int,
) -> list[str]:
    notes = []
    if quantization is not None:
        notes.append(
            f"weights quantized with {quantization['quant_method']} "
            f"({quantization['bits']}-bit); weight_bytes is their size on disk, and packed "
            "tensors count as stored in `parameters`"
        )
    elif dtype == "auto":
        notes.append(f"weights stored as {stored}; auto serves bfloat16 on a GPU, float32 on a CPU")
    if tensor_parallel_size > 1:
        notes.append(
            f"split across {tensor_parallel_size} devices: each holds 1/{tensor_parallel_size} "
            f"of the weights and {kv_bytes // tensor_parallel_size} K/V bytes per token"
        )
    return notes
