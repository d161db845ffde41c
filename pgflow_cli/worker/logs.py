"""The worker's log output: records with fields (flow, step, run, task, attempt) and a JSON formatter.

The worker logs through the standard :mod:`logging` package under ``pgflow.worker`` and never
configures logging itself. Each task-related record carries its fields as record attributes
(``extra``), which :class:`JsonFormatter` writes as JSON members, one object per line::

    import logging, sys
    from pgflow_cli.worker.logs import JsonFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler])

Logs name flows, steps, runs, task indexes, queues and message ids; never inputs, outputs or
message bodies. A handler's exception message is logged as the task's error.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

FIELDS = ("event", "worker_id", "flow", "step", "run_id", "task_index", "message_id", "queue", "attempt",
          "max_attempts", "retry_in_seconds", "error_type", "error", "when_exhausted", "left_running", "reason")
"""Record attributes the worker sets (``extra=``) and :class:`JsonFormatter` writes when present."""


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message``,
    the worker's fields that the record carries (:data:`FIELDS`) and, when the record has
    exception information, ``traceback``."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            if name in record.__dict__:
                document[name] = record.__dict__[name]
        if record.exc_info:
            document["traceback"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["traceback"] = record.exc_text
        return json.dumps(document, default=str, ensure_ascii=False)


def configure(level: str, log_format: str) -> None:
    """Log to stderr at ``level`` as ``text`` (one line per record) or ``json`` (:class:`JsonFormatter`).
    Replaces the root logger's handlers (what ``pgflow worker`` uses)."""
    import sys

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json"
                         else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
