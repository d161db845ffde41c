"""Check a JSON value the way PostgreSQL's ``jsonb`` will read it, before it is sent.

Python's :mod:`json` accepts several things ``jsonb`` refuses, and a refusal from the server is a
database error that names no place in the value. This module finds them first and names the path of
the bad value (``$.items[3].name``), so a command can exit 2 with an actionable message:

* the NUL character (``\\u0000``) in a string or a key: ``jsonb`` cannot hold it;
* a lone UTF-16 surrogate (``\\ud800`` without its pair): not a character UTF-8 can encode;
* ``NaN``, ``Infinity``, ``-Infinity``: not JSON, although Python reads and writes them;
* a number outside ``numeric``: more than 131,072 digits before the decimal point or more than
  16,383 after it (``1e200000``, ``1e-20000``);
* nesting deeper than :data:`MAX_DEPTH` (see there why the bound is lower than the server's);
* (Python values only) anything that is not a JSON value: a set, bytes, a datetime, a non-string key.

Two entry points: :func:`parse_text` for JSON text (a ``--input`` option, a file) and
:func:`check_value` for a Python value about to be sent as ``jsonb``. Both raise
:class:`JsonValueError` (a :class:`~pgflow_cli.errors.UsageError`, exit 2) and import nothing beyond
the standard library, so every layer (the client library, the commands) can use them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from pgflow_cli.errors import UsageError

MAX_DEPTH = 512
"""Deepest nesting of arrays and objects accepted. PostgreSQL's parser, with the default
``max_stack_depth`` of 2 MB, reads about 10,000 levels; but whatever reads the value back in Python
(psycopg's ``jsonb`` loader, the reference worker's handlers) uses :func:`json.loads`, which stops near
the interpreter's recursion limit (1,000 frames). 512 levels leave room for the frames of the caller."""

