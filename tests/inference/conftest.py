"""Fixtures of the engine's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.engine import load_model


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path):
    """The tiny demo model and its tokenizer, loaded once per test module (tests may hook
    or reconfigure it)."""
    return load_model(str(tiny_model_dir))
