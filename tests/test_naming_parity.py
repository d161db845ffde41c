"""Python and SQL apply identical slug and queue-name rules (DESIGN.md "parity test").

Generated names go through ``pgflow_cli.naming`` and through the SQL fragments that the
audit and the migrations include; every answer must match. At least 5,000 names per
property (batches of 50 over 120 examples).
"""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgflow_cli import naming, sqlfiles

# PostgreSQL text cannot hold NUL, and UTF-8 cannot hold lone surrogates.
any_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=140
)
near_valid = st.from_regex(r"[A-Za-z_0-9][A-Za-z0-9_]{0,60}", fullmatch=True)
underscores = st.text(alphabet="ab_A1", min_size=1, max_size=12)
whitespace = st.builds(lambda a, w, b: a + w + b, near_valid, st.sampled_from([" ", "\t", "\n", "\u00a0", "\u2003"]), near_valid)
long_names = st.text(alphabet=string.ascii_letters + string.digits + "_", min_size=120, max_size=135)
unicode_letters = st.text(alphabet="aZéßİıΣσ字_1", min_size=1, max_size=20)
names = st.one_of(any_text, near_valid, underscores, whitespace, long_names, unicode_letters, st.just("run"), st.just(""))



def _repair(raw: str) -> str:
    """Turn any [A-Za-z0-9_] text into a valid slug (cheap to generate, unlike a regex strategy)."""
    text = "_".join(part for part in raw.split("_") if part)
    text = text.lstrip(string.digits + "_")
    text = text if text and text[0].isalpha() else "a" + text
    return text + "1" if text == "run" else text


valid_slug = st.text(alphabet=string.ascii_letters + string.digits + "_", max_size=60).map(_repair)

BATCH = 50
EXAMPLES = 120  # 120 x 50 = 6,000 names per property


def sql_queue_names(conn, routes):
    """``{(flow, step, index): (queue_name, name_kind, reason)}`` as the SQL fragment derives them."""
    flows, steps, indexes = (list(x) for x in zip(*routes, strict=True))
    rows = conn.execute(
        sqlfiles.statement("queries/naming.sql", "check_step_queue_names"),
        {"flows": flows, "steps": steps, "indexes": indexes},
    ).fetchall()
    return {(f, s, i): (q, k, r) for f, s, i, q, k, r in rows}


@pytest.fixture(scope="module")
def conn(harness):
    database = harness.clone(None, "naming_parity")
    connection = database.connect()
    yield connection
    harness.drop(database)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batch=st.lists(names, min_size=BATCH, max_size=BATCH))
def test_slug_rules_match_sql(conn, batch):
    rows = conn.execute(sqlfiles.statement("queries/naming.sql", "check_slugs"), {"slugs": batch}).fetchall()
    from_sql = {slug: tuple(reasons) for slug, reasons in rows}
    assert len(from_sql) == len(set(batch))
    for name in batch:
        assert naming.slug_violations(name) == from_sql[name], repr(name)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(routes=st.lists(st.tuples(valid_slug, valid_slug, st.integers(min_value=0, max_value=10_000)), min_size=BATCH, max_size=BATCH))
def test_step_queue_names_match_sql(conn, routes):
    from_sql = sql_queue_names(conn, routes)
    for flow, step, index in routes:
        expected = naming.step_queue_name(flow, step, index)
        assert (expected.name, expected.kind, expected.reason) == from_sql[(flow, step, index)], (flow, step, index)


def test_parity_covers_boundaries(conn):
    # Deterministic boundary cases next to the random ones: 47/48 characters, index fallback.
    cases = [("f" * 40, "abcde", 0), ("f" * 40, "abcdef", 7), ("f" * 45, "step", 9), ("f" * 45, "step", 10), ("MiXed", "CaSe", 1)]
    got = sql_queue_names(conn, cases)
    assert got[("f" * 40, "abcde", 0)] == ("f" * 40 + "__abcde", "readable", None)
    assert got[("f" * 40, "abcdef", 7)] == ("f" * 40 + "__7", "index", None)
    assert got[("f" * 45, "step", 9)] == (None, None, "queue_name_too_long")
    assert got[("MiXed", "CaSe", 1)] == ("mixed__case", "readable", None)


def _slug_of(length: int, seed: str) -> str:
    """A valid slug of exactly ``length`` characters (letters and digits, mixed case)."""
    body = (seed or "a") * (length // max(len(seed), 1) + 1)
    return ("q" + body)[:length]


# Names whose readable form lands on 45..49 characters: both sides of the 47-character limit,
# with indexes of one, two and three digits so the fallback crosses the limit too.
boundary_routes = st.builds(
    lambda flow_len, readable_len, index, a, b: (_slug_of(flow_len, a), _slug_of(max(readable_len - flow_len - 2, 1), b), index),
    st.integers(min_value=1, max_value=46),
    st.integers(min_value=45, max_value=49),
    st.one_of(st.integers(min_value=0, max_value=9), st.integers(min_value=10, max_value=99), st.integers(min_value=100, max_value=999)),
    st.text(alphabet="aBcD1", min_size=1, max_size=3),
    st.text(alphabet="xYz2", min_size=1, max_size=3),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(routes=st.lists(boundary_routes, min_size=BATCH, max_size=BATCH))
def test_step_queue_names_match_sql_at_the_47_character_boundary(conn, routes):
    from_sql = sql_queue_names(conn, routes)
    for flow, step, index in routes:
        expected = naming.step_queue_name(flow, step, index)
        assert (expected.name, expected.kind, expected.reason) == from_sql[(flow, step, index)], (flow, step, index)
        readable = len(flow) + 2 + len(step)
        fallback = len(flow) + 2 + len(str(index))
        assert expected.kind == ("readable" if readable <= 47 else "index" if fallback <= 47 else None)


def test_parity_at_the_boundary_with_a_two_digit_index(conn):
    cases = [("f" * 43, "s" * 2, 10), ("f" * 43, "s" * 3, 10), ("f" * 44, "s" * 2, 10), ("f" * 44, "s" * 2, 9)]
    got = sql_queue_names(conn, cases)
    assert got[("f" * 43, "ss", 10)] == ("f" * 43 + "__ss", "readable", None)  # 47: readable fits
    assert got[("f" * 43, "sss", 10)] == ("f" * 43 + "__10", "index", None)  # 48 -> two-digit fallback, 47
    assert got[("f" * 44, "ss", 10)] == (None, None, "queue_name_too_long")  # 48 and 48: rejected
    assert got[("f" * 44, "ss", 9)] == ("f" * 44 + "__9", "index", None)
    for case, answer in got.items():
        mirror = naming.step_queue_name(*case)
        assert (mirror.name, mirror.kind, mirror.reason) == answer
