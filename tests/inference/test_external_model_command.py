"""`manage.py model` with an external engine (issue 41, first slice): a revision answered by
an OpenAI-compatible server, with a local tokenizer directory (config, tokenizer, chat
template; no weights). Checked against a real `transformers serve` serving the tiny demo model
built locally, and a fault-injecting proxy for the refusals a real server does not give.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from batches.execution import run as run_module
from batches.models import BatchItem
from billing.models import UsageEvent
from inference.engine.loading import ModelLoadError
from inference.models import CatalogModel, Deployment, ModelRevision
from inference.rendering import render_prompt
from inference.runtime import (
    ExternalRevision,
    engine_drop,
    engine_for,
    revision_check,
    tokenizer_for,
)
from tests.batches.conftest import finalize, rows, run_worker, submit
from tests.conftest import PRICES, Api, Tenant, content_of, jsonl, parse_jsonl
from tests.inference.test_model_command import model
from tests.inference.test_model_command import refused as refused_with_json
from tests.inference.upstreams import FaultProxy, Served, free_port, serve, status

pytestmark = pytest.mark.django_db

BATCH_PRICES = tuple(
    item
    for flag, price in zip(("input", "cached-input", "output"), PRICES, strict=True)
    for item in (f"--price-{flag}", str(price))
)


def refused(*args: str) -> str:
    """The refusal's message; nothing may have been created, and --json printed it."""
    message, printed = refused_with_json(*args)
    assert printed["error"]["message"] == message
    return message


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(tiny_model_dir, tmp_path_factory.mktemp("serve")) as running:
        yield running


