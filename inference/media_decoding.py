"""Decoding the media of a row, in the worker only (Pillow, soundfile, soxr; no torch).

Everything here treats its input as hostile: formats are named (no plugin guessing), the pixel
count is checked from the header before any pixel is decoded, the duration before any sample
is, and every failure is one exception type whose message quotes nothing of the media.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from typing import Any

import numpy as np
import soundfile
import soxr
from PIL import Image

IMAGE_FORMATS = ["PNG", "JPEG", "WEBP", "GIF"]
AUDIO_FORMATS = {"wav": "WAV", "mp3": "MP3"}  # the part's `format` → libsndfile's major format
_DATA_URL = re.compile(r"data:image/[A-Za-z0-9.+\-]{1,64};base64,", re.IGNORECASE)

# Pillow only warns between MAX_IMAGE_PIXELS and twice that; a warning here is an error, and
# the limit is lowered to the configured cap by decode_image (a process-wide setting, so it is
# set once and only ever to the same value).
warnings.simplefilter("error", Image.DecompressionBombWarning)


class InvalidMedia(Exception):
    """The part is not a decodable image or clip of an accepted format within the caps."""


def data_url_bytes(url: str, *, max_bytes: int) -> bytes:
    """The bytes of a `data:image/...;base64,` URL."""
    prefix = _DATA_URL.match(url)
    if prefix is None:
        raise InvalidMedia("not a base64 image data URL")
    return base64_bytes(url[prefix.end() :], max_bytes=max_bytes)


def base64_bytes(text: str, *, max_bytes: int) -> bytes:
    if len(text) // 4 * 3 > max_bytes + 2:
        raise InvalidMedia("larger than allowed")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidMedia("not valid base64") from exc
    if len(data) > max_bytes:
        raise InvalidMedia("larger than allowed")
    return data


def decode_image(data: bytes, *, max_pixels: int) -> Any:
    """An RGB `PIL.Image.Image` of the first frame of PNG, JPEG, WebP or GIF `data`."""
    Image.MAX_IMAGE_PIXELS = max_pixels
    try:
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as image:
            width, height = image.size
            if width < 1 or height < 1 or width * height > max_pixels:
                raise InvalidMedia("image larger than allowed")
            image.seek(0)  # the first frame of an animation
            return image.convert("RGB")
    except InvalidMedia:
        raise
    except (
        Image.DecompressionBombError,
        Image.DecompressionBombWarning,
        OSError,
        ValueError,
        SyntaxError,  # raised by some Pillow parsers on malformed headers
        EOFError,
    ) as exc:
        raise InvalidMedia(f"not a decodable image ({type(exc).__name__})") from exc


def decode_audio(data: bytes, audio_format: str, *, sampling_rate: int, max_seconds: int) -> Any:
    """Mono float32 samples at `sampling_rate` of wav or mp3 `data`, at most `max_seconds`."""
    expected = AUDIO_FORMATS.get(audio_format)
    if expected is None:
        raise InvalidMedia("unsupported audio format")
    try:
        info = soundfile.info(io.BytesIO(data))
        if info.format != expected:
            raise InvalidMedia("the audio is not in the format the part names")
        if info.samplerate < 1 or info.frames > info.samplerate * max_seconds:
            raise InvalidMedia("audio longer than allowed")
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except InvalidMedia:
        raise
    except (soundfile.LibsndfileError, RuntimeError, ValueError, TypeError) as exc:
        raise InvalidMedia(f"not decodable audio ({type(exc).__name__})") from exc
    # A frame count in the header can be wrong (mp3): the decoded length decides.
    if len(samples) == 0 or len(samples) > rate * max_seconds:
        raise InvalidMedia("audio empty or longer than allowed")
    mono = samples.mean(axis=1)
    if rate != sampling_rate:
        mono = soxr.resample(mono, rate, sampling_rate)
    if not np.isfinite(mono).all():
        raise InvalidMedia("audio holds non-finite samples")
    return np.ascontiguousarray(mono, dtype=np.float32)
