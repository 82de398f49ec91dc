"""Dramatiq actor for input files: takes an id, calls the service, safe to run twice.

Queue "files": the prompt token count after an upload (files.counting). Its own queue, and its
own worker thread in project.worker_runtime, so that a long count never holds up generation
or finalization.
"""

from __future__ import annotations

import dramatiq

from files.counting import file_count_prompt_tokens

COUNT_TIME_LIMIT_MS = 10 * 60 * 1000  # ~0.6 s per MB: the largest input (256 MiB) takes ~3 min


# Few retries: the service answers False (nothing to retry) for a file gone or a count that
# fails on its content; what raises is a database error, worth a retry or two. A message that
# never succeeds only leaves the counting to acceptance, as before.
@dramatiq.actor(
    queue_name="files",
    max_retries=2,
    min_backoff=5_000,
    max_backoff=60_000,
    time_limit=COUNT_TIME_LIMIT_MS,
)
def file_count_tokens(file_id: str) -> None:
    file_count_prompt_tokens(file_id=file_id)
