"""Real answers of POST /v1/chat/completions match its OpenAPI description, plain and
streamed: the conformance run's generated bodies name no usable model (404), so the answers
a running engine gives are checked here."""

from __future__ import annotations

import pytest
import requests
import schemathesis

from tests.batches.conftest import in_process_worker
from tests.batches.test_interactive_recovery import priced

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["in_process_worker", "priced"]  # fixtures

BODY = {
    "model": "boardwalk/tiny-chat",
    "messages": [{"role": "user", "content": "Hello"}],
    "max_completion_tokens": 4,
}


def test_plain_and_streamed_answers_match_the_schema(
    live_server, tenant, priced, in_process_worker, settings
):
    settings.INTERACTIVE_LINGER_SECONDS = 0.5
    schema = schemathesis.openapi.from_url(f"{live_server.url}/v1/openapi.json")
    operation = schema["/v1/chat/completions"]["POST"]
    auth = {"Authorization": f"Bearer {tenant.write_key}"}
    url = f"{live_server.url}/v1/chat/completions"
    plain = requests.post(url, headers=auth, json=BODY, timeout=60)
    assert plain.status_code == 200, plain.text
    operation.validate_response(plain)
    streamed = requests.post(url, headers=auth, json={**BODY, "stream": True}, timeout=60)
    assert streamed.status_code == 200, streamed.text
    assert streamed.headers["Content-Type"].startswith("text/event-stream")
    assert streamed.text.rstrip().endswith("data: [DONE]")
    operation.validate_response(streamed)
    missing = requests.post(url, headers=auth, json={**BODY, "model": "nope"}, timeout=60)
    assert missing.status_code == 404
    operation.validate_response(missing)
