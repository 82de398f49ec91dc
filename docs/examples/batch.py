"""A complete batch workflow with the official `openai` SDK (docs/GUIDE.md).

    BOARDWALK_BASE_URL=http://127.0.0.1:8000/v1 BOARDWALK_API_KEY=bw_... \
        python docs/examples/batch.py requests.jsonl [OUT_DIR]

Uploads, estimates, submits with an Idempotency-Key derived from the upload, polls with
backoff until terminal, downloads both files (resuming with Range + If-Range), and prints the
custom_ids that have no row. Exit status 1 if any id has no row.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from openai import OpenAI

TERMINAL = {"completed", "failed", "cancelled", "expired"}


def download(client: OpenAI, file_id: str, dest: Path) -> None:
    """Resume `dest.part` if an earlier run left one; start over if the file changed."""
    part, etag_file = dest.with_suffix(".part"), dest.with_suffix(".etag")
    headers = {}
    if part.exists() and etag_file.exists():
        headers = {"Range": f"bytes={part.stat().st_size}-", "If-Range": etag_file.read_text()}
    raw = client.files.with_raw_response.content(file_id, extra_headers=headers)
    etag_file.write_text(raw.headers.get("etag", ""))
    with part.open("ab" if raw.status_code == 206 else "wb") as out:
        out.write(raw.content)
    part.replace(dest)
    etag_file.unlink()


def main() -> int:
    requests_path = Path(sys.argv[1])
    out_dir = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(".")
    client = OpenAI(
        base_url=os.environ.get("BOARDWALK_BASE_URL", "http://127.0.0.1:8000/v1"),
        api_key=os.environ["BOARDWALK_API_KEY"],
    )
    with requests_path.open("rb") as f:
        file = client.files.create(file=(requests_path.name, f), purpose="batch")
    body = {
        "input_file_id": file.id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    estimate = client.post("/batches/estimate", body=body, cast_to=object)
    print("estimate:", json.dumps(estimate))
    batch = client.batches.create(
        input_file_id=file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_headers={"Idempotency-Key": f"create-{file.id}"},  # a retry finds the same batch
    )
    delay = 1.0
    while batch.status not in TERMINAL:
        time.sleep(delay)
        delay = min(delay * 2, 30.0)
        batch = client.batches.retrieve(batch.id)
        counts = batch.request_counts  # typed optional by the SDK; Boardwalk always sends it
        if counts is not None:
            print(f"{batch.status}: {counts.completed}/{counts.total}")
    print("batch", batch.id, batch.status, "request id of the last answer:", batch._request_id)
    seen: set[str] = set()
    for kind, file_id in (("results", batch.output_file_id), ("errors", batch.error_file_id)):
        if file_id is None:  # error_file_id is null when nothing failed
            continue
        dest = out_dir / f"{requests_path.stem}.{kind}.jsonl"
        download(client, file_id, dest)
        rows = [json.loads(line) for line in dest.read_text().splitlines() if line]
        seen.update(row["custom_id"] for row in rows)
        print(f"{kind}: {dest} ({len(rows)} rows)")
        if kind == "results" and rows:
            receipt = client.get(f"/requests/{rows[0]['response']['request_id']}", cast_to=object)
            print("receipt:", json.dumps(receipt))
    wanted = [json.loads(line)["custom_id"] for line in requests_path.read_text().splitlines()]
    missing = [custom_id for custom_id in wanted if custom_id not in seen]
    print("no row:", missing)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
