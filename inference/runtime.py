"""Per-process caches of loaded models: one engine per serving revision (docs/ARCHITECTURE.md
decision 4).

Loading is slow and memory-hungry, so a worker keeps the engine while work remains and
drops the least recently used one when it needs room for another revision.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from django.conf import settings
from transformers import AutoTokenizer

from inference.demo.fake_engine import FakeEngine
from inference.dialects import dialect_named
from inference.engine.config import EngineConfig
from inference.engine.engine import Engine
from inference.engine.loading import ModelLoadError, load_model, load_processor
from inference.engine.process import EngineProcess, EngineProcessError
from inference.engine.protocol import GenerationEngine
from inference.engine.types import GenerationRequest, GenerationResult, SamplingParams
from inference.external.engine import ExternalEngine
from inference.models import ModelRevision


class ExternalRevision(ModelLoadError):
    """The revision is answered by an external engine (inference/external/): Boardwalk's own
    engine never loads it (its directory holds no weights); `inference.external.check` asks
    its server instead."""

    def __init__(self, revision: ModelRevision) -> None:
        super().__init__(
            f"revision {revision.id} is answered by the external engine at "
            f"{revision.engine_url}: nothing of it is loaded here, its server is asked instead "
            "(model add --check)"
        )


def _refuse_external(revision: ModelRevision) -> None:
    """Boardwalk's engine never loads an external revision: its directory has no weights."""
    if revision.is_external:
        raise ExternalRevision(revision)


_lock = threading.Lock()
_engines: OrderedDict[str, GenerationEngine] = OrderedDict()
_tokenizers: OrderedDict[str, Any] = OrderedDict()
_engine_locks: dict[str, threading.Lock] = {}


def _load_options(revision: ModelRevision) -> dict[str, Any]:
    return {
        "weights": revision.weights,
        "tokenizer": revision.tokenizer or None,
        "dtype": revision.dtype,
        "chat_template": revision.chat_template or None,
        "revision": revision.weights_revision or None,
        "device": settings.ENGINE_DEVICE or None,
    }


def _load(revision: ModelRevision) -> tuple[Any, Any]:
    model, tokenizer = load_model(**_load_options(revision))
    return model, _speaking(tokenizer, revision)


def _speaking(tokenizer: Any, revision: ModelRevision) -> Any:
    """The tokenizer, carrying the revision's dialect (read by inference.chat_completions and
    inference.rendering: how prompts take reasoning_effort, how replies are read back)."""
    tokenizer.dialect = dialect_named(revision.dialect)
    return tokenizer


def _publishes_media(revision: ModelRevision) -> bool:
    return bool(set(revision.modalities) & {"image", "audio"})


def _processor(revision: ModelRevision) -> Any:
    """The processor of a revision that publishes media (its encoders' inputs), else None."""
    if not _publishes_media(revision):
        return None
    return load_processor(revision.weights, revision=revision.weights_revision or None)


def _load_tokenizer(revision: ModelRevision) -> Any:
    options: dict[str, Any] = {"local_files_only": True}
    if revision.weights_revision:
        options["revision"] = revision.weights_revision
    try:
        tokenizer = AutoTokenizer.from_pretrained(revision.tokenizer or revision.weights, **options)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        raise ModelLoadError(f"cannot load the tokenizer of {revision.id}: {exc}") from exc
    if revision.chat_template:
        tokenizer.chat_template = revision.chat_template
    return _speaking(tokenizer, revision)


def engine_lock(revision_id: str) -> threading.Lock:
    """Held while an engine generates: one `generate` call per engine at a time."""
    with _lock:
        return _engine_locks.setdefault(revision_id, threading.Lock())


