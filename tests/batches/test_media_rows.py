"""Image and audio rows end to end on the tiny multimodal models (docs/API.md "Images and audio"):
upload → batch → worker (real processor, encoder and model) → output and error files."""

from __future__ import annotations

import base64
import logging
import socket
from pathlib import Path
from typing import Any

import pytest

from batches.models import Batch, BatchItem
from inference.chat_completions import prompt_ids
from inference.models import CatalogModel, ModelRevision
from inference.tokenization import chat_tokenizer_for
from tests.batches.conftest import finalize, run_worker, submit
from tests.conftest import Api, content_of, jsonl, parse_jsonl, request_line
from tests.media_helpers import (
    audio_bytes,
    audio_row,
    data_url,
    https_server,
    image_bytes,
    image_row,
)

pytestmark = pytest.mark.django_db


_runs = iter(range(1_000_000))


def _run(api: Api, rows: list[dict[str, Any]]) -> tuple[Batch, dict[str, dict], dict[str, dict]]:
    data = submit(api, rows, key=f"media-run-{next(_runs)}")
    assert run_worker(data["id"]) == {data["id"]}
    batch = finalize(data["id"])
    assert batch is not None and batch.status == "completed"
    output = _rows(api, batch.output_file_id)
    errors = _rows(api, batch.error_file_id) if batch.error_file_id else {}
    assert sorted([*output, *errors]) == sorted(r["custom_id"] for r in rows)
    return batch, output, errors


def _rows(api: Api, file_id: str) -> dict[str, dict]:
    content = content_of(api.get(f"/v1/files/{file_id}/content"))
    return {row["custom_id"]: row for row in parse_jsonl(content)}


def _codes(errors: dict[str, dict]) -> dict[str, str]:
    return {custom_id: row["error"]["code"] for custom_id, row in errors.items()}


def _web_count(model: CatalogModel, row: dict[str, Any]) -> int:
    """The prompt tokens the web tier counts for the credit hold (no torch)."""
    return len(prompt_ids(chat_tokenizer_for(model.revision), row["body"]))


def test_image_data_url_rows_run_end_to_end_with_usage(api: Api, vision_model: CatalogModel):
    rows = [
        image_row("png", data_url(image_bytes(1, fmt="PNG"))),
        image_row("jpeg", data_url(image_bytes(2, fmt="JPEG"), "image/jpeg")),
        image_row("webp", data_url(image_bytes(3, fmt="WEBP"), "image/webp")),
        image_row("gif", data_url(image_bytes(4, fmt="GIF"), "image/gif")),
        request_line("text", model="boardwalk/tiny-vision", content="Say <image> twice"),
    ]
    _, output, errors = _run(api, rows)
    assert errors == {}
    for row in rows:
        body = output[row["custom_id"]]["response"]["body"]
        usage = body["usage"]
        # Each image is its 25 placeholder tokens, counted alike by the web tier and the worker.
        assert usage["prompt_tokens"] == _web_count(vision_model, row)
        assert usage["completion_tokens"] >= 1
    image_prompt = output["png"]["response"]["body"]["usage"]["prompt_tokens"]
    text_only = {**rows[0]["body"], "messages": [{"role": "user", "content": "What is this?"}]}
    assert (
        image_prompt == len(prompt_ids(chat_tokenizer_for(vision_model.revision), text_only)) + 25
    )


def test_identical_placeholders_of_different_images_never_share_the_prefix_cache(
    api: Api, vision_model: CatalogModel
):
    first, second = data_url(image_bytes(10)), data_url(image_bytes(11))
    # The image comes first, so every block of the prompt covers or follows it.
    rows = []
    for custom_id, url in (("a", first), ("b", second), ("a-again", first)):
        row = image_row(custom_id, url, text="")
        row["body"]["messages"][0]["content"].reverse()
        row["body"]["messages"].insert(0, {"role": "system", "content": "Look closely. " * 3})
        rows.append(row)
    data = submit(api, rows[:1], key="first")
    run_worker(data["id"])
    _, output, _ = _run(api, rows[1:])
    cached = {
        k: v["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"]
        for k, v in output.items()
    }
    system_blocks = 16 * (
        len(
            prompt_ids(
                chat_tokenizer_for(vision_model.revision),
                {"messages": rows[0]["body"]["messages"][:1]},
            )
        )
        // 16
    )
    assert cached["b"] <= system_blocks  # at most the text before the image
    assert cached["a-again"] > cached["b"]  # the same image: its blocks are reused


