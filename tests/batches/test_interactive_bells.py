"""A chat request to a model a worker holds loaded is served without its wake-up: the worker,
running nothing, answers the revision's bell (batches.interactive.bells). The broker's
wake-up is sent and goes nowhere here, so only the bell can have reached the worker; with
the bells stopped too, nobody takes the request."""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest

from batches.execution import serving_nothing
from batches.interactive.messages import bell_channel
from batches.interactive.tasks import interactive_wake
from boardwalk.channels import channels

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("short_linger")]

MESSAGES = [{"role": "user", "content": "Hello there"}]


def idle_worker() -> None:
    """Wait until the worker's run for the first chat has ended (its linger is short)."""
    deadline = time.monotonic() + 30
    while not serving_nothing():
        assert time.monotonic() < deadline, "the worker's run never ended"
        time.sleep(0.05)


@pytest.fixture
def lost_wakes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(interactive_wake, "send", lambda *args: sent.append(args))
    return sent


def test_a_model_held_loaded_answers_a_chat_without_its_wake_up(
    sdk, catalog_model, in_process_worker, settings, monkeypatch
):
    settings.INTERACTIVE_QUEUE_SECONDS = 10.0
    # The first chat's wake-up loads the engine; then the worker runs nothing.
    sdk.chat.completions.create(
        model=catalog_model.name, messages=MESSAGES, max_completion_tokens=4
    )
    idle_worker()
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(interactive_wake, "send", lambda *args: sent.append(args))
    served = in_process_worker.bells.served

    reply = sdk.chat.completions.create(
        model=catalog_model.name, messages=MESSAGES, max_completion_tokens=4
    )

    assert reply.usage.completion_tokens > 0
    assert sent == [(catalog_model.revision_id, "")]  # sent, and received by nobody
    assert in_process_worker.bells.served == served + 1
    idle_worker()
    assert channels().length(bell_channel(catalog_model.revision_id)) == 0


def test_without_the_bell_or_the_wake_up_nobody_takes_the_request(
    sdk, catalog_model, in_process_worker, settings, monkeypatch
):
    sdk.chat.completions.create(
        model=catalog_model.name, messages=MESSAGES, max_completion_tokens=4
    )
    idle_worker()
    in_process_worker.bells.stop()
    in_process_worker.bells.join(timeout=10)
    monkeypatch.setattr(interactive_wake, "send", lambda *args: None)
    settings.INTERACTIVE_QUEUE_SECONDS = 1.5

    with pytest.raises(openai.APIStatusError) as refused:
        sdk.chat.completions.create(
            model=catalog_model.name, messages=MESSAGES, max_completion_tokens=4
        )

    assert refused.value.status_code == 503
