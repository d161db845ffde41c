""""Did you mean": the flow or step slug a mistyped one probably meant.

Slugs are exact and case-sensitive, so ``pgflow status --flow Orders`` names no flow when the flow
is ``orders``. The suggestion is read from the database's own names (``sql/queries/names.sql``):
first those equal ignoring case, then the closest by :func:`difflib.get_close_matches`.
"""

from __future__ import annotations

import difflib
import uuid
from collections.abc import Iterable

import psycopg

from pgflow_cli import sqlfiles

QUERIES = "queries/names.sql"

CUTOFF = 0.6
"""Similarity (0..1, :class:`difflib.SequenceMatcher` ratio) a name needs to be suggested."""


def suggestions(wanted: str, known: Iterable[str], limit: int = 3) -> list[str]:
    """The names of ``known`` that ``wanted`` probably meant, best first.

    Args:
        wanted: what was given.
        known: the names that exist.
        limit: at most this many.

    Returns:
        Names equal to ``wanted`` ignoring case, then close ones (compared ignoring case); never ``wanted`` itself.
    """
    names = sorted(set(known) - {wanted})
    by_lower: dict[str, list[str]] = {}
    for name in names:
        by_lower.setdefault(name.lower(), []).append(name)
    found = list(by_lower.get(wanted.lower(), []))
    for close in difflib.get_close_matches(wanted.lower(), list(by_lower), n=limit, cutoff=CUTOFF):
        found += [name for name in by_lower[close] if name not in found]
    return found[:limit]


def did_you_mean(wanted: str, known: Iterable[str]) -> str:
    """`` (did you mean 'orders'?)`` to append to a message, or ``""`` when nothing is close."""
    found = suggestions(wanted, known)
    if not found:
        return ""
    return f" (did you mean {' or '.join(repr(name) for name in found)}?)"


def flow_slugs(conn: psycopg.Connection) -> list[str]:
    """Every flow slug of the database."""
    return [str(row[0]) for row in conn.execute(sqlfiles.statement(QUERIES, "flow_slugs")).fetchall()]


def unknown_flows(conn: psycopg.Connection, wanted: Iterable[str]) -> str:
    """The message part naming flow slugs that do not exist, each with its suggestion:
    ``'ordrs' (did you mean 'orders'?), 'x'``."""
    known = flow_slugs(conn)
    return ", ".join(f"{slug!r}{did_you_mean(slug, known)}" for slug in wanted)


def run_step_slugs(conn: psycopg.Connection, run_id: str | uuid.UUID) -> list[str]:
    """The step slugs of the flow of ``run_id`` (empty when there is no such run)."""
    return [str(row[0]) for row in
            conn.execute(sqlfiles.statement(QUERIES, "run_step_slugs"), {"run_id": str(run_id)}).fetchall()]
