"""The media of prepared rows: image URLs fetched, every part decoded, in the prepare stage.

Fetches go through boardwalk.outbound (public https addresses only, checked after DNS and on
every redirect, byte cap and total deadline) on a small thread pool, so one slow server costs
its own row at most the fetch time limit and never holds up the engine, which works from the
queue the prepare stage keeps filled. A failed fetch is that row's `image_fetch_failed`; media
that cannot be decoded or is over a cap is its `invalid_media`. Messages and logs never quote
a URL or any media.
"""

from __future__ import annotations

import hashlib
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from boardwalk import outbound
from boardwalk.codes import ItemCode
from boardwalk.logs import exception_trace
from boardwalk.metrics import counter_inc
from inference.media_decoding import (
    InvalidMedia,
    base64_bytes,
    data_url_bytes,
    decode_audio,
    decode_image,
)
from inference.media_layout import MediaLayout
from inference.rendering import MEDIA_PART_TYPES

logger = logging.getLogger(__name__)


class MediaError(Exception):
    """A row's media cannot be used; `code` is the row's error code."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class DecodedMedia:
    modality: str
    value: Any  # RGB PIL image, or float32 samples at the layout's rate
    digest: bytes  # SHA-256 of the media's bytes (prefix cache keys)
    placeholders: int


class MediaResolver:
    """Turns the media parts of many rows into decoded media, rows in parallel."""

    def __init__(self, layout: MediaLayout) -> None:
        self.layout = layout
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, settings.MEDIA_FETCH_THREADS), thread_name_prefix="media"
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def resolve_many(
        self, rows: list[list[dict[str, Any]]]
    ) -> list[list[DecodedMedia] | MediaError]:
        """For each row's media parts, its decoded media or the error that ends the row."""
        futures = [self._pool.submit(self._resolve_row, parts) if parts else None for parts in rows]
        resolved: list[list[DecodedMedia] | MediaError] = [
            [] if future is None else future.result() for future in futures
        ]
        # Counted here, on the prepare thread: the pool threads never touch the database.
        for outcome in resolved:
            if isinstance(outcome, MediaError) and outcome.code == ItemCode.IMAGE_FETCH_FAILED:
                _count_fetch_failure(outcome.reason)
        return resolved

    def _resolve_row(self, parts: list[dict[str, Any]]) -> list[DecodedMedia] | MediaError:
        try:
            return [self._resolve(part) for part in parts]
        except MediaError as exc:
            return exc
        except Exception as exc:  # whatever a hostile input provokes ends its row only
            logger.warning("media of a row could not be used: %s", exception_trace(exc))
            return MediaError(ItemCode.INVALID_MEDIA, "unexpected")

    def _resolve(self, part: dict[str, Any]) -> DecodedMedia:
        modality = MEDIA_PART_TYPES.get(part.get("type", ""))
        if modality != self.layout.modality:
            raise MediaError(
                ItemCode.INVALID_MEDIA, "modality"
            )  # refused at upload; never reaches here
        max_bytes = settings.MEDIA_MAX_BYTES
        try:
            if modality == "image":
                data = self._image_bytes(str(part["image_url"]["url"]), max_bytes)
                value = decode_image(data, max_pixels=settings.MEDIA_MAX_PIXELS)
                count = self.layout.placeholder_count()
            else:
                audio = part["input_audio"]
                data = base64_bytes(str(audio["data"]), max_bytes=max_bytes)
                value = decode_audio(
                    data,
                    str(audio["format"]),
                    sampling_rate=self.layout.sampling_rate,
                    max_seconds=self.layout.max_audio_seconds,
                )
                count = self.layout.placeholder_count(len(value))
        except InvalidMedia as exc:
            raise MediaError(ItemCode.INVALID_MEDIA, "undecodable") from exc
        return DecodedMedia(modality, value, hashlib.sha256(data).digest(), count)

    def _image_bytes(self, url: str, max_bytes: int) -> bytes:
        if url[:5].lower() == "data:":
            return data_url_bytes(url, max_bytes=max_bytes)
        try:
            answer = outbound.request(
                "GET",
                url,
                headers={"Accept": "image/*"},
                max_bytes=max_bytes,
                timeout=settings.MEDIA_FETCH_TIMEOUT_SECONDS,
            )
        except outbound.OutboundError as exc:
            raise MediaError(ItemCode.IMAGE_FETCH_FAILED, exc.reason) from exc
        if answer.status != 200:
            raise MediaError(ItemCode.IMAGE_FETCH_FAILED, "status")
        return answer.body


def _count_fetch_failure(reason: str) -> None:
    logger.info("an image fetch failed (%s)", reason)
    try:
        counter_inc("boardwalk_fetch_failures_total", {"reason": reason})
    except Exception as exc:  # a metric is never worth a row
        logger.warning("fetch failure not counted: %s", exception_trace(exc))
