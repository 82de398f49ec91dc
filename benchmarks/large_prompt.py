"""Memory for one large prompt (issue 29 item 2): peak RSS growth of the server's own steps.

Runs in a fresh process (embedded SQLite, a temporary data directory, the tiny demo model
served by an in-process engine, so the engine's memory counts in this process too):

1. a warm-up round on a small file (imports, caches, the engine loaded, the tokenizer read);
2. `upload`: a single-line file whose user message makes the line `--mib` MiB (20: the largest
   line accepted), received as FileCollectionView.post receives it (`upload_receive` reading
   the multipart body from disk, validating and encrypting as it streams,
   `file_create_from_upload`);
3. `count`: what the upload's `file_count_tokens` message runs on a worker
   (`files.counting.file_count_prompt_tokens`);
4. `accept`: batch create counting the file itself (the stored counts cleared first), which
   reads, parses and renders the line again;
5. `run`: `serve_key` for the batch's engine key (the prepare stage reads, renders and
   tokenizes the prompt for the engine); the item must end `context_length_exceeded`;
6. `hostile`: the upload of a 4 MiB line of 2M one-character values, refused
   `too_many_values`;
7. `interactive`: `POST /v1/chat/completions` with a 900 KiB user message (under the 1 MiB
   JSON body limit), refused `context_length_exceeded` without being tokenized (issue 38
   item 8), beside `interactive_unbounded`: what counting that prompt in full costs
   (`prompt_ids`, the path before), measured after it in the same process.

Each step's figure is its peak RSS (VmHWM, reset before the step) above the RSS the process
had before the first measured step, so memory a step leaves behind counts against the next.

    .venv/bin/python benchmarks/large_prompt.py [--mib 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BOUNDARY = "----boardwalkbench"
MODEL = "boardwalk/tiny-chat"


def _status(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


def request_line(custom_id: str, content: str, **body: Any) -> bytes:
    row = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_completion_tokens": 16,
            **body,
        },
    }
    return json.dumps(row, separators=(",", ":")).encode()


def large_line(size: int) -> bytes:
    """One request line of exactly `size` bytes, its user message plain words."""
    overhead = len(request_line("large", ""))
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit "
    return request_line("large", (words * (size // len(words) + 1))[: size - overhead])


def hostile_line(values: int) -> bytes:
    """A request line whose messages list also holds `values` one-character values."""
    line = request_line("hostile", "hello")
    return line.replace(b'"messages":[', b'"messages":[' + b"1," * values, 1)


class Server:
    """The server's steps in this process, as the views and actors run them."""

    def __init__(self, data_dir: Path) -> None:
        os.environ["BOARDWALK_DATA_DIR"] = str(data_dir)
        os.environ["BOARDWALK_ENGINE_PROCESS"] = "0"  # the engine's memory counts here too
        # Counted by the `count` step, as any upload over 256 KiB is (the warm-up's too).
        os.environ["BOARDWALK_UPLOAD_COUNT_INLINE_BYTES"] = "0"
        os.environ.pop("DATABASE_URL", None)
        os.environ.pop("REDIS_URL", None)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from django.core.handlers.wsgi import WSGIHandler
        from django.core.management import call_command

        from billing.services import credit_grant
        from boardwalk.services import api_key_create, org_create
        from inference.demo.model import build_demo_model, demo_revision_fields
        from inference.runtime import engine_for
        from inference.services import catalog_model_create, revision_create

        self.dir = data_dir
        call_command("migrate", verbosity=0)
        self.org = org_create(name="large-prompt")
        credit_grant(org=self.org, amount_microusd=10**12, memo="bench")
        self.key = api_key_create(org=self.org, scopes="inference:write").secret
        self.handler = WSGIHandler()
        model_dir = build_demo_model(data_dir / "model", size="tiny")
        self.revision = revision_create(**demo_revision_fields(model_dir, "tiny"))
        catalog_model_create(
            name=MODEL, revision=self.revision, prices=(1, 1, 1), interactive_prices=(1, 1, 1)
        )
        engine_for(self.revision)

    def request(
        self, method: str, path: str, body: Path | bytes, content_type: str
    ) -> tuple[int, Any]:
        """One request through Django's WSGI handler, its body streamed from a file as a WSGI
        server streams a socket's; the peak is reset just before. (status, decoded JSON)."""
        if isinstance(body, bytes):
            (self.dir / "body.bin").write_bytes(body)
            body = self.dir / "body.bin"
        with body.open("rb", buffering=0) as stream:
            environ = {
                "REQUEST_METHOD": method,
                "PATH_INFO": path,
                "SERVER_NAME": "localhost",
                "SERVER_PORT": "80",
                "HTTP_HOST": "localhost",
                "HTTP_AUTHORIZATION": f"Bearer {self.key}",
                "HTTP_IDEMPOTENCY_KEY": body.name + str(time.time_ns()),
                "CONTENT_TYPE": content_type,
                "CONTENT_LENGTH": str(body.stat().st_size),
                "wsgi.input": stream,
                "wsgi.url_scheme": "http",
                "wsgi.errors": sys.stderr,
            }
            answer: list[str] = []
            _reset_peak()
            chunks = self.handler(environ, lambda status, headers: answer.append(status))
            data = b"".join(chunks)
        return int(answer[0].split()[0]), json.loads(data)

    def upload(self, content: bytes) -> tuple[int, Any]:
        """POST /v1/files of `content` as the `file` field."""
        body = self.dir / "multipart.bin"
        with body.open("wb") as out:
            out.write(
                f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
                f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; '
                'filename="r.jsonl"\r\nContent-Type: application/octet-stream\r\n\r\n'.encode()
            )
            out.write(content)
            out.write(f"\r\n--{BOUNDARY}--\r\n".encode())
        del content
        return self.request("POST", "/v1/files", body, f"multipart/form-data; boundary={BOUNDARY}")

    def count(self, file_id: str) -> None:
        """What the upload's file_count_tokens message runs on a worker."""
        from files.counting import file_count_prompt_tokens

        _reset_peak()
        assert file_count_prompt_tokens(file_id=file_id), "prompt tokens not counted"

    def accept(self, file_id: str) -> tuple[int, Any]:
        """POST /v1/batches, counting the file itself (its stored counts cleared first)."""
        from files.models import File

        File.objects.filter(id=file_id).update(prompt_tokens=None, prompt_tokens_revision="")
        submission = {
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        return self.request(
            "POST", "/v1/batches", json.dumps(submission).encode(), "application/json"
        )

    def chat(self, content: str) -> tuple[int, Any]:
        """POST /v1/chat/completions with one user message (refused before any worker)."""
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_completion_tokens": 4,
        }
        return self.request(
            "POST", "/v1/chat/completions", json.dumps(body).encode(), "application/json"
        )

    def count_unbounded(self, content: str) -> int:
        """The prompt's tokens counted in full, as interactive requests were before."""
        from inference.chat_completions import prompt_ids
        from inference.tokenization import chat_tokenizer_for

        body = {"messages": [{"role": "user", "content": content}]}
        tokenizer = chat_tokenizer_for(self.revision)
        _reset_peak()
        return len(prompt_ids(tokenizer, body))

    def run(self, batch_id: str) -> list[str]:
        """The worker's run for the batch's key; the error codes of its items."""
        from batches.execution import serve_key
        from batches.models import Batch, BatchItem
        from batches.queue import EngineKey

        batch = Batch.objects.get(id=batch_id)
        _reset_peak()
        serve_key(EngineKey(batch.revision_id, batch.deployment_id or ""))
        items = BatchItem.objects.filter(batch_id=batch_id).order_by("index")
        return [item.error_code or item.state for item in items]


