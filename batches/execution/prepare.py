"""The prepare stage: read the lines of the items a run claimed, render and tokenize.

Runs ahead of the engine so that the engine never waits on the database, the store or the
tokenizer while work is queued (the run claims each group from batches.queue). Lines are read
through one open decrypting stream per batch file, in file order, so each chunk is decrypted
once. On a revision with media, the group's image URLs are fetched and every part decoded in
parallel (batches/execution/media.py) before the rows are laid out with their placeholders.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from batches.execution.media import DecodedMedia, MediaError, MediaResolver
from batches.models import BatchItem
from boardwalk.codes import ItemCode
from boardwalk.logs import exception_trace
from files.models import File
from files.services import file_iter_lines, file_read_range
from files.validation.sectioned import effective_body
from inference.chat_completions import media_prompt, sampling_params
from inference.engine.types import ERROR_INTERNAL, GenerationRequest, MediaInput
from inference.media_layout import MediaLayout
from inference.models import ModelRevision
from inference.prompt_bounds import bounded_prompt_ids, over_context
from inference.rendering import PlaceholderMismatch, media_parts

logger = logging.getLogger(__name__)

REOPEN_GAP = 1 << 20  # skip forward by decrypting up to this much; reopen beyond it
OPEN_FILES = 8
# Parsed section bodies kept (sectioned input: docs/API.md "BatchRouter sectioned input").
SECTIONS = 64
_contexts: dict[str, int] = {}  # revision id → context length


@dataclass
class Prepared:
    """An item ready for the engine: its lease and its request."""

    item: BatchItem
    request: GenerationRequest


@dataclass
class Unpreparable:
    """An item whose line could not be read or rendered (internal_error), or whose media
    could not be fetched or decoded (image_fetch_failed, invalid_media): it ends as that."""

    item: BatchItem
    error_code: str = ERROR_INTERNAL


def request_key(item: BatchItem) -> str:
    return f"{item.id}:{item.lease_token}"


def cache_scope(item: BatchItem) -> str:
    """Prefix reuse stays within one organization, and one deployment for private batches."""
    if item.deployment_id_key:
        return f"{item.org_id_key}:{item.deployment_id_key}"
    return item.org_id_key


class _LineReader:
    """One open, decrypting stream over a batch's input file, read forward line by line."""

    def __init__(self, file: File) -> None:
        self.file = file
        self.pieces: Iterator[bytes] | None = None
        self.buffer = bytearray()
        self.base = 0  # file offset of buffer[0]

    def read(self, offset: int, length: int) -> bytes:
        end = self.base + len(self.buffer)
        if self.pieces is None or offset < self.base or offset - end > REOPEN_GAP:
            self.pieces = file_read_range(file=self.file, start=offset, end=self.file.bytes - 1)
            self.buffer = bytearray()
            self.base = offset
        while self.base + len(self.buffer) < offset + length:
            piece = next(self.pieces, None)
            if piece is None:
                break
            self.buffer += piece
        start = offset - self.base
        line = bytes(self.buffer[start : start + length])
        del self.buffer[: start + length]
        self.base = offset + length
        return line


