"""Upload-time validation of batch input files (SPEC §4.1). A plain library: no database."""

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
