"""Text and values on their way into PostgreSQL: what a ``text`` or ``jsonb`` column can hold.

Pure functions without database access, shared by the handler-control exceptions, the failure
reports and the runner. None of them raises, whatever object it is given.
"""

from __future__ import annotations

import json
import re
from typing import Any


def storable_text(text: str) -> str:
    """``text`` made storable in a PostgreSQL ``text`` column of a UTF-8 database.

    NUL becomes ``\\x00`` and every code point UTF-8 cannot encode (lone surrogates, e.g. from
    ``os.fsdecode`` of undecodable bytes) becomes its ``\\udXXX`` escape, so the message stays
    readable instead of failing the report.
    """
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def exception_message(exc: BaseException) -> str:
    """``str(exc)``, or a description of what ``str()`` raised (an exception whose ``__str__``
    raises is still described)."""
    try:
        return str(exc)
    except Exception as broken:
        try:
            return f"<its message could not be read: str() raised {type(broken).__name__}>"
        except Exception:  # pragma: no cover - a type without a name
            return "<its message could not be read>"


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` (or ``Type`` alone when the message is empty); not yet made storable."""
    try:
        name = type(exc).__name__
    except Exception:  # pragma: no cover - a type without a name
        name = "Exception"
    message = exception_message(exc)
    return f"{name}: {message}" if message else name


_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
"""A JSON ``\\u0000`` escape (an even run of backslashes before it: not the literal text)."""


def unstorable(output: Any) -> str | None:
    """Why PostgreSQL's jsonb could not hold ``output`` (``None`` when it can).

    Rejects what Python's json accepts but jsonb does not: NaN and Infinity, the NUL character
    (U+0000) in any string, code points UTF-8 cannot encode (lone surrogates), and anything json
    cannot encode at all (including nesting too deep to serialise). The literal text
    ``\\u0000`` (a backslash followed by ``u0000``) is ordinary text and is stored.
    """
    try:
        text = json.dumps(output, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        return str(exc)
    except RecursionError:
        return "it is nested too deeply to serialise as JSON"
    except Exception as exc:
        return f"serialising it as JSON raised {type(exc).__name__}"
    if "\x00" in text or _NUL_ESCAPE.search(text):
        return "it contains a NUL character (U+0000), which PostgreSQL cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "it contains a code point UTF-8 cannot encode (a lone surrogate), which PostgreSQL cannot store"
    return None