def test_image_urls_are_fetched_by_the_worker_from_an_allowed_local_server(
    api: Api, vision_model: CatalogModel, settings: Any, tmp_path: Path
):
    picture = image_bytes(5)
    routes = {
        "/cat.png": lambda: (200, {"Content-Type": "image/png"}, picture),
        "/gone.png": lambda: (404, {}, b"no"),
        "/text.png": lambda: (200, {"Content-Type": "image/png"}, b"not an image at all"),
        "/huge.png": lambda: (200, {"Content-Type": "image/png"}, b"\0" * (len(picture) + 4096)),
        "/to-private": lambda: (302, {"Location": "https://127.0.0.1:1/cat.png"}, b""),
        "/to-cat": lambda: (302, {"Location": "/cat.png"}, b""),
    }
    with https_server(tmp_path, routes) as server:
        settings.OUTBOUND_ALLOW = [f"localhost:{server.port}"]
        settings.OUTBOUND_CA_BUNDLE = str(server.ca_file)
        settings.MEDIA_MAX_BYTES = 2048 + len(picture)
        rows = [
            image_row("fetched", server.url("/cat.png")),
            image_row("redirected", server.url("/to-cat")),
            image_row("missing", server.url("/gone.png")),
            image_row("not-an-image", server.url("/text.png")),
            image_row("too-large", server.url("/huge.png")),
            image_row("redirect-to-private", server.url("/to-private")),
            # The same server under a name or address the allow-list does not name.
            image_row("unlisted-address", server.url("/cat.png", host="127.0.0.1")),
            request_line("text", model="boardwalk/tiny-vision"),
        ]
        _, output, errors = _run(api, rows)
    assert sorted(output) == ["fetched", "redirected", "text"]
    assert _codes(errors) == {
        "missing": "image_fetch_failed",
        "not-an-image": "invalid_media",
        "too-large": "image_fetch_failed",
        "redirect-to-private": "image_fetch_failed",
        "unlisted-address": "image_fetch_failed",
    }
    for row in errors.values():
        assert row["response"] is None
        assert "localhost" not in row["error"]["message"] and "http" not in row["error"]["message"]
    assert output["fetched"]["response"]["body"]["usage"]["prompt_tokens"] == _web_count(
        vision_model, rows[0]
    )
    # The same picture inline gives the same completion (greedy): the fetched bytes were used.
    inline = image_row("inline", data_url(picture))
    _, again, _ = _run(api, [inline])
    assert (
        again["inline"]["response"]["body"]["choices"][0]["message"]
        == output["fetched"]["response"]["body"]["choices"][0]["message"]
    )


SSRF_PROBES = [
    "https://2130706433/cat.png",  # decimal 127.0.0.1
    "https://0177.0.0.1/cat.png",  # octal
    "https://0x7f.0.0.1/cat.png",  # hex
    "https://[::1]/cat.png",
    "https://0.0.0.0/cat.png",
    "https://[::ffff:127.0.0.1]/cat.png",  # IPv4-mapped
    "https://169.254.169.254/latest/meta-data",  # metadata
    "https://10.1.2.3/cat.png",
    "https://localhost/cat.png",
    "https://rebind.test/cat.png",  # resolves to loopback (the resolver below)
]


