"""Exceptions described for logs without their messages (docs/ARCHITECTURE.md decision 6).

An exception's message, like its frames' locals, may quote what it was handed: a prompt, a
completion, a decoded image. Logs hold ids, offsets and counts only, so a worker that catches
an exception cannot log `str(exc)` or `logger.exception(...)`. Logging the type alone left a
person with "request could not be admitted: IndexError" and nothing to find the line by.
`exception_trace` keeps what a person debugging needs and nothing the exception was handed:
the qualified type and every frame (file, line, function and that line of source, which is
code, never data), then each exception it was raised from or while handling, by type only.

Plain standard library with no Django, so every layer may use it, the engine included
(pyproject's import-linter contracts let the engine import this module and `boardwalk.codes`
only from the core).
"""

from __future__ import annotations

import traceback
from pathlib import Path

# Frames in the repository are shown from its root; others (the standard library, packages
# in site-packages) keep their full path, which says which installation raised.
_ROOT = Path(__file__).resolve().parent.parent
# A chain this long is a loop of re-raises; a traceback this deep is a recursion. Either way
# the frames nearest the raise are the ones that say what failed.
MAX_CHAIN = 8
MAX_FRAMES = 60


def exception_type(exc: BaseException) -> str:
    """`module.Qualname` of the exception's class; builtins by their bare name (`KeyError`)."""
    kind = type(exc)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def exception_trace(exc: BaseException) -> str:
    """The type and frames of `exc` and of the exceptions behind it, never a message or a local.

    Lines as Python prints a traceback (most recent call last), the logged exception first:

        IndexError
          File "inference/engine/scheduler.py", line 170, in _admit
            blocks = self.pool.take(needed)
        raised while handling KeyError
          File "inference/engine/blocks.py", line 88, in take
            ...
    """
    lines: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    link = ""
    while current is not None and id(current) not in seen and len(seen) < MAX_CHAIN:
        seen.add(id(current))
        lines.append(f"{link}{exception_type(current)}")
        lines.extend(_frames(current))
        if current.__cause__ is not None:
            current, link = current.__cause__, "caused by "
        elif current.__context__ is not None and not current.__suppress_context__:
            current, link = current.__context__, "raised while handling "
        else:
            current = None
    return "\n".join(lines)


def _frames(exc: BaseException) -> list[str]:
    summaries = list(traceback.extract_tb(exc.__traceback__))
    lines: list[str] = []
    if len(summaries) > MAX_FRAMES:
        lines.append(f"  ... {len(summaries) - MAX_FRAMES} outer frame(s) left out")
        summaries = summaries[-MAX_FRAMES:]
    for frame in summaries:
        lines.append(
            f'  File "{_shown_path(frame.filename)}", line {frame.lineno}, in {frame.name}'
        )
        if frame.line:
            lines.append(f"    {frame.line.strip()}")
    return lines


def _shown_path(filename: str) -> str:
    path = Path(filename)
    try:
        return path.resolve().relative_to(_ROOT).as_posix()
    except (ValueError, OSError):
        return filename
