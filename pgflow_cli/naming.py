"""Slug rules and generated queue names: the Python mirror of the SQL contract.

SQL is authoritative (``sql/fragments/slug_violations.sql`` and
``sql/fragments/step_queue_names.sql``, used by the audit and by the migrations).
This module repeats the same rules so the CLI can reject a bad name before it
opens a connection; ``tests/test_naming_parity.py`` proves both sides give the
same answer for thousands of generated names.

Rules (spec "Shared slug rules and upgrade audit", "Generated per-step names"):

* a flow or step slug is 1..128 characters from ``[A-Za-z0-9_]`` (ASCII only),
  does not start with a digit, is not a reserved word (``run``);
* new in the queue-identity release: no leading ``_``, no trailing ``_``, no
  ``__`` anywhere (``__`` is reserved for generated queue names);
* flow slugs are unique ignoring case; step slugs are unique ignoring case
  within one flow (queue names are lowercase);
* the default queue of a flow is ``lower(flow_slug)``; a private step queue is
  ``lower(flow_slug || '__' || step_slug)`` when that fits in 47 characters,
  else ``lower(flow_slug || '__' || step_index)`` (zero-based), else the whole
  flow is rejected. Names are never truncated or hashed.

Every violation has a stable reason code (:data:`SLUG_REASONS`), and all
reasons of a name are reported in that fixed order, not only the first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from pgflow_cli.errors import UsageError

MAX_SLUG_LENGTH = 128
"""Longest flow or step slug, in characters (upstream ``is_valid_slug``)."""

MAX_QUEUE_NAME_LENGTH = 47
"""Longest PGMQ queue name, in characters: ``template_pgmq_q_`` (16) + 47 = 63 = NAMEDATALEN - 1."""

MAX_IDENTIFIER_BYTES = 63
"""PostgreSQL identifier limit in bytes; PGMQ table names are ``q_``/``a_`` + queue name."""

RESERVED_WORDS = frozenset({"run"})
"""Slugs that collide with keys pgflow puts into step input (case-sensitive, as upstream)."""

SLUG_REASONS: tuple[str, ...] = (
    "empty",
    "too_long",
    "invalid_character",
    "leading_digit",
    "leading_underscore",
    "trailing_underscore",
    "double_underscore",
    "reserved_word",
)
"""Stable reason codes, in the order they are reported."""

REASON_TEXT = {
    "empty": "is empty",
    "too_long": f"is longer than {MAX_SLUG_LENGTH} characters",
    "invalid_character": "contains a character other than ASCII letters, digits and _",
    "leading_digit": "starts with a digit",
    "leading_underscore": "starts with _",
    "trailing_underscore": "ends with _",
    "double_underscore": "contains __ (reserved for generated queue names)",
    "reserved_word": "is a reserved word",
    "queue_name_too_long": f"gives a queue name longer than {MAX_QUEUE_NAME_LENGTH} characters",
    "invalid_flow_slug": "has an invalid flow slug",
    "invalid_step_slug": "has an invalid step slug",
    "invalid_step_index": "has a negative or missing step index",
}
"""Human wording of every reason code, for messages and docs."""

NEW_RULE_REASONS = frozenset({"leading_underscore", "trailing_underscore", "double_underscore"})
"""Reasons introduced by the queue-identity release (existing data may violate only these)."""

_ALLOWED = re.compile(r"[A-Za-z0-9_]*", re.ASCII)
_DIGITS = "0123456789"


def slug_violations(slug: str | None) -> tuple[str, ...]:
    """Return every rule a flow or step slug breaks, as reason codes.

    Args:
        slug: the candidate slug (any text; ``None`` counts as empty).

    Returns:
        A tuple of codes from :data:`SLUG_REASONS` in that order; empty when the
        slug is valid. An empty or missing slug yields only ``("empty",)``.

    Mirrors ``sql/fragments/slug_violations.sql`` exactly.
    """
    if slug is None or slug == "":
        return ("empty",)
    hits = (
        ("too_long", len(slug) > MAX_SLUG_LENGTH),
        ("invalid_character", _ALLOWED.fullmatch(slug) is None),
        ("leading_digit", slug[0] in _DIGITS),
        ("leading_underscore", slug[0] == "_"),
        ("trailing_underscore", slug[-1] == "_"),
        ("double_underscore", "__" in slug),
        ("reserved_word", slug in RESERVED_WORDS),
    )
    return tuple(code for code, hit in hits if hit)


def is_valid_slug(slug: str | None) -> bool:
    """True when :func:`slug_violations` finds nothing."""
    return not slug_violations(slug)


def normalized_slug(slug: str) -> str:
    """The case-folded key under which slugs must be unique (ASCII lowercase).

    Only ASCII letters are lowered, like SQL ``lower(x COLLATE "C")``, so the
    result never depends on the database's locale.
    """
    return slug.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True)
class QueueName:
    """Outcome of a queue-name derivation.

    Attributes:
        name: the generated lowercase queue name, or ``None`` when rejected.
        reason: ``None`` on success, else one reason code
            (``invalid_flow_slug``, ``invalid_step_slug``, ``invalid_step_index``,
            ``queue_name_too_long``).
        kind: ``"default"``, ``"readable"`` or ``"index"`` for a generated name.
    """

    name: str | None
    reason: str | None
    kind: str | None = None


def default_queue_name(flow_slug: str) -> QueueName:
    """Derive the queue of a plain flow: ``lower(flow_slug)`` if it fits 47 characters.

    Args:
        flow_slug: the concrete flow slug.

    Returns:
        A :class:`QueueName` with ``kind="default"`` or a rejection reason.
    """
    if slug_violations(flow_slug):
        return QueueName(None, "invalid_flow_slug")
    name = normalized_slug(flow_slug)
    if len(name) > MAX_QUEUE_NAME_LENGTH:
        return QueueName(None, "queue_name_too_long")
    return QueueName(name, None, "default")


def step_queue_name(flow_slug: str, step_slug: str, step_index: int | None) -> QueueName:
    """Derive a private step queue name (spec "Generated per-step names").

    Args:
        flow_slug: the concrete flow slug.
        step_slug: the step slug.
        step_index: zero-based position of the step in the flow definition.

    Returns:
        ``lower(flow__step)`` (kind ``readable``) when it fits 47 characters, else
        ``lower(flow__index)`` (kind ``index``) when that fits, else a rejection
        with reason ``queue_name_too_long``. Invalid slugs or a negative index are
        rejected before any name is built.

    Mirrors ``sql/fragments/step_queue_names.sql`` exactly.
    """
    if slug_violations(flow_slug):
        return QueueName(None, "invalid_flow_slug")
    if slug_violations(step_slug):
        return QueueName(None, "invalid_step_slug")
    if step_index is None or step_index < 0:
        return QueueName(None, "invalid_step_index")
    readable = normalized_slug(f"{flow_slug}__{step_slug}")
    if len(readable) <= MAX_QUEUE_NAME_LENGTH:
        return QueueName(readable, None, "readable")
    fallback = normalized_slug(f"{flow_slug}__{step_index}")
    if len(fallback) <= MAX_QUEUE_NAME_LENGTH:
        return QueueName(fallback, None, "index")
    return QueueName(None, "queue_name_too_long")


def step_queue_routes(flow_slug: str, step_slugs: Iterable[str]) -> dict[str, str]:
    """Derive the complete private route map of a step-queued flow, or reject it whole.

    Args:
        flow_slug: the concrete flow slug.
        step_slugs: the step slugs in definition order (index = position).

    Returns:
        ``{step_slug: queue_name}`` in definition order.

    Raises:
        UsageError: listing every step whose name is invalid, every case-only
            duplicate and every step whose queue name cannot be generated; the
            flow is rejected as a whole (nothing partial), exit code 2.
    """
    problems: list[str] = []
    routes: dict[str, str] = {}
    seen: dict[str, str] = {}
    flow_reasons = slug_violations(flow_slug)
    if flow_reasons:
        problems.append(f"flow {flow_slug!r}: " + describe_reasons(flow_reasons))
    for index, step in enumerate(step_slugs):
        reasons = slug_violations(step)
        if reasons:
            problems.append(f"step {step!r}: " + describe_reasons(reasons))
            continue
        key = normalized_slug(step)
        if key in seen:
            problems.append(f"step {step!r}: differs from step {seen[key]!r} only by case")
            continue
        seen[key] = step
        if flow_reasons:
            continue
        queue = step_queue_name(flow_slug, step, index)
        if queue.name is None:
            readable, fallback = len(flow_slug) + 2 + len(step), len(flow_slug) + 2 + len(str(index))
            problems.append(f"step {step!r} (index {index}): {describe_reasons([queue.reason or ''])}: "
                            f"{flow_slug}__{step} has {readable} characters and {flow_slug}__{index} has {fallback}")
            continue
        routes[step] = queue.name
    if problems:
        raise UsageError(
            f"flow {flow_slug!r} cannot use private step queues",
            hint="choose shorter or compliant slugs for a new concrete flow; nothing was changed",
            detail=problems,
        )
    return routes


def describe_reasons(reasons: Iterable[str]) -> str:
    """Join reason codes into one readable clause, e.g. ``"starts with _; ends with _"``."""
    return "; ".join(f"{REASON_TEXT.get(code, code)} [{code}]" for code in reasons)


def validate_slug(slug: str, *, what: str = "slug") -> str:
    """Return ``slug`` unchanged, or raise :class:`UsageError` naming every broken rule.

    Args:
        slug: the candidate slug.
        what: how to name it in the message (``"flow slug"``, ``"step slug"``).
    """
    reasons = slug_violations(slug)
    if reasons:
        raise UsageError(
            f"{what} {slug!r} is not valid: {describe_reasons(reasons)}",
            hint="use letters, digits and single inner underscores, starting with a letter, e.g. 'processOrder' or 'process_order'",
        )
    return slug
