"""Upload benchmark (issue: Files API): validate + encrypt + store a 256 MiB, 1,000-line file.

Measured side by side in one run, each variant in a fresh subprocess (so peak RSS is its own):

- baseline: a bare loop that only `json.loads` each line of the file;
- orjson: the same loop with `orjson.loads`, the parser the product uses (the bound of parsing);
- write+fsync: the file's bytes written in 1 MiB pieces to a new file on the same disk, then
  fsynced (the bound of the disk);
- boardwalk: the real server path, as FileCollectionView.post runs it — `upload_receive`
  reading a multipart body from disk (files.multipart, ~1 MiB reads) and streaming the file
  part through line validation and AES-GCM encryption straight into the content store, then
  `file_create_from_upload` (commit the blob durably, write the File row).

Prints throughput (MB/s of the JSONL file), the median and every run, and peak memory growth
(RSS above the process's level after imports and set-up) for each; the goal is the upload
within 1.25x of the slower of the orjson loop and write+fsync. `--without-fsync` adds a third,
diagnostic run of the boardwalk path with fsync/fdatasync turned into no-ops: what the
durability costs here (the product always syncs).

`--count-tokens` adds the prompt token count (issue 6) the way the product does it: the
upload as above (it does not count), then, timed on its own, what the worker's
`file_count_tokens` message runs for the stored file (`files.counting.file_count_prompt_tokens`:
resolve the model, decrypt, parse, count with the tiny demo model's tokenizer, store the
counts). Two rows: the upload of that run (the answer's critical path) and the count after it.

    .venv/bin/python benchmarks/upload.py [--mib 256] [--lines 1000] [--without-fsync]
                                          [--count-tokens]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOUNDARY = "----boardwalkbench"


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _settle() -> None:
    """Flush every dirty page (Linux) so set-up's own writes do not share the timed disk time."""
    os.sync()


