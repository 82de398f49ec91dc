"""Prompt tokens are counted at the upload (here as a worker counts a file too large to count
inside its upload, UPLOAD_COUNT_INLINE_BYTES = 0): acceptance and
estimate read the counts from the File row, and count again only when the pinned revision is
not the one counted for, or when there are no counts (not counted yet, or the count failed)."""

from __future__ import annotations

from typing import Any

import pytest

from batches.models import Batch, BatchItem
from batches.services import _count_items
from billing.models import LedgerEntry
from files import storage
from files.counting import file_count_prompt_tokens
from files.models import File
from inference.models import CatalogModel
from inference.services import catalog_model_set_revision, revision_create
from inference.tokenization import chat_tokenizer_for
from tests.batches.test_create import create, submission
from tests.batches.test_sectioned_batches import SECTIONED, sectioned_file
from tests.conftest import PRICES, Api, jsonl, request_line

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def counted_by_a_worker(settings: Any) -> None:
    settings.UPLOAD_COUNT_INLINE_BYTES = 0


# A template that renders every message twice: the same file counts about twice the tokens.
DOUBLING_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
    "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
)


@pytest.fixture
def store_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The real local content store, with each read of a blob recorded."""
    reads: list[str] = []
    original = storage.FileSystemContentStore.read

    def read(self: storage.FileSystemContentStore, name: str, offset: int, length: int) -> bytes:
        reads.append(name)
        return original(self, name, offset, length)

    monkeypatch.setattr(storage.FileSystemContentStore, "read", read)
    return reads


def _upload(api: Api, content: bytes, *, count: bool = True) -> File:
    """Upload, then run what the upload's file_count_tokens message runs on a worker."""
    response = api.upload(content)
    assert response.status_code == 200, response.content
    file_id = response.json()["id"]
    if count:
        assert file_count_prompt_tokens(file_id=file_id) is True
    return File.objects.get(id=file_id)


def _counted_now(file: File, catalog_model: CatalogModel) -> list[int]:
    """Today's acceptance path: decrypt every line and count with the current revision."""
    catalog_model.refresh_from_db()
    tokenizer = chat_tokenizer_for(catalog_model.revision)
    return [item.prompt_tokens for item in _count_items(file, tokenizer)]


def _rows() -> bytes:
    return jsonl(
        request_line("a", content="Hello there"),
        request_line("b", content="A longer question about signing in " * 20, n=2),
        request_line("c", content="Third"),
    )


def test_stored_counts_equal_the_counts_acceptance_would_make(api: Api, catalog_model) -> None:
    file = _upload(api, _rows())
    assert file.prompt_tokens_revision == catalog_model.revision_id
    assert file.prompt_tokens == _counted_now(file, catalog_model)
    assert all(count > 0 for count in file.prompt_tokens)

    response = create(api, file.id)
    assert response.status_code == 200, response.content
    items = BatchItem.objects.filter(batch_id=response.json()["id"]).order_by("index")
    assert [i.prompt_tokens for i in items] == file.prompt_tokens


def test_sectioned_counts_are_of_the_effective_bodies(api: Api, catalog_model) -> None:
    file = _upload(api, sectioned_file(4))
    assert file.prompt_tokens_revision == catalog_model.revision_id
    # Each request is counted with its section's prefix messages
    # (docs/API.md "BatchRouter sectioned input").
    assert file.prompt_tokens == _counted_now(file, catalog_model)
    plain = _upload(api, jsonl(request_line("x", content="Question 0")))
    assert file.prompt_tokens[0] > plain.prompt_tokens[0]

    response = create(api, file.id, metadata=SECTIONED)
    assert response.status_code == 200, response.content
    items = BatchItem.objects.filter(batch_id=response.json()["id"]).order_by("index")
    assert [i.prompt_tokens for i in items] == file.prompt_tokens


def test_estimate_and_create_read_no_content_when_the_counts_match(
    api: Api, catalog_model, store_reads: list[str], django_assert_max_num_queries: Any
) -> None:
    file = _upload(api, _rows())
    store_reads.clear()

    with django_assert_max_num_queries(12):
        estimate = api.post("/v1/batches/estimate", submission(file.id))
    assert estimate.status_code == 200, estimate.content
    assert estimate.json()["prompt_tokens"] == sum(file.prompt_tokens)
    response = create(api, file.id)
    assert response.status_code == 200, response.content
    assert store_reads == []  # nothing decrypted: the counts came from the File row