@pytest.fixture(scope="module")
def tokenizer_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What an operator keeps of a model served elsewhere: everything but the weights."""
    target = tmp_path_factory.mktemp("external") / "tokenizer"
    shutil.copytree(tiny_model_dir, target, ignore=shutil.ignore_patterns("*.safetensors"))
    return target


def external(served: Served, tokenizer_dir: Path, *extra: str, url: str | None = None) -> list:
    return [
        "--engine-url", url or served.url, "--engine-model", served.model,
        "--tokenizer", str(tokenizer_dir), *extra,
    ]  # fmt: skip


def test_add_checks_the_server_and_counts_as_a_local_revision_would(
    served, tokenizer_dir, api: Api, catalog_model
):
    added = model(
        "add", "acme/external", *external(served, tokenizer_dir, "--max-in-flight", "16"),
        *BATCH_PRICES, "--check",
    )  # fmt: skip
    assert added["kind"] == "catalog" and added["batch"] is True
    assert added["check"] == {
        "ok": True,
        "url": served.url,
        "model": served.model,
        "context_length": None,  # transformers serve does not say
        "usage_reported": True,
        "completion_tokens": 1,
    }
    assert added["revision"]["engine"] == {
        "url": served.url,
        "model": served.model,
        "api_key_env": "",
        "max_in_flight": 16,
        "gpus": 0,
    }
    revision = ModelRevision.objects.get(id=added["revision"]["id"])
    assert revision.is_external and revision.context_length == 2048  # config.json's
    assert revision.weights == revision.tokenizer == str(tokenizer_dir.resolve())
    assert revision.dialect == "hermes" and revision.modalities == ["text"]
    assert added["inspection"]["weight_bytes"] == 0
    # Uploads are validated and counted with the tokenizer directory, exactly as for the
    # local revision of the same model: the same estimate, token for token.
    estimates = []
    for name in (catalog_model.name, "acme/external"):
        file_id = api.upload(jsonl(*rows(5, model=name))).json()["id"]
        body = {
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        estimate = api.post("/v1/batches/estimate", body)
        assert estimate.status_code == 200, estimate.content
        own = ("model", "model_config_id", "input_file_id")
        estimates.append({k: v for k, v in estimate.json().items() if k not in own})
    assert estimates[0] == estimates[1] and estimates[0]["prompt_tokens"] > 0
    bad = api.upload(jsonl(*rows(1, model="acme/external", max_completion_tokens=10**6)))
    assert bad.status_code == 400


def test_a_batch_on_an_external_revision_is_answered_by_its_server(served, tokenizer_dir, api: Api):
    added = model("add", "acme/external", *external(served, tokenizer_dir), *BATCH_PRICES)
    assert "check" not in added  # without --check nothing asks the server
    revision = ModelRevision.objects.get(id=added["revision"]["id"])
    with pytest.raises(ExternalRevision, match="its server is asked instead"):
        revision_check(revision)  # Boardwalk's engine never loads it: no weights here
    with pytest.raises(ModelLoadError):
        revision_check(revision)
    assert tokenizer_for(revision).chat_template  # the tokenizer is the directory's
    batch = submit(api, rows(3, model="acme/external", max_tokens=4), key="ext-1")
    try:
        run_worker(batch["id"])
    finally:
        engine_drop(revision.id)  # its loop thread and connections end with the test
    done = finalize(batch["id"])
    assert done is not None and done.status == "completed", done and done.errors

    output = parse_jsonl(content_of(api.get(f"/v1/files/{done.output_file_id}/content")))
    assert sorted(r["custom_id"] for r in output) == ["task-0", "task-1", "task-2"]
    for row in output:
        assert row["error"] is None and row["response"]["status_code"] == 200
        body = row["response"]["body"]
        # The server's answer under Boardwalk's names: the id, model and fingerprint.
        assert body["id"].startswith("chatcmpl-") and body["model"] == "acme/external"
        assert body["system_fingerprint"] == revision.id
        (choice,) = body["choices"]
        assert choice["message"]["role"] == "assistant"
        assert isinstance(choice["message"]["content"], str)
        assert 0 < body["usage"]["completion_tokens"] <= 4
        assert body["usage"]["prompt_tokens"] > 0
    # What was billed is what the rows say they used.
    done.refresh_from_db()
    assert done.usage["output_tokens"] == sum(
        r["response"]["body"]["usage"]["completion_tokens"] for r in output
    )
    assert done.usage["input_tokens"] == sum(
        r["response"]["body"]["usage"]["prompt_tokens"] for r in output
    )


def test_a_row_the_server_refuses_still_reports_its_prompt(served, tokenizer_dir, api: Api):
    """The worker sends an external revision's rows untokenized (the server counts them);
    one that fails at the server is counted here, so its item reads as a local row's."""
    refusal = {"error": {"message": "maximum context length is 8 tokens", "code": None}}
    with FaultProxy(served.url.removesuffix("/v1")) as upstream:
        upstream.plan(status(400, body=refusal))
        added = model(
            "add", "acme/external", *external(served, tokenizer_dir, url=upstream.url),
            *BATCH_PRICES,
        )  # fmt: skip
        revision = ModelRevision.objects.get(id=added["revision"]["id"])
        batch = submit(api, rows(1, model="acme/external", max_tokens=4), key="ext-refused")
        try:
            run_worker(batch["id"])
        finally:
            engine_drop(revision.id)
    done = finalize(batch["id"])
    assert done is not None and done.status == "completed"
    (row,) = parse_jsonl(content_of(api.get(f"/v1/files/{done.error_file_id}/content")))
    assert row["error"]["code"] == "context_length_exceeded"
    (item,) = BatchItem.objects.filter(batch_id=batch["id"])
    body = rows(1, model="acme/external", max_tokens=4)[0]["body"]
    prompt = render_prompt(tokenizer_for(revision), body["messages"], None, {})
    assert item.usage_prompt_tokens == len(prompt) > 0
    # A failed row's tokens are not charged or metered as tokens (docs/BILLING.md).
    assert not UsageEvent.objects.filter(batch_id=batch["id"], kind="input_tokens").exists()


