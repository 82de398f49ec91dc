"""Upload-time validation of batch input files (docs/API.md "Standard input lines"). A plain
library: no database."""

from .report import (
    LineError,
    LineInfo,
    ModelLookupError,
    ModelTarget,
    Resolver,
    ValidationReport,
)
from .validator import InputValidator

__all__ = [
    "InputValidator",
    "LineError",
    "LineInfo",
    "ModelLookupError",
    "ModelTarget",
    "Resolver",
    "ValidationReport",
]
