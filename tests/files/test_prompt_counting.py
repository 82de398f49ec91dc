"""Prompt tokens are counted at the upload: a small file inside the upload's
request (files.counting.file_count_on_upload), a larger one by a worker after it
(files.counting.file_count_prompt_tokens and its actor files.tasks.file_count_tokens)."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from django.db import OperationalError

from files.counting import file_count_prompt_tokens
from files.models import File
from files.services import file_shred
from files.tasks import file_count_tokens
from project.worker_runtime import COUNT_QUEUES, WorkerRuntime
from tests.batches.test_create import create
from tests.conftest import Api, jsonl, request_line

pytestmark = pytest.mark.django_db

SECRET = "the prompt says swordfish"


@pytest.fixture(autouse=True)
def counted_by_a_worker(settings: Any) -> None:
    """Most tests here are of the worker's count: no file is counted inside its upload."""
    settings.UPLOAD_COUNT_INLINE_BYTES = 0


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The count messages the upload sends, recorded instead of enqueued."""
    messages: list[tuple[Any, ...]] = []
    monkeypatch.setattr(file_count_tokens, "send", lambda *args: messages.append(args))
    return messages


@pytest.fixture
def tokenized(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every body the counting renders, recorded (it still counts for real)."""
    import files.counting

    bodies: list[dict[str, Any]] = []
    real = files.counting.prompt_token_counts

    def prompt_token_counts(tokenizer: Any, chunk: list[dict[str, Any]]) -> list[int]:
        bodies.extend(chunk)
        return real(tokenizer, chunk)

    monkeypatch.setattr(files.counting, "prompt_token_counts", prompt_token_counts)
    return bodies


def _upload(api: Api, *contents: str) -> File:
    rows = [request_line(f"task-{i}", content=c) for i, c in enumerate(contents)]
    response = api.upload(jsonl(*rows))
    assert response.status_code == 200, response.content
    return File.objects.get(id=response.json()["id"])