def test_an_external_revisions_rows_are_claimed_as_many_as_it_takes_in_flight(
    served, tokenizer_dir, api: Api, monkeypatch, settings
):
    claimed: list[int] = []
    real = run_module.items_claim_group

    def recorded(**options):
        claimed.append(options["limit"])
        return real(**options)

    monkeypatch.setattr(run_module, "items_claim_group", recorded)
    settings.EXECUTION_CLAIM_GROUP = 4
    added = model(
        "add", "acme/external", *external(served, tokenizer_dir, "--max-in-flight", "12"),
        *BATCH_PRICES,
    )  # fmt: skip
    batch = submit(api, rows(12, model="acme/external", max_tokens=2), key="ext-group")
    try:
        run_worker(batch["id"])
    finally:
        engine_drop(added["revision"]["id"])
    assert finalize(batch["id"]).status == "completed"
    assert claimed[0] == 12  # the revision's in-flight bound, not the setting's 4


def test_inspect_with_an_engine_url_asks_the_server(served, tokenizer_dir):
    found = model(
        "inspect", str(tokenizer_dir), "--engine-url", served.url, "--engine-model", served.model
    )
    assert found["engine"]["url"] == served.url and found["check"]["ok"] is True
    assert found["context_length"] == 2048 and found["dialect"] == "hermes"
    assert any("answered by the external engine" in note for note in found["notes"])


def test_the_servers_context_length_caps_the_revisions(served, tokenizer_dir):
    """vLLM and SGLang list `max_model_len`: the revision serves no more than that."""
    listing = {"object": "list", "data": [{"id": served.model, "max_model_len": 1024}]}
    with FaultProxy(served.url.removesuffix("/v1")) as vllm_like:
        vllm_like.plan(status(200, body=listing, path="/models"))
        added = model(
            "add", "acme/capped", *external(served, tokenizer_dir, url=vllm_like.url), "--check"
        )
        assert added["check"]["context_length"] == 1024
        assert added["revision"]["context_length"] == 1024
        vllm_like.plan(status(200, body=listing, path="/models"))
        message = refused(
            "add", "acme/longer", *external(served, tokenizer_dir, url=vllm_like.url),
            "--context-length", "2000", "--check",
        )  # fmt: skip
    assert "between 1 and 1024 (what the server serves)" in message


def test_a_private_deployment_on_an_external_engine_declares_its_gpus(
    served, tokenizer_dir, tenant: Tenant
):
    deployment = ("--deployment", "--org", tenant.org.name, "--gpu-second-price", "7")
    message = refused("add", "acme/private", *external(served, tokenizer_dir), *deployment)
    assert "give --gpus N" in message
    added = model(
        "add", "acme/private", *external(served, tokenizer_dir, "--gpus", "8"), *deployment
    )
    assert added["kind"] == "deployment" and added["revision"]["engine"]["gpus"] == 8
    assert Deployment.objects.get(name="acme/private").revision.engine_gpus == 8
    listed = model("list")["deployments"]
    assert [d["revision"]["engine"]["url"] for d in listed] == [served.url]


def test_set_revision_moves_a_name_onto_an_external_engine(served, tokenizer_dir, catalog_model):
    changed = model("set-revision", catalog_model.name, *external(served, tokenizer_dir))
    assert changed["revision"]["engine"]["model"] == served.model
    assert CatalogModel.objects.get(pk=catalog_model.pk).revision.is_external


# -- every refusal of `add --check`, each naming what to change ----------------------------


def test_check_refuses_an_unreachable_url(tokenizer_dir, served):
    url = f"http://127.0.0.1:{free_port()}/v1"
    message = refused("add", "acme/x", *external(served, tokenizer_dir, url=url), "--check")
    assert message.startswith(f"--check: cannot reach {url}/models")
    assert "is --engine-url right?" in message


def test_check_refuses_a_server_that_is_not_openai_compatible(tokenizer_dir, served):
    with FaultProxy(None) as not_openai:  # answers 404 to everything
        message = refused(
            "add", "acme/x", *external(served, tokenizer_dir, url=not_openai.url), "--check"
        )
        assert f"not an OpenAI-compatible server: GET {not_openai.url}/models answered 404" in (
            message
        )
        not_openai.plan(status(200, body={"hello": "world"}, path="/models"))
        message = refused(
            "add", "acme/x", *external(served, tokenizer_dir, url=not_openai.url), "--check"
        )
        assert "answered no model list" in message
        bare = not_openai.url.removesuffix("/v1")
        message = refused("add", "acme/x", *external(served, tokenizer_dir, url=bare), "--check")
        assert "(the URL usually ends in /v1)" in message