NUMERIC_INTEGER_DIGITS = 131_072
"""Most digits ``numeric`` holds before the decimal point."""
NUMERIC_SCALE = 16_383
"""Most digits ``numeric`` holds after the decimal point (its largest display scale)."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_COMPONENT = re.compile(r'\.[A-Za-z_][A-Za-z0-9_]*|\[(?:[0-9]+|"(?:[^"\\]|\\.)*")\]')
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},:]', re.S)
"""The tokens the depth scan needs: whole strings (so brackets inside them are skipped) and punctuation."""


class JsonValueError(UsageError):
    """A value PostgreSQL would refuse as ``jsonb`` (exit 2).

    Attributes:
        path: where the bad value is, as ``$`` (the whole value), ``$.key``, ``$[3]`` or ``$["odd key"]``.
        reason: what is wrong with it, without the value itself (inputs may be confidential).
    """

    def __init__(self, what: str, path: str, reason: str) -> None:
        super().__init__(f"{what}: the value at {_shortened(path)} {reason}",
                         hint="PostgreSQL's jsonb cannot store it; change that value (docs/commands/runs.md "
                         "\"JSON inputs\")")
        self.path = path
        self.reason = reason


def _shortened(path: str, keep: int = 6) -> str:
    """``path`` with the middle of a deep path left out: ``$[0][0]...(500 more)...[0]``."""
    parts = _COMPONENT.findall(path, 1)
    if len(parts) <= 2 * keep:
        return path
    return "$" + "".join(parts[:keep]) + f"...({len(parts) - 2 * keep} more)..." + "".join(parts[-keep:])


def _step(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    text = str(key)
    if _IDENTIFIER.fullmatch(text):
        return f"{path}.{text}"
    return f"{path}[{json.dumps(text, ensure_ascii=True)}]"


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains the NUL character (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone UTF-16 surrogate (such as \\ud800 without its pair)"
    return None


def check_text(text: str, *, what: str) -> None:
    """Refuse a plain string PostgreSQL's ``text`` cannot store (an error message, a label).

    Bytes on a command line that are not UTF-8 reach Python as lone surrogates (PEP 383); the
    driver would fail to encode them, so they are refused here by the option that carried them.

    Args:
        text: the string about to be sent.
        what: how the message names it (``"--error"``).

    Raises:
        UsageError: the string holds a NUL character or a lone surrogate (exit 2).
    """
    problem = _text_problem(text)
    if problem:
        raise UsageError(f"{what} {problem}", hint="PostgreSQL text holds UTF-8 without NUL; "
                         "pass the text in UTF-8 (check the terminal's locale)")


def _number_problem(number: Decimal) -> str | None:
    if not number.is_finite():
        return "is NaN or infinite, which is not JSON"
    exponent = number.as_tuple().exponent
    assert isinstance(exponent, int)  # finite
    if -exponent > NUMERIC_SCALE:
        return f"has more than {NUMERIC_SCALE:,} digits after the decimal point"
    if number and number.adjusted() >= NUMERIC_INTEGER_DIGITS:
        return f"has more than {NUMERIC_INTEGER_DIGITS:,} digits before the decimal point"
    return None


def check_value(value: Any, *, what: str = "the input") -> None:
    """Refuse a Python value that cannot be sent as ``jsonb`` as it is.

    Walks the value without recursion, so a value nested far too deep is refused by its depth
    instead of overflowing the interpreter's stack.

    Args:
        value: a JSON-like value: dict (string keys; int, float, bool and None keys are written as
            strings, as :func:`json.dumps` does), list or tuple, str, int, float, bool, None, or a
            :class:`~decimal.Decimal`.
        what: how messages name the value (``"--input"``, ``"the input of run 3"``).

    Raises:
        JsonValueError: the first problem met (depth first, in document order), with its path.
    """
    stack: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while stack:
        item, path, depth = stack.pop()
        problem: str | None = None
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, str):
            problem = _text_problem(item)
        elif isinstance(item, int):
            digits = item.bit_length() * 0.30103  # log10(2): no str() of a huge int (Python limits it)
            if digits > NUMERIC_INTEGER_DIGITS:
                problem = f"has more than {NUMERIC_INTEGER_DIGITS:,} digits"
            elif digits > 4000:
                try:
                    str(item)
                except ValueError:
                    problem = "has more digits than Python's json module writes (sys.set_int_max_str_digits)"
        elif isinstance(item, float):
            problem = None if item == item and item not in (float("inf"), float("-inf")) \
                else "is NaN or infinite, which is not JSON"
        elif isinstance(item, Decimal):
            problem = _number_problem(item)
        elif isinstance(item, (Mapping, list, tuple)):
            if depth >= MAX_DEPTH:
                problem = f"is nested deeper than {MAX_DEPTH} levels"
            elif isinstance(item, Mapping):
                children: list[tuple[Any, str, int]] = []
                for key, child in item.items():
                    if not isinstance(key, (str, int, float, bool)) and key is not None:
                        raise JsonValueError(what, path, f"has a key of type {type(key).__name__}, not a string")
                    key_text = json.dumps(key) if not isinstance(key, str) else key
                    key_problem = _text_problem(key_text)
                    if key_problem:
                        raise JsonValueError(what, _step(path, key_text), "has a key that " + key_problem)
                    children.append((child, _step(path, key_text), depth + 1))
                stack.extend(reversed(children))
            else:
                stack.extend((child, _step(path, index), depth + 1) for index, child in reversed(list(enumerate(item))))
        else:
            problem = f"is a {type(item).__name__}, not a JSON value"
        if problem:
            raise JsonValueError(what, path, problem)


def _too_deep(text: str) -> tuple[str, int] | None:
    """The path and offset of the first array or object opened deeper than :data:`MAX_DEPTH`, read
    from the tokens alone (the text may be too deep for :func:`json.loads`)."""
    stack: list[list[Any]] = []  # per open container: its bracket, elements seen, the key being read
    last_string = ""
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token[0] == '"':
            last_string = token
        elif token in "[{":
            if len(stack) >= MAX_DEPTH:
                path = "$"
                for bracket, index, key in stack:
                    path = _step(path, index) if bracket == "[" else _step(path, key)
                return path, match.start()
            stack.append([token, 0, ""])
        elif token in "]}":
            if stack:
                stack.pop()
        elif token == "," and stack:
            stack[-1][1] += 1
        elif token == ":" and stack:
            try:
                stack[-1][2] = json.loads(last_string)
            except ValueError:
                stack[-1][2] = last_string
    return None


def _line_column(text: str, offset: int) -> str:
    line = text.count("\n", 0, offset) + 1
    return f"line {line} column {offset - (text.rfind(chr(10), 0, offset) + 1) + 1}"


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_text(text: str, *, what: str = "the input") -> Any:
    """Parse JSON text and refuse what ``jsonb`` would refuse; returns the value.

    Numbers come back as :class:`~decimal.Decimal` (exactly as written: no float rounding and no
    limit on digits), so a caller that needs the value can keep it; a caller that only checks can
    send ``text`` itself (PostgreSQL then reads exactly what was checked).

    Args:
        text: the JSON document.
        what: how messages name it (``"--input"``, ``"input.json"``).

    Raises:
        JsonValueError: a value PostgreSQL would refuse, with its path.
        UsageError: not JSON at all (with line and column), exit 2.
    """
    deep = _too_deep(text)
    if deep is not None:
        path, offset = deep
        raise JsonValueError(what, path, f"is nested deeper than {MAX_DEPTH} levels ({_line_column(text, offset)})")
    try:
        value = json.loads(text, parse_float=Decimal, parse_int=Decimal, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc.msg} ({_line_column(text, exc.pos)})",
                         hint="quote the JSON for your shell, e.g. --input '{\"id\": 1}', or read it from a file "
                         "with --input @FILE") from None
    except ValueError as exc:  # NaN / Infinity
        raise UsageError(f"{what} is not valid JSON: {exc}",
                         hint="JSON has no NaN or Infinity; write null or a number") from None
    check_value(value, what=what)
    return value
