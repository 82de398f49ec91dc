"""Recovery-copy benchmark (issue 7): what storing result files twice costs, and what a
download served from the recovery copy costs, on the local content store.

Side by side, one 20 MiB result file (the maximum, docs/API.md "Result files"), warmed up, median of
--runs:

- publish, baseline: encrypt the rows into one blob and commit it durably (what finalization
  did before recovery copies);
- publish, boardwalk: the same plus the recovery copy (`ContentStore.copy`, fsynced);
- download, primary: decrypt and authenticate the whole file from the primary blob;
- download, fallback: the same with the primary missing, served from the recovery copy.

    .venv/bin/python benchmarks/recovery.py [--mib 20] [--runs 5]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _median_seconds(action: Callable[[], object], runs: int) -> float:
    action()  # warm-up
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    data_dir = tempfile.mkdtemp(prefix="boardwalk-recovery-bench-")
    os.environ["BOARDWALK_DATA_DIR"] = data_dir
    os.environ.pop("BOARDWALK_S3_BUCKET", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()

    from files.crypto import new_data_key
    from files.models import File
    from files.services.reads import _read_with_fallback  # file_read_range, less the key unwrap
    from files.storage import EncryptedSpool, content_store

    row = b'{"id":"batch_req_x","custom_id":"task","response":{"status_code":200,"body":"%s"}}\n'
    rows = [row % (b"y" * 900)] * (args.mib * 1024 * 1024 // len(row % (b"y" * 900)))
    size = sum(len(r) for r in rows)
    store = content_store()
    key = new_data_key()
    counter = iter(range(1_000_000))

    def publish(*, copy: bool) -> tuple[str, str]:
        n = next(counter)
        name, recovery = f"files/bench-{n}.enc", f"recovery/bench-{n}.enc"
        with EncryptedSpool(store, data_key=key, aad_prefix=b"file-bench") as spool:
            for r in rows:
                spool.write(r)
            spool.commit(name)
        if copy:
            store.copy(name, recovery)
        return name, recovery

    baseline = _median_seconds(lambda: publish(copy=False), args.runs)
    ours = _median_seconds(lambda: publish(copy=True), args.runs)

    name, recovery = publish(copy=True)
    file = File(id="file-bench", bytes=size, storage_name=name, recovery_name=recovery)

    def download(target: File) -> int:
        return sum(len(piece) for piece in _read_with_fallback(target, key, 0, size - 1))

    primary = _median_seconds(lambda: download(file), args.runs)
    lost = File(
        id="file-bench", bytes=size, storage_name="files/missing.enc", recovery_name=recovery
    )
    logging.disable(logging.ERROR)  # the fallback logs each time
    fallback = _median_seconds(lambda: download(lost), args.runs)

    mb = size / 1e6
    print(f"result file: {size / 2**20:.1f} MiB, median of {args.runs} runs after a warm-up")
    print(f"{'':28}{'seconds':>9}{'MB/s':>9}")
    for label, seconds in [
        ("publish, baseline (1 blob)", baseline),
        ("publish, with recovery copy", ours),
        ("download, primary", primary),
        ("download, recovery copy", fallback),
    ]:
        print(f"{label:28}{seconds:9.3f}{mb / seconds:9.0f}")
    print(f"recovery copy costs {ours / baseline:.2f}x the baseline publish")


if __name__ == "__main__":
    main()