def test_check_refuses_a_model_the_server_does_not_serve(tokenizer_dir, served):
    message = refused(
        "add", "acme/x", "--engine-url", served.url, "--engine-model", "acme/nope",
        "--tokenizer", str(tokenizer_dir), "--check",
    )  # fmt: skip
    assert f"does not serve 'acme/nope'; it serves: {served.model}" in message


def test_check_refuses_a_bad_or_missing_api_key(tokenizer_dir, served, monkeypatch):
    """transformers serve takes no key: a proxy in front of it answers 401 without the
    right one."""
    with FaultProxy(served.url.removesuffix("/v1"), api_key="sk-right") as guarded:
        args = external(served, tokenizer_dir, url=guarded.url)
        message = refused("add", "acme/x", *args, "--check")
        assert "asks for an API key (401)" in message and "--engine-api-key-env" in message
        monkeypatch.setenv("EXT_TEST_KEY", "sk-wrong")
        message = refused("add", "acme/x", *args, "--engine-api-key-env", "EXT_TEST_KEY", "--check")
        assert "refused the API key in EXT_TEST_KEY (401)" in message
        assert "sk-wrong" not in message
        monkeypatch.delenv("EXT_TEST_KEY")
        message = refused("add", "acme/x", *args, "--engine-api-key-env", "EXT_TEST_KEY", "--check")
        assert "EXT_TEST_KEY is not set in this process's environment" in message
        monkeypatch.setenv("EXT_TEST_KEY", "sk-right")
        added = model("add", "acme/x", *args, "--engine-api-key-env", "EXT_TEST_KEY", "--check")
        assert added["check"]["ok"] is True
        assert [s["authorization"] for s in guarded.seen[-2:]] == ["Bearer sk-right"] * 2
    revision = ModelRevision.objects.get(id=added["revision"]["id"])
    assert revision.engine_api_key_env == "EXT_TEST_KEY"
    stored = json.dumps(
        [getattr(revision, f.attname) for f in ModelRevision._meta.fields], default=str
    )
    assert "sk-right" not in stored  # the key is never stored


def test_check_refuses_when_the_one_token_request_fails(tokenizer_dir, served):
    with FaultProxy(served.url.removesuffix("/v1")) as failing:
        failing.plan(status(500, body={"error": {"message": "CUDA error", "code": "oops"}}))
        message = refused(
            "add", "acme/x", *external(served, tokenizer_dir, url=failing.url), "--check"
        )
        assert f"the one-token request to {failing.url}/chat/completions failed with 500" in (
            message
        )
        assert "(oops): CUDA error" in message
        failing.plan(status(200, body={"id": "x"}))
        message = refused(
            "add", "acme/x", *external(served, tokenizer_dir, url=failing.url), "--check"
        )
        assert "answered no chat completion" in message