def engine_for(revision: ModelRevision) -> GenerationEngine:
    """The process's engine for `revision`: an `EngineProcess` (the engine in a child
    process, BOARDWALK_ENGINE_PROCESS, the default), an in-process `Engine`, or a
    `FakeEngine` when BOARDWALK_ENGINE_BACKEND=fake:<step ms>, for scale benchmarks.
    For an external revision, an `ExternalEngine` (inference/external/engine.py): the rows go
    to its server, nothing is loaded but the tokenizer."""
    with _lock:
        cached = _engines.get(revision.id)
        if cached is not None:
            _engines.move_to_end(revision.id)
            return cached
    backend = settings.ENGINE_BACKEND
    if revision.is_external:
        tokenizer = _load_tokenizer(revision)
        engine: GenerationEngine = ExternalEngine.of(
            revision,
            tokenizer,
            redis_url=settings.REDIS_URL or None,
            timeouts={
                "request_timeout": settings.EXTERNAL_REQUEST_TIMEOUT_SECONDS,
                "connect_timeout": settings.EXTERNAL_CONNECT_TIMEOUT_SECONDS,
            },
            max_attempts=settings.EXTERNAL_MAX_ATTEMPTS,
            floor=settings.EXTERNAL_MIN_IN_FLIGHT,
        )
    elif backend.startswith("fake:"):
        tokenizer = _load_tokenizer(revision)
        engine = FakeEngine(
            tokenizer,
            context_length=revision.context_length,
            max_batch_size=settings.ENGINE_MAX_BATCH_SIZE,
            step_seconds=float(backend.removeprefix("fake:")) / 1000,
        )
    elif settings.ENGINE_PROCESS or revision.tensor_parallel_size > 1:
        # A tensor-parallel engine always runs in processes: one per rank.
        tokenizer = _load_tokenizer(revision)
        engine = _engine_process(revision, tokenizer)
    else:
        model, tokenizer = _load(revision)
        engine = Engine(model, tokenizer, _engine_config(revision), processor=_processor(revision))
    evicted = []
    with _lock:
        _engines[revision.id] = engine
        _tokenizers[revision.id] = tokenizer
        while len(_engines) > settings.ENGINES_PER_PROCESS:
            evicted.append(_engines.popitem(last=False)[1])
    for old in evicted:
        _close(old)
    return engine


def _engine_process(revision: ModelRevision, tokenizer: Any) -> EngineProcess:
    return EngineProcess(
        load=_load_options(revision),
        config=_engine_config(revision),
        tokenizer=tokenizer,
        with_processor=_publishes_media(revision),
        tensor_parallel_size=revision.tensor_parallel_size,
    )


def _engine_config(revision: ModelRevision) -> EngineConfig:
    """How the revision's engine runs: the revision's context and dialect, the settings'
    tuning (BOARDWALK_ENGINE_*, BOARDWALK_INTERACTIVE_STEP_MS)."""
    dialect = dialect_named(revision.dialect)
    return EngineConfig(
        context_length=revision.context_length,
        max_batch_size=settings.ENGINE_MAX_BATCH_SIZE,
        prefix_cache=settings.ENGINE_PREFIX_CACHE,
        interactive_step_seconds=settings.ENGINE_INTERACTIVE_STEP_MS / 1000,
        # The dialect's markup stays in the decoded text, and its turn ends stop a reply.
        markup_tokens=dialect.markup,
        turn_end_tokens=dialect.turn_ends,
        cuda_graphs=settings.ENGINE_CUDA_GRAPHS,
    )


def _close(engine: GenerationEngine) -> None:
    """An engine process ends with its last reference here (an in-process engine is freed)."""
    if isinstance(engine, EngineProcess | ExternalEngine):
        engine.close()


def loaded_revision_ids() -> list[str]:
    """Revisions this process holds an engine for (reported by the liveness beat)."""
    with _lock:
        return list(_engines)


def engine_drop(revision_id: str) -> None:
    """Forget a broken engine: the next wake-up loads it afresh."""
    with _lock:
        engine = _engines.pop(revision_id, None)
    if engine is not None:
        _close(engine)


def tokenizer_for(revision: ModelRevision) -> Any:
    """The revision's tokenizer (with its chat template), without loading the weights."""
    with _lock:
        tokenizer = _tokenizers.get(revision.id)
        if tokenizer is not None:
            return tokenizer
    tokenizer = _load_tokenizer(revision)
    with _lock:
        _tokenizers[revision.id] = tokenizer
        while len(_tokenizers) > 8:
            _tokenizers.popitem(last=False)
    return tokenizer


def revision_check(revision: ModelRevision, *, tokens: int = 4) -> GenerationResult:
    """Load `revision` in this process exactly as a worker would and generate `tokens`
    greedy tokens for one short chat prompt: proof that it loads and runs on this machine's
    device (`manage.py model add --check`), across its ranks when it is tensor-parallel.
    Raises ModelLoadError when it does not load, ExternalRevision for an external revision
    (`inference.external.check` checks those)."""
    _refuse_external(revision)
    engine: GenerationEngine
    if revision.tensor_parallel_size > 1:
        tokenizer = _load_tokenizer(revision)
        try:
            engine = _engine_process(revision, tokenizer)
        except EngineProcessError as exc:
            raise ModelLoadError(str(exc)) from exc
    else:
        model, tokenizer = _load(revision)
        engine = Engine(model, tokenizer, _engine_config(revision), processor=_processor(revision))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hello."}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    request = GenerationRequest("check", ids, SamplingParams(max_new_tokens=tokens, temperature=0))
    try:
        for result in engine.generate([request]):
            if isinstance(result, GenerationResult):  # the request does not stream
                return result
        raise ModelLoadError("the engine answered nothing")
    finally:
        _close(engine)
