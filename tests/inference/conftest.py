from __future__ import annotations

from pathlib import Path

import pytest

from inference.demo_model import build_demo_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny demo model, built once per test session (about a second)."""
    return build_demo_model(tmp_path_factory.mktemp("models") / "tiny-chat-tiny", size="tiny")
