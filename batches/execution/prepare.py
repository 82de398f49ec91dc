"""The prepare stage: claim items in groups, read their lines, render and tokenize.

Runs ahead of the engine so that the engine never waits on the database, the store or the
tokenizer while work is queued. Lines are read through one open decrypting stream per batch
file, in file order, so each chunk is decrypted once. (Image and audio fetching plug in here.)
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from batches.items import EngineKey, items_claim_group
from batches.models import BatchItem
from files.models import File
from files.services import file_read_range
from inference.chat_completions import prompt_ids, sampling_params
from inference.engine.types import GenerationRequest

logger = logging.getLogger(__name__)

REOPEN_GAP = 1 << 20  # skip forward by decrypting up to this much; reopen beyond it
OPEN_FILES = 8


@dataclass
class Work:
    """An item ready for the engine: its lease and its request."""

    item: BatchItem
    request: GenerationRequest


@dataclass
class Unpreparable:
    """An item whose line could not be read or rendered: it ends as an internal_error."""

    item: BatchItem


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


class Prepare:
    """Claims and prepares groups of items for one engine key."""

    def __init__(self, *, key: EngineKey, owner: str, tokenizer: Any, group_size: int) -> None:
        self.key = key
        self.owner = owner
        self.tokenizer = tokenizer
        self.group_size = group_size
        self._readers: OrderedDict[str, _LineReader] = OrderedDict()

    def next_group(self, limit: int | None = None) -> tuple[list[Work | Unpreparable], set[str]]:
        """Claim and prepare one group. Returns the prepared items (empty: nothing left to
        claim) and the batches of items the claim ended out of attempts."""
        size = self.group_size if limit is None else min(limit, self.group_size)
        claim = items_claim_group(key=self.key, worker_id=self.owner, limit=size)
        # File order within each batch: the stream reads forward only.
        items = sorted(claim.items, key=lambda i: (i.batch_id, i.index))
        return [self._prepare(item) for item in items], claim.ended_batch_ids

    def _prepare(self, item: BatchItem) -> Work | Unpreparable:
        try:
            line = self._reader(item).read(item.line_offset, item.line_length)
            body = orjson.loads(line)["body"]
            request = GenerationRequest(
                request_key(item),
                prompt_ids(self.tokenizer, body),
                sampling_params(body),
                cache_scope=cache_scope(item),
            )
        except Exception as exc:
            # The type only: a message could quote the request's content.
            logger.error("item %s could not be prepared: %s", item.pk, type(exc).__name__)
            self._readers.pop(item.batch_id, None)
            return Unpreparable(item)
        return Work(item, request)

    def _reader(self, item: BatchItem) -> _LineReader:
        reader = self._readers.get(item.batch_id)
        if reader is None:
            reader = self._readers[item.batch_id] = _LineReader(item.batch.input_file)
            while len(self._readers) > OPEN_FILES:
                self._readers.popitem(last=False)
        self._readers.move_to_end(item.batch_id)
        return reader
