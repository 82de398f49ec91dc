"""Prompt tokens are counted by a worker after the upload (issue 6, item 3), never inside it:
files.counting.file_count_prompt_tokens and its actor files.tasks.file_count_tokens."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from boardwalk.worker_runtime import COUNT_QUEUES, WorkerRuntime
from files.counting import file_count_prompt_tokens
from files.models import File
from files.services import file_shred
from files.tasks import file_count_tokens
from tests.conftest import Api, jsonl, request_line

pytestmark = pytest.mark.django_db

SECRET = "the prompt says swordfish"


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


def test_the_upload_does_not_tokenize_and_enqueues_the_count(
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