def test_flags_that_do_not_go_together_are_refused_before_anything_is_asked(
    tokenizer_dir, tiny_model_dir, served
):
    weights = ("--weights", str(tiny_model_dir))
    cases = [
        ((*weights, *external(served, tokenizer_dir)), "--weights and --engine-url exclude"),
        (("--engine-url", served.url, "--tokenizer", str(tokenizer_dir)), "needs --engine-model"),
        (("--engine-url", served.url, "--engine-model", "m"), "needs --tokenizer"),
        ((*weights, "--engine-model", "m"), "--engine-model: only with --engine-url"),
        ((*weights, "--max-in-flight", "4", "--gpus", "2"), "--max-in-flight, --gpus: only"),
        ((*weights, "--engine-api-key-env", "K"), "--engine-api-key-env: only with"),
        ((), "give --weights DIR"),
        ((*external(served, tokenizer_dir), "--dtype", "float16"), "chooses its own"),
        (
            (*external(served, tokenizer_dir), "--tensor-parallel-size", "2"),
            "chooses its own",
        ),
        (
            (*external(served, tokenizer_dir), "--engine-api-key-env", "BOARDWALK_MASTER_KEYS"),
            "one of Boardwalk's own settings",
        ),
        ((*external(served, tokenizer_dir), "--max-in-flight", "0"), "--max-in-flight must be"),
        (
            external(served, tokenizer_dir, url="http://u:sk@127.0.0.1:1/v1"),
            "must not carry credentials",
        ),
        (external(served, tokenizer_dir, url="127.0.0.1:1/v1"), "is not an http(s) URL"),
    ]
    for args, said in cases:
        assert said in refused("add", "acme/x", *args), args


def test_the_tokenizer_directory_is_checked_as_a_models_is(tokenizer_dir, served, tmp_path):
    def broken(drop: str) -> Path:
        target = tmp_path / drop
        shutil.copytree(tokenizer_dir, target)
        (target / drop).unlink()
        return target

    for drop, said in [
        ("config.json", "config.json is missing"),
        ("tokenizer.json", "tokenizer.json is missing"),
    ]:
        message = refused("add", "acme/x", *external(served, broken(drop)))
        assert said in message
    message = refused("add", "acme/x", *external(served, tmp_path / "absent"))
    assert "is not a directory: --tokenizer names the model's tokenizer directory" in message


def test_an_external_model_without_interactive_prices_is_refused_before_anything_is_held(
    served, tokenizer_dir, api: Api
):
    """Interactive requests on an external revision are relayed to its server
    (tests/inference/test_external_interactive.py); one without interactive prices is
    refused as any catalog model without them is."""
    from billing.models import LedgerEntry

    model("add", "acme/external", *external(served, tokenizer_dir), *BATCH_PRICES)
    before = LedgerEntry.objects.count()
    response = api.post(
        "/v1/chat/completions",
        {"model": "acme/external", "messages": [{"role": "user", "content": "Hi"}]},
    )
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "model_not_interactive"
    assert "no interactive prices" in error["message"]
    assert LedgerEntry.objects.count() == before  # nothing held, nothing charged


def test_the_admin_list_says_which_server_answers_a_revision(
    served, tokenizer_dir, tiny_model_dir, client
):
    local = model("add", "acme/local", "--weights", str(tiny_model_dir), *BATCH_PRICES)
    added = model(
        "add", "acme/external", *external(served, tokenizer_dir, "--max-in-flight", "16"),
        *BATCH_PRICES,
    )  # fmt: skip
    client.force_login(User.objects.create_superuser("staff", "staff@example.com", "pw"))

    page = client.get("/admin/inference/modelrevision/").content.decode()

    assert f"external: {served.model} at {served.url} (≤ 16 in flight)" in page
    assert local["revision"]["id"] in page and "workers&#x27; engine" in page
    assert added["revision"]["id"] in page


def test_a_worker_builds_the_external_engine_from_the_settings(served, tokenizer_dir, settings):
    settings.EXTERNAL_REQUEST_TIMEOUT_SECONDS = 42.0
    settings.EXTERNAL_CONNECT_TIMEOUT_SECONDS = 3.0
    settings.EXTERNAL_MAX_ATTEMPTS = 5
    settings.EXTERNAL_MIN_IN_FLIGHT = 2
    added = model(
        "add", "acme/external", *external(served, tokenizer_dir, "--max-in-flight", "8"),
        *BATCH_PRICES,
    )  # fmt: skip
    revision = ModelRevision.objects.get(id=added["revision"]["id"])
    engine = engine_for(revision)
    try:
        assert engine.max_attempts == 5 and engine._floor == 2
        assert (engine.upstream.request_timeout, engine.upstream.connect_timeout) == (42.0, 3.0)
    finally:
        engine_drop(revision.id)