def _reset_peak() -> None:
    """Start the peak RSS afresh (Linux), so set-up's own peak does not count."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass


def _peak_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_file(path: Path, *, mib: int, lines: int) -> None:
    target = mib * 1024 * 1024
    overhead = len(_line(0, ""))
    per_line = target // lines - overhead - 1
    with path.open("wb") as out:
        for i in range(lines):
            words = (
                "lorem ipsum dolor sit amet consectetur adipiscing elit " * (per_line // 56 + 1)
            )[:per_line]
            out.write(_line(i, words) + b"\n")


def _line(i: int, text: str) -> bytes:
    row = {
        "custom_id": f"task-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "boardwalk/tiny-chat",
            "messages": [{"role": "user", "content": text}],
            "max_completion_tokens": 64,
        },
    }
    return json.dumps(row, separators=(",", ":")).encode()


def run_baseline(path: Path) -> dict:
    _settle()
    _reset_peak()
    base = _rss_mib()
    start = time.perf_counter()
    with path.open("rb") as handle:
        for line in handle:
            json.loads(line)
    elapsed = time.perf_counter() - start
    return {"seconds": elapsed, "peak_growth_mib": _peak_mib() - base}


def run_orjson(path: Path) -> dict:
    import orjson

    _settle()
    _reset_peak()
    base = _rss_mib()
    start = time.perf_counter()
    with path.open("rb") as handle:
        for line in handle:
            orjson.loads(line)
    elapsed = time.perf_counter() - start
    return {"seconds": elapsed, "peak_growth_mib": _peak_mib() - base}


def run_write_fsync(path: Path, data_dir: Path) -> dict:
    _settle()
    _reset_peak()
    base = _rss_mib()
    start = time.perf_counter()
    with path.open("rb") as src, (data_dir / "copy.bin").open("wb", buffering=0) as out:
        while chunk := src.read(1024 * 1024):
            out.write(chunk)
        os.fsync(out.fileno())
    elapsed = time.perf_counter() - start
    return {"seconds": elapsed, "peak_growth_mib": _peak_mib() - base}


def run_boardwalk(path: Path, data_dir: Path, *, fsync: bool = True, count: bool = False) -> dict:
    """`count`: after the upload, run the background prompt token count and time it apart."""
    os.environ["BOARDWALK_DATA_DIR"] = str(data_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    from boardwalk.services import org_create
    from files import storage
    from files.multipart import multipart_boundary
    from files.services import file_create_from_upload
    from files.upload import upload_receive
    from files.validation import ModelTarget

    if not fsync:  # diagnostic only: what durability costs on this disk

        def no_sync(fd: int) -> None:
            return None

        os.fsync = os.fdatasync = storage._fdatasync = no_sync

    call_command("migrate", verbosity=0)
    org = org_create(name=f"bench-{time.time_ns()}")
    if count:
        from inference.demo.model import build_demo_model, demo_revision_fields
        from inference.services import catalog_model_create, revision_create
        from inference.tokenization import chat_tokenizer_for

        model_dir = build_demo_model(data_dir / "model", size="tiny")
        revision = revision_create(**demo_revision_fields(model_dir, "tiny"))
        # The file's model, so that the count resolves it as the worker does.
        catalog_model_create(name="boardwalk/tiny-chat", revision=revision, prices=(1, 1, 1))
        chat_tokenizer_for(revision)  # loaded outside the timed part, as a warm worker has it

    def resolve(name: str) -> ModelTarget:
        return ModelTarget(name=name, context_length=2048, media=frozenset())

    body_path = data_dir / "multipart.bin"
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="r.jsonl"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{BOUNDARY}--\r\n".encode()
    with body_path.open("wb") as out, path.open("rb") as src:
        out.write(head)
        while chunk := src.read(8 * 1024 * 1024):
            out.write(chunk)
        out.write(tail)
    size = body_path.stat().st_size
    content_type = f"multipart/form-data; boundary={BOUNDARY}"
    _settle()
    _reset_peak()
    base = _rss_mib()
    start = time.perf_counter()
    # What FileCollectionView.post does, with the body coming from a file instead of a socket.
    with body_path.open("rb", buffering=0) as stream:
        boundary = multipart_boundary(content_type)
        assert boundary is not None
        form = upload_receive(stream.read, boundary=boundary, content_length=size, resolver=resolve)
    try:
        assert form.upload is not None and not form.unexpected
        file = file_create_from_upload(org=org, purpose=form.text["purpose"], upload=form.upload)
    finally:
        form.discard()
    elapsed = time.perf_counter() - start
    assert file.line_count > 0, "validation failed"
    assert file.prompt_tokens is None, "the upload counted prompt tokens"
    result = {"seconds": elapsed, "peak_growth_mib": _peak_mib() - base, "lines": file.line_count}
    if count:
        from files.counting import file_count_prompt_tokens

        start = time.perf_counter()
        assert file_count_prompt_tokens(file_id=file.id), "prompt tokens not counted"
        result["count_seconds"] = time.perf_counter() - start
        result["count_peak_growth_mib"] = _peak_mib() - base
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5, help="runs of each (median is kept)")
    parser.add_argument("--without-fsync", action="store_true")
    parser.add_argument(
        "--variant",
        choices=[
            "baseline",
            "orjson",
            "write-fsync",
            "boardwalk",
            "boardwalk-nofsync",
            "count-background",
        ],
    )
    parser.add_argument("--count-tokens", action="store_true")
    parser.add_argument("--file")
    parser.add_argument("--data-dir")
    args = parser.parse_args()
    if args.variant:
        path = Path(args.file)
        if args.variant == "baseline":
            result = run_baseline(path)
        elif args.variant == "orjson":
            result = run_orjson(path)
        elif args.variant == "write-fsync":
            result = run_write_fsync(path, Path(args.data_dir))
        elif args.variant == "count-background":
            result = run_boardwalk(path, Path(args.data_dir), count=True)
        else:
            fsync = args.variant == "boardwalk"
            result = run_boardwalk(path, Path(args.data_dir), fsync=fsync)
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory(prefix="bw-upload-bench-") as tmp:
        path = Path(tmp) / "requests.jsonl"
        make_file(path, mib=args.mib, lines=args.lines)
        size_mb = path.stat().st_size / 1e6
        variants = ["baseline", "orjson", "write-fsync", "boardwalk"]
        if args.without_fsync:
            variants.append("boardwalk-nofsync")
        if args.count_tokens:
            variants.append("count-background")
        runs: dict[str, list[dict]] = {variant: [] for variant in variants}
        # Interleaved, so that other load on the machine falls on every variant alike.
        for attempt in range(args.repeat):
            for variant in variants:
                data_dir = Path(tmp) / f"data-{variant}-{attempt}"
                data_dir.mkdir()
                out = subprocess.run(  # noqa: S603
                    [
                        sys.executable,
                        __file__,
                        "--variant",
                        variant,
                        "--file",
                        str(path),
                        "--data-dir",
                        str(data_dir),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                    cwd=ROOT,
                )
                runs[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
                shutil.rmtree(data_dir)
        results = {
            variant: {
                "seconds": statistics.median(r["seconds"] for r in found),
                "all": [r["seconds"] for r in found],
                "peak_growth_mib": max(r["peak_growth_mib"] for r in found),
            }
            for variant, found in runs.items()
        }
        if args.count_tokens:  # the count after the upload, reported as a row of its own
            found = runs["count-background"]
            results["count-worker"] = {
                "seconds": statistics.median(r["count_seconds"] for r in found),
                "all": [r["count_seconds"] for r in found],
                "peak_growth_mib": max(r["count_peak_growth_mib"] for r in found),
            }
        print(f"file: {size_mb:.1f} MB, {args.lines} lines; median of {args.repeat} runs each")
        print(f"{'variant':<34}{'seconds':>9}{'MB/s':>9}{'peak RSS growth':>18}  all runs (s)")
        labels = {
            "baseline": "bare json.loads loop",
            "orjson": "bare orjson.loads loop",
            "write-fsync": "write + fsync of the same bytes",
            "boardwalk": "validate+encrypt+store (boardwalk)",
            "boardwalk-nofsync": "  same, fsync off (diagnostic)",
            "count-background": "  same, with a model to count for",
            "count-worker": "  then the background token count",
        }
        for name, r in results.items():
            label = labels[name]
            speed = size_mb / r["seconds"]
            every = " ".join(f"{seconds:.2f}" for seconds in r["all"])
            print(
                f"{label:<34}{r['seconds']:>9.2f}{speed:>9.0f}"
                f"{r['peak_growth_mib']:>15.1f} MiB  {every}"
            )
        ratio = results["baseline"]["seconds"] / results["boardwalk"]["seconds"]
        print(f"boardwalk speed vs json.loads loop: {ratio:.2f}x (peak RSS growth: worst run)")
        bound = max(results["orjson"]["seconds"], results["write-fsync"]["seconds"])
        print(
            f"boardwalk time / slower of orjson loop and write+fsync: "
            f"{results['boardwalk']['seconds'] / bound:.2f} (goal <= 1.25)"
        )


if __name__ == "__main__":
    main()