def test_revision_change_after_upload_recounts_and_holds_for_the_new_revision(
    api: Api, catalog_model, store_reads: list[str]
) -> None:
    file = _upload(api, _rows())
    old_revision = catalog_model.revision
    new = revision_create(
        label="v2-doubling",
        weights=old_revision.weights,
        context_length=old_revision.context_length,
        modalities=["text"],
        chat_template=DOUBLING_TEMPLATE,
    )
    catalog_model_set_revision(model=catalog_model, revision=new)
    expected = _counted_now(file, catalog_model)
    assert expected != file.prompt_tokens  # the new template counts differently
    store_reads.clear()

    estimate = api.post("/v1/batches/estimate", submission(file.id)).json()
    assert estimate["model_config_id"] == new.id
    assert estimate["prompt_tokens"] == sum(expected)
    assert store_reads  # counted again from the stored file

    response = create(api, file.id)
    assert response.status_code == 200, response.content
    batch = Batch.objects.get(id=response.json()["id"])
    assert batch.revision_id == new.id
    items = list(BatchItem.objects.filter(batch=batch).order_by("index"))
    assert [i.prompt_tokens for i in items] == expected

    def hold_of(counts: list[int]) -> int:
        return sum(
            -(-(count * PRICES[0] + i.max_tokens * i.n * PRICES[2]) // 1_000_000)
            for count, i in zip(counts, items, strict=True)
        )

    assert batch.hold_microusd == hold_of(expected) == int(estimate["max_charge_microusd"])
    assert hold_of(expected) != hold_of(file.prompt_tokens)
    assert LedgerEntry.objects.get(batch_id=batch.id, kind="hold").amount_microusd == hold_of(
        expected
    )


def test_a_counter_that_fails_leaves_counting_to_acceptance(
    api: Api, catalog_model, monkeypatch: pytest.MonkeyPatch, store_reads: list[str]
) -> None:
    def broken(tokenizer: Any, bodies: list[dict[str, Any]]) -> list[int]:
        raise RuntimeError("template failed")

    file = _upload(api, _rows(), count=False)
    with monkeypatch.context() as patched:
        patched.setattr("files.counting.prompt_token_counts", broken)
        assert file_count_prompt_tokens(file_id=file.id) is False
    file.refresh_from_db()
    assert file.prompt_tokens is None and file.prompt_tokens_revision == ""
    store_reads.clear()

    response = create(api, file.id)
    assert response.status_code == 200, response.content
    items = BatchItem.objects.filter(batch_id=response.json()["id"]).order_by("index")
    assert [i.prompt_tokens for i in items] == _counted_now(file, catalog_model)
    assert store_reads


def test_create_before_the_count_has_run_counts_itself(
    api: Api, catalog_model, store_reads: list[str]
) -> None:
    file = _upload(api, _rows(), count=False)
    expected = _counted_now(file, catalog_model)
    store_reads.clear()

    response = create(api, file.id)
    assert response.status_code == 200, response.content
    items = BatchItem.objects.filter(batch_id=response.json()["id"]).order_by("index")
    assert [i.prompt_tokens for i in items] == expected
    assert store_reads  # counted from the stored file, as before the background count
    # The message that arrives afterwards finds the file accepted: nothing left to do.
    assert file_count_prompt_tokens(file_id=file.id) is False


def test_a_prompt_longer_than_the_context_counts_one_over_and_fails_before_the_engine(
    api: Api, catalog_model, caplog: pytest.LogCaptureFixture
) -> None:
    """A prompt whose text surely holds more tokens than the context is counted as
    context + 1 (never tokenized), held for that, and failed by the worker, uncharged."""
    from tests.batches.conftest import finalize, run_worker

    context = catalog_model.revision.context_length
    # Over 13 characters a token (the demo tokenizer's longest entry) times the context.
    huge = "lorem ipsum " * (13 * context // 12 + 10)
    file = _upload(api, jsonl(request_line("ok"), request_line("huge", content=huge)))
    assert file.prompt_tokens[1] == context + 1
    assert file.prompt_tokens == _counted_now(file, catalog_model)  # acceptance agrees

    estimate = api.post("/v1/batches/estimate", submission(file.id)).json()
    assert estimate["prompt_tokens"] == file.prompt_tokens[0] + context + 1
    response = create(api, file.id)
    assert response.status_code == 200, response.content
    batch_id = response.json()["id"]
    assert Batch.objects.get(id=batch_id).hold_microusd == int(estimate["max_charge_microusd"])

    with caplog.at_level("INFO", logger="batches.execution.prepare"):
        run_worker(batch_id)
    assert "context_length_exceeded (found before tokenizing)" in caplog.text
    batch = finalize(batch_id)
    assert batch is not None and (batch.completed, batch.failed) == (1, 1)
    huge_item = BatchItem.objects.get(batch_id=batch_id, index=1)
    assert huge_item.error_code == "context_length_exceeded"
    assert huge_item.charge_microusd == 0
    ok_item = BatchItem.objects.get(batch_id=batch_id, index=0)
    assert batch.charge_microusd == ok_item.charge_microusd > 0