def test_an_upload_over_the_inline_size_is_not_tokenized_and_enqueues_the_count(
    api: Api,
    catalog_model: Any,
    sent: list[tuple[Any, ...]],
    tokenized: list[dict[str, Any]],
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        file = _upload(api, "Hello there", "Second")
    assert tokenized == []  # nothing rendered or tokenized while the upload was answered
    assert file.prompt_tokens is None and file.prompt_tokens_revision == ""
    assert sent == [(file.id,)]

    assert file_count_prompt_tokens(file_id=file.id) is True
    file.refresh_from_db()
    assert file.prompt_tokens_revision == catalog_model.revision_id
    assert len(file.prompt_tokens) == 2 and all(count > 0 for count in file.prompt_tokens)
    assert len(tokenized) == 2


def test_a_repeated_count_is_a_no_op(
    api: Api, catalog_model: Any, sent: list[tuple[Any, ...]], tokenized: list[dict[str, Any]]
) -> None:
    file = _upload(api, "Hello there")
    assert file_count_prompt_tokens(file_id=file.id) is True
    file.refresh_from_db()
    counted = (file.prompt_tokens, file.prompt_tokens_revision)
    tokenized.clear()

    assert file_count_prompt_tokens(file_id=file.id) is False
    file_count_tokens.fn(file.id)  # the actor's body, as a redelivered message runs it
    assert tokenized == []  # nothing read or counted again
    file.refresh_from_db()
    assert (file.prompt_tokens, file.prompt_tokens_revision) == counted


def test_a_file_deleted_before_its_count_is_left_alone(
    api: Api, catalog_model: Any, sent: list[tuple[Any, ...]], tokenized: list[dict[str, Any]]
) -> None:
    file = _upload(api, "Hello there")
    file_shred(file=file)
    assert file_count_prompt_tokens(file_id=file.id) is False
    assert file_count_prompt_tokens(file_id="file-gone") is False
    assert tokenized == []
    file.refresh_from_db()
    assert file.prompt_tokens is None


def test_a_file_deleted_while_it_is_counted_stores_nothing(
    api: Api, catalog_model: Any, sent: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import files.counting

    file = _upload(api, "Hello there", "Second")
    real = files.counting.chat_tokenizer_for

    def delete_first(revision: Any) -> Any:
        file_shred(file=File.objects.get(id=file.id))  # the key and the blob go under us
        return real(revision)

    monkeypatch.setattr(files.counting, "chat_tokenizer_for", delete_first)
    assert file_count_prompt_tokens(file_id=file.id) is False
    file.refresh_from_db()
    assert file.status == File.Status.DELETED and file.prompt_tokens is None


def test_a_counter_that_fails_stores_nothing_and_logs_no_content(
    api: Api,
    catalog_model: Any,
    sent: list[tuple[Any, ...]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(tokenizer: Any, bodies: list[dict[str, Any]]) -> list[int]:
        raise RuntimeError(f"template failed on {bodies[0]['messages'][0]['content']}")

    monkeypatch.setattr("files.counting.prompt_token_counts", broken)
    file = _upload(api, SECRET)
    with caplog.at_level(logging.INFO, logger="files.counting"):
        assert file_count_prompt_tokens(file_id=file.id) is False
    assert "RuntimeError" in caplog.text and file.id in caplog.text
    assert "swordfish" not in caplog.text
    file.refresh_from_db()
    assert file.prompt_tokens is None and file.prompt_tokens_revision == ""


def test_the_count_actor_retries_a_bounded_number_of_times() -> None:
    assert file_count_tokens.queue_name in COUNT_QUEUES
    assert 0 <= file_count_tokens.options["max_retries"] <= 3


@pytest.mark.django_db(transaction=True)
def test_the_in_process_worker_counts_an_upload(api: Api, catalog_model: Any) -> None:
    """The embedded default: the upload's message is consumed by the worker inside the process."""
    file = _upload(api, "Hello there", "Second")
    runtime = WorkerRuntime(threads=1, sweep_interval=30.0).start()
    try:
        deadline = time.monotonic() + 60
        while File.objects.get(id=file.id).prompt_tokens is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        runtime.stop()
    file.refresh_from_db()
    assert file.prompt_tokens_revision == catalog_model.revision_id
    assert file.prompt_tokens is not None and len(file.prompt_tokens) == 2


def test_chunked_counting_equals_counting_line_by_line(
    api: Api, catalog_model: Any, sent: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines are counted in batched chunks; chunk edges change nothing."""
    import files.counting
    from inference.chat_completions import prompt_ids
    from inference.tokenization import chat_tokenizer_for

    contents = [f"Line {i}: " + "why " * i for i in range(7)]
    file = _upload(api, *contents)
    tokenizer = chat_tokenizer_for(catalog_model.revision)
    one_by_one = [
        len(prompt_ids(tokenizer, body))
        for body, _ in files.counting.file_prompt_tokens(file=file, tokenizer=tokenizer)
    ]
    monkeypatch.setattr(files.counting, "COUNT_CHUNK_LINES", 3)  # chunks of 3, 3 and 1

    chunked = list(files.counting.file_prompt_tokens(file=file, tokenizer=tokenizer))

    assert [count for _, count in chunked] == one_by_one
    assert [body["messages"][0]["content"] for body, _ in chunked] == contents
    assert len(set(one_by_one)) == 7  # the lines really differ


def test_a_small_upload_is_counted_in_its_request_and_its_create_counts_nothing(
    api: Api,
    catalog_model: Any,
    sent: list[tuple[Any, ...]],
    tokenized: list[dict[str, Any]],
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.UPLOAD_COUNT_INLINE_BYTES = 256 * 1024
    with django_capture_on_commit_callbacks(execute=True):
        file = _upload(api, "Hello there", "Second")
    assert sent == []  # no worker message: nothing left to count
    assert file.prompt_tokens_revision == catalog_model.revision_id
    assert len(file.prompt_tokens) == 2 and all(count > 0 for count in file.prompt_tokens)
    assert len(tokenized) == 2

    response = create(api, file.id)
    assert response.status_code == 200, response.content
    assert len(tokenized) == 2  # the create used the stored counts, read no line again


def test_an_upload_one_byte_over_the_inline_size_is_left_to_a_worker(
    api: Api,
    catalog_model: Any,
    sent: list[tuple[Any, ...]],
    tokenized: list[dict[str, Any]],
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    body = jsonl(request_line("task-0", content="Hello there"))
    settings.UPLOAD_COUNT_INLINE_BYTES = len(body) - 1
    with django_capture_on_commit_callbacks(execute=True):
        response = api.upload(body)
    assert response.status_code == 200, response.content
    file = File.objects.get(id=response.json()["id"])
    assert tokenized == [] and file.prompt_tokens is None
    assert sent == [(file.id,)]


def test_an_inline_count_that_fails_still_answers_the_upload_and_leaves_it_to_a_worker(
    api: Api,
    catalog_model: Any,
    sent: list[tuple[Any, ...]],
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """A database error while counting (the file is already stored) or a count that fails on
    the content: the upload still answers 200 with the file, and a worker gets the count."""
    import files.counting

    settings.UPLOAD_COUNT_INLINE_BYTES = 256 * 1024
    real_count = files.counting.file_count_prompt_tokens

    def database_down(*, file_id: str) -> bool:
        raise OperationalError("connection lost")

    monkeypatch.setattr(files.counting, "file_count_prompt_tokens", database_down)
    with (
        caplog.at_level(logging.WARNING, logger="files.counting"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        first = _upload(api, SECRET)
    assert "OperationalError" in caplog.text and "swordfish" not in caplog.text
    assert first.prompt_tokens is None
    monkeypatch.setattr(files.counting, "file_count_prompt_tokens", real_count)

    def broken(tokenizer: Any, bodies: list[dict[str, Any]]) -> list[int]:
        raise RuntimeError(f"template failed on {bodies[0]['messages'][0]['content']}")

    monkeypatch.setattr("files.counting.prompt_token_counts", broken)
    with django_capture_on_commit_callbacks(execute=True):
        second = _upload(api, SECRET)
    assert second.prompt_tokens is None
    assert sent == [(first.id,), (second.id,)]
    assert "swordfish" not in caplog.text
