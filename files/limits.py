"""Limits of docs/API.md "Limits, retention and privacy", in one place."""

from __future__ import annotations

import datetime as dt

MiB = 1024 * 1024
GiB = 1024 * MiB

MAX_INPUT_BYTES = 256 * MiB
MAX_INPUT_LINES = 1000
MAX_LINE_BYTES = 20 * MiB
MAX_RESULT_FILE_BYTES = 20 * MiB
MAX_RETAINED_INPUT_BYTES = GiB  # per organization
UNUSED_INPUT_TTL = dt.timedelta(hours=24)
ACCEPTED_INPUT_TTL = dt.timedelta(hours=48)
RESULT_TTL = dt.timedelta(days=7)