def test_ssrf_probes_are_row_errors_while_the_rest_of_the_batch_succeeds(
    api: Api, vision_model: CatalogModel, monkeypatch: pytest.MonkeyPatch
):
    real = socket.getaddrinfo

    def resolver(host: Any, *args: Any, **kwargs: Any) -> Any:
        # DNS the test controls: a public-looking name whose answer is loopback.
        return real("127.0.0.1" if host == "rebind.test" else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    rows = [image_row(f"probe-{i}", url) for i, url in enumerate(SSRF_PROBES)]
    rows.append(image_row("inline", data_url(image_bytes(6))))
    batch, output, errors = _run(api, rows)
    assert sorted(output) == ["inline"]
    assert set(_codes(errors).values()) == {"image_fetch_failed"}
    assert len(errors) == len(SSRF_PROBES)
    # Refused rows cost nothing; the batch's charge is the one row that ran.
    assert (
        batch.charge_microusd
        == BatchItem.objects.get(batch=batch, custom_id="inline").charge_microusd
    )
    from boardwalk.models import MetricCounter

    refused = MetricCounter.objects.get(
        name="boardwalk_fetch_failures_total", labels='reason="not_public"'
    )
    assert refused.value == len(SSRF_PROBES)


def test_audio_rows_run_end_to_end_in_wav_and_mp3(api: Api, audio_model: CatalogModel):
    rows = [
        audio_row("wav", audio_bytes(1.0, fmt="WAV"), "wav"),
        audio_row("mp3", audio_bytes(1.5, fmt="MP3", seed=1), "mp3"),
        audio_row("wav-8k", audio_bytes(0.5, fmt="WAV", rate=8_000, seed=2), "wav"),
        request_line("text", model="boardwalk/tiny-audio"),
    ]
    _, output, errors = _run(api, rows)
    assert errors == {}
    usage = {k: v["response"]["body"]["usage"] for k, v in output.items()}
    # One placeholder per 40 ms, resampled to 16 kHz; the web tier held the longest clip's.
    assert usage["wav"]["prompt_tokens"] - usage["wav-8k"]["prompt_tokens"] == 25 - 12
    assert usage["mp3"]["prompt_tokens"] <= _web_count(audio_model, rows[1])
    assert all(u["completion_tokens"] >= 1 for u in usage.values())


def test_oversize_and_malformed_media_end_as_invalid_media_rows(
    api: Api, vision_model: CatalogModel, audio_model: CatalogModel, settings: Any
):
    settings.MEDIA_MAX_PIXELS = 100 * 100
    bad_base64 = (
        "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"x" * 60).decode()
    )
    image_rows = [
        image_row("too-many-pixels", data_url(image_bytes(7, size=(200, 101)))),
        image_row("truncated-png", bad_base64),
        image_row("bmp", data_url(image_bytes(8, fmt="BMP"), "image/bmp")),
        image_row("fine", data_url(image_bytes(9, size=(100, 100)))),
    ]
    _, output, errors = _run(api, image_rows)
    assert sorted(output) == ["fine"]
    assert _codes(errors) == dict.fromkeys(
        ["too-many-pixels", "truncated-png", "bmp"], "invalid_media"
    )

    audio_rows = [
        audio_row("too-long", audio_bytes(31, fmt="WAV", rate=8_000), "wav"),
        audio_row("mislabelled", audio_bytes(1, fmt="WAV"), "mp3"),
        audio_row("noise", base64.b64decode(base64.b64encode(b"RIFF" + b"\x01" * 200)), "wav"),
        audio_row("fine", audio_bytes(1, fmt="WAV"), "wav"),
    ]
    _, output, errors = _run(api, audio_rows)
    assert sorted(output) == ["fine"]
    assert _codes(errors) == dict.fromkeys(["too-long", "mislabelled", "noise"], "invalid_media")


def test_malformed_media_urls_are_refused_at_upload_naming_line_and_part(
    api: Api, vision_model: CatalogModel
):
    rows = [
        image_row("ok", data_url(image_bytes(1))),
        image_row("http", "http://example.com/cat.png"),
        image_row("not-base64", "data:image/png;base64,@@@@"),
    ]
    response = api.upload(jsonl(*rows))
    assert response.status_code == 400
    details = {(d["line"], d["field"], d["code"]) for d in response.json()["error"]["details"]}
    field = "body.messages[0].content[1].image_url.url"
    assert details == {(2, field, "invalid_image_url"), (3, field, "invalid_image_url")}


def test_a_media_part_to_a_revision_that_cannot_run_it_is_an_upload_error(
    api: Api, vision_model: CatalogModel, catalog_model: CatalogModel
):
    rows = [
        audio_row("audio-to-vision", audio_bytes(0.2), "wav", model="boardwalk/tiny-vision"),
    ]
    response = api.upload(jsonl(*rows))
    assert response.status_code == 400
    (detail,) = response.json()["error"]["details"]
    assert (detail["line"], detail["field"], detail["code"]) == (
        1,
        "body.messages[0].content[1]",
        "unsupported_modality",
    )
    # A catalog entry whose batch media claims images on a text-only revision (as the admin
    # could save it) still refuses them: the engine cannot run them.
    CatalogModel.objects.filter(pk=catalog_model.pk).update(batch_media=["image"])
    ModelRevision.objects.filter(pk=catalog_model.revision_id).update(modalities=["text", "image"])
    response = api.upload(
        jsonl(image_row("image-to-text", data_url(image_bytes(1)), model="boardwalk/tiny-chat"))
    )
    assert response.status_code == 400
    (detail,) = response.json()["error"]["details"]
    assert (detail["line"], detail["code"]) == (1, "unsupported_modality")


def test_no_media_content_reaches_logs_receipts_or_error_messages(
    api: Api, vision_model: CatalogModel, caplog: pytest.LogCaptureFixture
):
    inline = data_url(image_bytes(12))
    secret_host = "https://private-images.invalid/holiday.png"
    rows = [
        image_row("inline", inline),
        image_row("url", secret_host),
        image_row("bad", data_url(b"GIF89a" + b"\0" * 30, "image/gif")),
    ]
    with caplog.at_level(logging.DEBUG):
        _, output, errors = _run(api, rows)
    payload = inline.split(",", 1)[1]
    assert payload[:40] not in caplog.text and "private-images" not in caplog.text
    for row in errors.values():
        assert "private-images" not in row["error"]["message"]
    receipt_id = output["inline"]["response"]["request_id"]
    receipt = api.get(f"/v1/requests/{receipt_id}").content.decode()
    assert payload[:40] not in receipt and "image" not in receipt.lower()
    assert _codes(errors) == {"url": "image_fetch_failed", "bad": "invalid_media"}


@pytest.mark.django_db(transaction=True)
def test_media_rows_through_the_embedded_worker_threads(
    api: Api, vision_model: CatalogModel, audio_model: CatalogModel, in_process_worker: Any
):
    from tests.batches.test_end_to_end import wait_terminal

    inputs = [
        image_row("image", data_url(image_bytes(13))),
        image_row("refused", "https://127.0.0.1/cat.png"),
    ]
    data = submit(api, inputs, key="threaded-vision")
    payload = wait_terminal(api, data["id"])
    assert payload["status"] == "completed"
    assert payload["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    assert int(payload["charge_microusd"]) > 0
    errors = _rows(api, payload["error_file_id"])
    assert _codes(errors) == {"refused": "image_fetch_failed"}
    data = submit(
        api, [audio_row("clip", audio_bytes(0.8, fmt="MP3"), "mp3")], key="threaded-audio"
    )
    payload = wait_terminal(api, data["id"])
    assert payload["request_counts"]["completed"] == 1


def test_the_models_api_lists_the_media_each_model_takes_in_batch(
    api: Api, vision_model: CatalogModel, audio_model: CatalogModel, catalog_model: CatalogModel
):
    listed = {m["id"]: m for m in api.get("/v1/models").json()["data"]}
    assert listed["boardwalk/tiny-vision"]["modalities"] == ["text", "image"]
    assert listed["boardwalk/tiny-vision"]["batch"]["media"] == ["image"]
    assert listed["boardwalk/tiny-audio"]["batch"]["media"] == ["audio"]
    assert listed["boardwalk/tiny-chat"]["batch"]["media"] == []


def test_http_image_urls_are_accepted_only_for_targets_the_allow_list_names(
    api: Api, vision_model: CatalogModel, settings: Any, tmp_path: Path
):
    picture = image_bytes(14)
    routes = {"/cat.png": lambda: (200, {"Content-Type": "image/png"}, picture)}
    with https_server(tmp_path, routes, tls=False) as server:
        row = image_row("plain-http", server.url("/cat.png"))
        refused = api.upload(jsonl(row))
        assert refused.status_code == 400
        assert refused.json()["error"]["details"][0]["code"] == "invalid_image_url"
        # http too, to a named target (docs/API.md "Images and audio")
        settings.OUTBOUND_ALLOW = [f"localhost:{server.port}"]
        _, output, errors = _run(api, [row])
    assert errors == {} and sorted(output) == ["plain-http"]
    assert server.requests == ["/cat.png"]


def test_inline_media_over_the_byte_cap_is_an_upload_error(
    api: Api, vision_model: CatalogModel, audio_model: CatalogModel, settings: Any
):
    settings.MEDIA_MAX_BYTES = 1000
    rows = [
        image_row("big-image", data_url(image_bytes(15, size=(64, 64)))),
        image_row("small-image", data_url(image_bytes(15, size=(4, 4)))),
    ]
    response = api.upload(jsonl(*rows))
    assert response.status_code == 400
    (detail,) = response.json()["error"]["details"]
    assert (detail["line"], detail["field"], detail["code"]) == (
        1,
        "body.messages[0].content[1].image_url.url",
        "media_too_large",
    )
    clip = audio_row("big-clip", audio_bytes(1.0), "wav")
    (detail,) = api.upload(jsonl(clip)).json()["error"]["details"]
    assert (detail["field"], detail["code"]) == (
        "body.messages[0].content[1].input_audio.data",
        "media_too_large",
    )
