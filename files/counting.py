"""Prompt tokens of an input file, counted at the upload.

Tokenizing costs about half a second per MB. A small file (UPLOAD_COUNT_INLINE_BYTES, 256 KiB
by default) is counted inside the upload's request (`file_count_on_upload`), so that a create
sent right after the upload's answer finds its counts: counted by a worker instead, a
256-line file was not counted yet when the create came, and the create counted it again
while the worker did. A larger file stays off the upload's answer: the upload enqueues
`files.tasks.file_count_tokens`, which calls `file_count_prompt_tokens`. Acceptance and
estimate use the stored counts when they are for the revision they pin, and count the file
themselves (`file_prompt_tokens`, the same loop) when they are not there yet, the count
failed, or the serving revision has moved on. A prompt surely longer than the revision's
context is counted as context + 1 without being tokenized (inference/prompt_bounds.py), so a
line's count costs about twice the line, not ~100 times.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from jinja2.exceptions import TemplateError

from boardwalk.errors import ServiceUnavailable
from boardwalk.logs import exception_trace
from files.crypto import CryptoError
from files.models import File
from files.services import file_iter_bodies, line_index_span
from inference.prompt_bounds import prompt_token_counts
from inference.selectors import ModelNotUsable, model_resolve
from inference.tokenization import chat_tokenizer_for

logger = logging.getLogger(__name__)

COUNT_CHUNK_LINES = 64
COUNT_CHUNK_BYTES = 4 << 20


def file_prompt_tokens(*, file: File, tokenizer: Any) -> Iterator[tuple[dict[str, Any], int]]:
    """Each line's effective request body and its prompt tokens, in `line_index` order.

    The one loop that counts a file, for acceptance and the background count alike, so the two
    always agree. One sequential decrypting pass (sectioned files: section prefix + request,
    docs/API.md "BatchRouter sectioned input"); memory holds one chunk of lines (COUNT_CHUNK_*).
    Raises what the reader raises for a file deleted or unreadable meanwhile (KeyDestroyed,
    ServiceUnavailable).
    """
    spans = [line_index_span(row) for row in file.line_index or []]
    first = 0  # the line index of the chunk's first body
    # Counted in chunks (one batched encode each); a chunk holds at most this much of the
    # file's lines, or one line.
    chunk: list[dict[str, Any]] = []
    size = 0
    for span, body in zip(spans, file_iter_bodies(file=file, spans=spans), strict=True):
        chunk.append(body)
        size += span[1]
        if len(chunk) >= COUNT_CHUNK_LINES or size >= COUNT_CHUNK_BYTES:
            yield from zip(chunk, _counts(tokenizer, chunk, first), strict=True)
            first += len(chunk)
            chunk, size = [], 0
    if chunk:
        yield from zip(chunk, _counts(tokenizer, chunk, first), strict=True)


class TemplateRefused(Exception):
    """The revision's chat template refused a line's messages (it raised, or ran past the
    render bounds). `index` is the line's position in the file's line index."""

    def __init__(self, index: int) -> None:
        super().__init__(f"line index {index}")
        self.index = index


def _counts(tokenizer: Any, chunk: list[dict[str, Any]], first: int) -> list[int]:
    try:
        return prompt_token_counts(tokenizer, chunk)
    except TemplateError:
        for offset, body in enumerate(chunk):  # which line: the first the template refuses
            try:
                prompt_token_counts(tokenizer, [body])
            except TemplateError:
                raise TemplateRefused(first + offset) from None
        raise


def file_count_prompt_tokens(*, file_id: str) -> bool:
    """Count an input file's prompt tokens for its model's serving revision now, and store them.

    True when this call stored them. False, with nothing written, when there is nothing to do
    or it cannot be done: the file is gone, deleted, already counted or already accepted (its
    batch counted it), its model no longer resolves, or its content cannot be read or counted.
    Acceptance counts whatever is left uncounted, so False costs only that. Safe to repeat:
    the counts are stored by a compare-and-set on `prompt_tokens` still null. Database errors
    propagate (the actor's bounded retries).
    """
    file = (
        File.objects.select_related("org")
        .filter(
            id=file_id,
            purpose=File.Purpose.BATCH,
            status=File.Status.PROCESSED,
            prompt_tokens__isnull=True,
            batch__isnull=True,
        )
        .first()
    )
    if file is None or file.wrapped_key is None:
        return False
    try:
        # The same resolution as the upload's and acceptance's (the file knows its org and
        # model): the serving revision of this moment, which acceptance pins unless it moves.
        revision = model_resolve(org=file.org, name=file.model).revision
    except ModelNotUsable:
        logger.info("prompt tokens of %s not counted: its model does not resolve", file.id)
        return False
    try:
        tokenizer = chat_tokenizer_for(revision)
        counts = [tokens for _, tokens in file_prompt_tokens(file=file, tokenizer=tokenizer)]
    except (CryptoError, ServiceUnavailable) as exc:
        # A delete landed meanwhile (key destroyed, blob gone) or storage is unreadable.
        logger.info("prompt tokens of %s not counted: %s", file.id, exception_trace(exc))
        return False
    except Exception as exc:
        # Type and frames only: a template's or parser's message can quote the prompt. Not
        # re-raised: the same content fails the same way on a retry, and acceptance counts it
        # anyway.
        logger.warning(
            "prompt tokens of %s not counted for %s: %s", file.id, revision.id, exception_trace(exc)
        )
        return False
    stored = File.objects.filter(
        id=file.id, status=File.Status.PROCESSED, prompt_tokens__isnull=True
    ).update(prompt_tokens=counts, prompt_tokens_revision=revision.id)
    if stored:
        logger.info(
            "prompt tokens of %s counted for %s: %s lines", file.id, revision.id, len(counts)
        )
    return bool(stored)


def file_count_on_upload(*, file: File) -> bool:
    """Count a just-stored input file's prompt tokens now, when it is small enough.

    True when counted and stored. False when the file is larger than
    UPLOAD_COUNT_INLINE_BYTES, or the count did not store anything (see
    `file_count_prompt_tokens`) or met a database error (logged by type): the caller then
    leaves the count to a worker, and acceptance counts whatever is still uncounted.
    """
    if file.bytes > settings.UPLOAD_COUNT_INLINE_BYTES:
        return False
    try:
        return file_count_prompt_tokens(file_id=file.id)
    except DatabaseError as exc:
        logger.warning(
            "prompt tokens of %s not counted at upload: %s", file.id, exception_trace(exc)
        )
        return False