class Preparer:
    """Prepares the claimed groups of items of one revision for its engine."""

    def __init__(
        self,
        *,
        revision_id: str,
        tokenizer: Any,
        media_layout: MediaLayout | None = None,
        tokenize: bool = True,
    ) -> None:
        """`tokenize`: False for a revision whose server is sent each row's body (an external
        engine): its rows carry no prompt ids, only the body and the deadline."""
        self.revision_id = revision_id
        self.tokenizer = tokenizer
        self.tokenize = tokenize
        self.layout = media_layout  # None: a text-only engine
        self._media = MediaResolver(media_layout) if media_layout is not None else None
        self._readers: OrderedDict[str, _LineReader] = OrderedDict()
        self._sections: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()

    def prepared(self, claimed: list[BatchItem]) -> Iterator[Prepared | Unpreparable]:
        """A claimed group, each item ready for the engine or unpreparable, in file order
        within each batch (the streams read forward only).

        Text items one at a time, so the first reaches the engine while the rest of its group
        is still read and tokenized (at a run's start the engine waited for a whole group);
        media items as a group, whose fetches and decodes run in parallel.
        """
        items = sorted(claimed, key=lambda i: (i.batch_id, i.index))
        if self._media is None:
            for item in items:
                body = self._read(item)
                yield body if isinstance(body, Unpreparable) else self._prepare(item, body, [])
            return
        bodies = [self._read(item) for item in items]
        parts = [
            [] if isinstance(b, Unpreparable) else media_parts(b.get("messages") or [])
            for b in bodies
        ]
        resolved = self._media.resolve_many(parts)
        for item, body, media in zip(items, bodies, resolved, strict=True):
            if isinstance(body, Unpreparable):
                yield body
            elif isinstance(media, MediaError):
                logger.info("item %s: %s (%s)", item.pk, media.code, media.reason)
                yield Unpreparable(item, media.code)
            else:
                yield self._prepare(item, body, media)

    def close(self) -> None:
        if self._media is not None:
            self._media.close()

    def _read(self, item: BatchItem) -> dict[str, Any] | Unpreparable:
        try:
            return self._body(item)
        except Exception as exc:
            # Type and frames only: a message could quote the request's content.
            logger.error("item %s could not be read: %s", item.pk, exception_trace(exc))
            self._readers.pop(item.batch_id, None)
            return Unpreparable(item)

    def _prepare(
        self, item: BatchItem, body: dict[str, Any], media: list[DecodedMedia]
    ) -> Prepared | Unpreparable:
        try:
            inputs: list[MediaInput] = []
            # A prompt surely longer than the context is rendered, never tokenized: tokenizing
            # costs ~100x the text, and the engine could only refuse it (inference/prompt_bounds).
            context = self._context_length()
            if not self.tokenize:
                # The server checks the context and counts the prompt; rendering and
                # tokenizing here was most of a row's preparation (benchmarks/external.py).
                ids = []
            elif self.layout is None:
                found = bounded_prompt_ids(self.tokenizer, body, context_length=context)
                if found is None:
                    return self._over_context(item)
                ids = found
            else:
                if over_context(self.tokenizer, body, context_length=context):
                    return self._over_context(item)
                counts = [m.placeholders for m in media]
                rendered = media_prompt(self.tokenizer, body, layout=self.layout, counts=counts)
                ids = rendered.ids
                inputs = [
                    MediaInput(m.modality, m.value, m.digest, start, length)
                    for m, (start, length) in zip(media, rendered.spans, strict=True)
                ]
            request = GenerationRequest(
                request_key(item),
                ids,
                sampling_params(body, tokenizer=self.tokenizer, prompt=ids),
                cache_scope=cache_scope(item),
                media=inputs,
                # What an external engine sends (inference/external/engine.py), and when the
                # row may no longer be sent: the batch's expiry. Local engines use the ids.
                body=body,
                deadline=item.batch.expires_at.timestamp(),
            )
        except PlaceholderMismatch:
            # The template lost a part, or a placeholder is quoted where it cannot be escaped.
            logger.info("item %s: invalid_media (placeholders)", item.pk)
            return Unpreparable(item, ItemCode.INVALID_MEDIA)
        except Exception as exc:
            # Type and frames only: a message could quote the request's content.
            logger.error("item %s could not be prepared: %s", item.pk, exception_trace(exc))
            return Unpreparable(item)
        return Prepared(item, request)

    def _over_context(self, item: BatchItem) -> Unpreparable:
        logger.info("item %s: context_length_exceeded (found before tokenizing)", item.pk)
        return Unpreparable(item, ItemCode.CONTEXT_LENGTH_EXCEEDED)

    def _context_length(self) -> int:
        """The context of this key's revision (revisions are immutable: read once a process)."""
        revision_id = self.revision_id
        context = _contexts.get(revision_id)
        if context is None:
            context = _contexts[revision_id] = ModelRevision.objects.values_list(
                "context_length", flat=True
            ).get(pk=revision_id)
        return context

    def _body(self, item: BatchItem) -> dict[str, Any]:
        line = self._reader(item).read(item.line_offset, item.line_length)
        body = orjson.loads(line)["body"]
        if item.section_offset is not None:
            body = effective_body(self._section(item, item.section_offset), body)
        return body

    def _section(self, item: BatchItem, offset: int) -> dict[str, Any]:
        """The parsed body of a sectioned item's section line, read once per batch.

        A section lies above its requests, behind the forward-only stream: it is read on its
        own, then kept (sections are few and shared by many items).
        """
        key = (item.batch_id, offset)
        section = self._sections.get(key)
        if section is None:
            (line,) = file_iter_lines(
                file=item.batch.input_file, spans=[(offset, item.section_length)]
            )
            section = self._sections[key] = orjson.loads(line)["body"]
            while len(self._sections) > SECTIONS:
                self._sections.popitem(last=False)
        self._sections.move_to_end(key)
        return section

    def _reader(self, item: BatchItem) -> _LineReader:
        reader = self._readers.get(item.batch_id)
        if reader is None:
            reader = self._readers[item.batch_id] = _LineReader(item.batch.input_file)
            while len(self._readers) > OPEN_FILES:
                self._readers.popitem(last=False)
        self._readers.move_to_end(item.batch_id)
        return reader
