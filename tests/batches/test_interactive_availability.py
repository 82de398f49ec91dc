"""Interactive availability: a worker lingering on one model gives itself up to another
model's waiting request, and a prompt's cost to the web tier is bounded (the org's slot is
taken before it is counted, and a prompt surely over the context is never tokenized)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from batches.interactive import service
from billing.models import LedgerEntry
from inference.prompt_bounds import prompt_char_limit
from inference.services import catalog_model_create, revision_create
from inference.tokenization import chat_tokenizer_for
from tests.conftest import INTERACTIVE_PRICES, PRICES, demo_revision_fields

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("short_linger")]

MESSAGES = [{"role": "user", "content": "Hello there"}]


@pytest.fixture
def second_model(catalog_model, tiny_model_dir: Path):
    """Another model (its own revision, so its own engine key) a worker can serve."""
    revision = revision_create(**demo_revision_fields(tiny_model_dir, "tiny"))
    return catalog_model_create(
        name="boardwalk/tiny-chat-2",
        revision=revision,
        prices=PRICES,
        interactive_prices=INTERACTIVE_PRICES,
    )


def test_a_second_model_is_served_while_the_worker_lingers_on_the_first(
    sdk, catalog_model, second_model, in_process_worker, settings
):
    # One engine thread; the first model's run would linger longer than the second's
    # request waits for a worker (it answered 503 after its queue wait, every time).
    settings.INTERACTIVE_LINGER_SECONDS = 8.0
    settings.INTERACTIVE_QUEUE_SECONDS = 6.0
    first = sdk.chat.completions.create(
        model=catalog_model.name, messages=MESSAGES, max_completion_tokens=4
    )
    second = sdk.chat.completions.create(
        model=second_model.name, messages=MESSAGES, max_completion_tokens=4
    )

    assert first.choices[0].finish_reason in ("stop", "length")
    assert second.model == second_model.name
    assert second.system_fingerprint == second_model.revision_id
    assert second.usage.completion_tokens > 0
    settings.INTERACTIVE_LINGER_SECONDS = 0.5  # the run ends before teardown


class Spy:
    """Delegates to the real function and records that it ran."""

    def __init__(self, real: Any) -> None:
        self.real, self.calls = real, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.real(*args, **kwargs)


class CountingBackend:
    """A tokenizer backend that counts its encodes (and delegates everything)."""

    def __init__(self, real: Any) -> None:
        self.real, self.encodes = real, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def encode(self, *args: Any, **kwargs: Any) -> Any:
        self.encodes += 1
        return self.real.encode(*args, **kwargs)


def test_a_prompt_surely_over_the_context_is_refused_without_being_tokenized(
    sdk, catalog_model, tenant, monkeypatch
):
    tokenizer = chat_tokenizer_for(catalog_model.revision)
    # The bound is found once per tokenizer, on its real backend, before the count starts.
    assert prompt_char_limit(tokenizer, catalog_model.revision.context_length) is not None
    counting = CountingBackend(tokenizer.backend)
    monkeypatch.setattr(tokenizer, "backend", counting)
    huge = [{"role": "user", "content": "word " * 180_000}]  # 900 KB

    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(
            model=catalog_model.name, messages=huge, max_completion_tokens=4
        )

    assert refused.value.code == "context_length_exceeded"
    assert counting.encodes == 0
    assert not LedgerEntry.objects.filter(org=tenant.org).exclude(kind="grant").exists()


def test_an_org_at_its_concurrency_limit_is_refused_before_its_prompt_is_counted(
    sdk, catalog_model, tenant, settings, monkeypatch
):
    settings.INTERACTIVE_MAX_CONCURRENT = 0
    spy = Spy(service.bounded_prompt_ids)
    monkeypatch.setattr(service, "bounded_prompt_ids", spy)

    with pytest.raises(openai.RateLimitError) as limited:
        sdk.chat.completions.create(
            model=catalog_model.name,
            messages=[{"role": "user", "content": "word " * 180_000}],
            max_completion_tokens=4,
        )

    assert limited.value.code == "rate_limit_exceeded"
    assert spy.calls == 0
    assert not LedgerEntry.objects.filter(org=tenant.org).exclude(kind="grant").exists()


@pytest.fixture
def own_copy(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A copy of the tiny model's directory this test may break after its revision exists."""
    copy = tmp_path / "tiny-copy"
    shutil.copytree(tiny_model_dir, copy)
    return copy


def _catalog(name: str, directory: Path):
    revision = revision_create(**demo_revision_fields(directory, "tiny"))
    return catalog_model_create(
        name=name, revision=revision, prices=PRICES, interactive_prices=INTERACTIVE_PRICES
    )


def test_a_model_whose_weights_fail_to_load_answers_model_load_failed_at_once(
    sdk, tenant, own_copy, in_process_worker, settings
):
    settings.INTERACTIVE_QUEUE_SECONDS = 60.0  # it used to wait all of it, then 503
    model = _catalog("boardwalk/broken", own_copy)
    weights = own_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as failed:
        sdk.chat.completions.create(model=model.name, messages=MESSAGES, max_completion_tokens=4)

    assert failed.value.status_code == 503 and failed.value.code == "model_load_failed"
    assert time.monotonic() - started < 50
    ledger = LedgerEntry.objects.filter(org=tenant.org).exclude(kind="grant")
    assert not ledger.filter(kind="charge", amount_microusd__gt=0).exists()
    assert sorted(ledger.values_list("kind", flat=True)) == ["charge", "hold", "release"]


def test_messages_the_chat_template_refuses_are_a_400_naming_why(sdk, tenant, own_copy):
    model = _catalog("boardwalk/picky", own_copy)
    config_path = own_copy / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = (
        "{%- if 'forbidden' in messages[-1]['content'] -%}"
        "{{ raise_exception('the last message may not say that word') }}{%- endif -%}"
        + config["chat_template"]
    )
    config_path.write_text(json.dumps(config))

    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(
            model=model.name,
            messages=[{"role": "user", "content": "a forbidden word"}],
            max_completion_tokens=4,
        )

    assert refused.value.code == "invalid_request" and refused.value.param == "messages"
    assert "may not say that word" in refused.value.body["message"]
    assert not LedgerEntry.objects.filter(org=tenant.org).exclude(kind="grant").exists()
