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
    flows, steps, indexes = (list(x) for x in zip(*routes))
    rows = conn.execute(
        sqlfiles.statement("queries/naming.sql", "check_step_queue_names"),
        {"flows": flows, "steps": steps, "indexes": indexes},
    ).fetchall()
    from_sql = {(f, s, i): (q, k, r) for f, s, i, q, k, r in rows}
    for flow, step, index in routes:
        expected = naming.step_queue_name(flow, step, index)
        assert (expected.name, expected.kind, expected.reason) == from_sql[(flow, step, index)], (flow, step, index)


def test_parity_covers_boundaries(conn):
    # Deterministic boundary cases next to the random ones: 47/48 characters, index fallback.
    cases = [("f" * 40, "abcde", 0), ("f" * 40, "abcdef", 7), ("f" * 45, "step", 9), ("f" * 45, "step", 10), ("MiXed", "CaSe", 1)]
    flows, steps, indexes = (list(x) for x in zip(*cases))
    rows = conn.execute(
        sqlfiles.statement("queries/naming.sql", "check_step_queue_names"),
        {"flows": flows, "steps": steps, "indexes": indexes},
    ).fetchall()
    got = {(f, s, i): (q, k, r) for f, s, i, q, k, r in rows}
    assert got[("f" * 40, "abcde", 0)] == ("f" * 40 + "__abcde", "readable", None)
    assert got[("f" * 40, "abcdef", 7)] == ("f" * 40 + "__7", "index", None)
    assert got[("f" * 45, "step", 9)] == (None, None, "queue_name_too_long")
    assert got[("MiXed", "CaSe", 1)] == ("mixed__case", "readable", None)
