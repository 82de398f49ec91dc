"""The interactive tier's settings (project/settings.py reads them from the environment)."""

from __future__ import annotations

from typing import Any

from django.conf import settings


def setting(name: str) -> Any:
    """`settings.<name>`, read at each call so that a test's override applies."""
    return getattr(settings, name)