def measure(mib: float) -> dict[str, Any]:
    from files.limits import MAX_LINE_BYTES

    with tempfile.TemporaryDirectory(prefix="bw-large-prompt-") as tmp:
        server = Server(Path(tmp))
        from files.models import File

        # Warm-up: every step once on a small file, so imports and caches are in place.
        status, small = server.upload(request_line("warm", "Hello there, how are you?") + b"\n")
        assert status == 200, small
        server.count(small["id"])
        status, batch = server.accept(small["id"])
        assert status == 200, batch
        server.run(batch["id"])
        server.upload(hostile_line(200_000) + b"\n")

        steps: dict[str, float] = {}
        hostile = hostile_line(2_000_000) + b"\n"
        result: dict[str, Any] = {"hostile_line_bytes": len(hostile) - 1}
        base = _status("VmRSS:")
        status, refused = server.upload(hostile)
        steps["hostile"] = _status("VmHWM:") - base
        del hostile
        details = refused["error"].get("details") or []
        result["hostile_answer"] = [status, [d["code"] for d in details]]

        size = min(int(mib * 1024 * 1024), MAX_LINE_BYTES)
        content = large_line(size) + b"\n"
        result["line_bytes"] = size
        base = _status("VmRSS:")
        result["rss_before_mib"] = round(base, 1)
        started = time.perf_counter()
        status, file = server.upload(content)
        steps["upload"] = _status("VmHWM:") - base
        del content
        assert status == 200, f"the large line was refused: {file}"
        server.count(file["id"])
        steps["count"] = _status("VmHWM:") - base
        result["prompt_tokens"] = File.objects.get(id=file["id"]).prompt_tokens
        status, batch = server.accept(file["id"])
        steps["accept"] = _status("VmHWM:") - base
        assert status == 200, batch
        result["item_errors"] = server.run(batch["id"])
        steps["run"] = _status("VmHWM:") - base
        result["large_seconds"] = round(time.perf_counter() - started, 2)

        server.chat("word " * 10_000)  # warm-up of the interactive path (also over the context)
        content = "word " * (900 * 1024 // 5)
        base = _status("VmRSS:")
        started = time.perf_counter()
        status, answer = server.chat(content)
        result["interactive_seconds"] = round(time.perf_counter() - started, 3)
        steps["interactive"] = _status("VmHWM:") - base
        result["interactive_answer"] = [status, answer["error"]["code"]]
        base = _status("VmRSS:")
        started = time.perf_counter()
        server.count_unbounded(content)
        result["interactive_unbounded_seconds"] = round(time.perf_counter() - started, 3)
        steps["interactive_unbounded"] = _status("VmHWM:") - base
        result["peak_growth_mib"] = {name: round(value, 1) for name, value in steps.items()}
        return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=float, default=20, help="the large line's size")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = measure(args.mib)
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"large line: {result['line_bytes'] / 2**20:.1f} MiB, prompt_tokens "
        f"{result['prompt_tokens']}, items {result['item_errors']}, "
        f"{result['large_seconds']} s; RSS before: {result['rss_before_mib']} MiB"
    )
    print(
        f"hostile line: {result['hostile_line_bytes'] / 2**20:.1f} MiB, "
        f"answered {result['hostile_answer']}"
    )
    print(
        f"interactive 900 KiB prompt: answered {result['interactive_answer']} in "
        f"{result['interactive_seconds']} s; counted in full it took "
        f"{result['interactive_unbounded_seconds']} s"
    )
    print(f"{'step':<10}{'peak RSS growth':>18}")
    for name, value in result["peak_growth_mib"].items():
        print(f"{name:<10}{value:>14.1f} MiB")


if __name__ == "__main__":
    main()
