"""Fixtures for tests that run on real tokenizers and chat templates.

    from tests.formats import fixtures

    family_tokenizer = fixtures.family_tokenizer  # or import it in a conftest.py

    def test_something(family_tokenizer):
        tokenizer = family_tokenizer("qwen3")

Without the fetched cache these tests FAIL (never skip) and say what to run: `make formats`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.formats.families import FormatsMissing, family_dir, load_tokenizer
from tests.formats.fetch import HOWTO, SOURCES, cache_dir, read_manifest, source_ok

T = TypeVar("T")


def require_formats() -> Path:
    """The cache directory, or pytest.fail naming what to fetch when a source is missing."""
    root = cache_dir()
    listed = read_manifest(root).get("sources", {})
    missing = [s.key for s in SOURCES if not source_ok(root, listed.get(s.key), s, verify=False)]
    if missing:
        pytest.fail(
            f"real tokenizers/templates missing ({', '.join(missing)}): {HOWTO}", pytrace=False
        )
    return root


@pytest.fixture(scope="session")
def formats_cache() -> Path:
    """The fetched cache (the test fails when it is absent)."""
    return require_formats()


def _failing(build: Callable[[str], T]) -> Callable[[str], T]:
    def call(name: str) -> T:
        try:
            return build(name)
        except FormatsMissing as exc:
            pytest.fail(str(exc), pytrace=False)

    return call


@pytest.fixture(scope="session")
def family_path(formats_cache: Path) -> Callable[[str], Path]:
    """Factory: a family's name -> its tokenizer directory (tests/formats/families.py)."""
    return _failing(family_dir)


@pytest.fixture(scope="session")
def family_tokenizer(formats_cache: Path) -> Callable[[str], Any]:
    """Factory: a family's name -> its tokenizer, loaded offline once per process (shared:
    do not modify it; load your own from `family_path` to change it)."""
    return _failing(load_tokenizer)
