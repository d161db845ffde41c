"""Shared slug rules in the definition functions of 0003, and SQL/Python parity of the installed functions.

Every reason a slug breaks is named in the PF003 message, in the fixed order of
pgflow_cli.naming.SLUG_REASONS; a refused definition changes nothing.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgflow_cli import naming
from tests.runtime.driver import commit_when_blocked, install_all, raises_sqlstate
from tests.stage1.conftest import primary
from tests.test_naming_parity import names, valid_slug

TOO_LONG = "a" * 129
# slug -> every reason it breaks, in reporting order
BAD_SLUGS = {
    "_lead": ["leading_underscore"],
    "trail_": ["trailing_underscore"],
    "dou__ble": ["double_underscore"],
    "1digit": ["leading_digit"],
    "bad-char": ["invalid_character"],
    "naïve": ["invalid_character"],
    TOO_LONG: ["too_long"],
    "run": ["reserved_word"],
    "": ["empty"],
    "_x__y_": ["leading_underscore", "trailing_underscore", "double_underscore"],
    "1" + "x-" * 70 + "a__b_": ["too_long", "invalid_character", "leading_digit", "trailing_underscore", "double_underscore"],
}


def _shape(*slugs: str) -> dict:
    return {"steps": [{"slug": s, "stepType": "single", "dependencies": [], "options": {}, "whenUnmet": "skip",
                       "whenExhausted": "fail", "requiredInputPattern": {"defined": False},
                       "forbiddenInputPattern": {"defined": False}} for s in slugs], "options": {}}


def _nothing_defined(rt) -> None:
    assert rt.val("SELECT count(*) FROM pgflow.flows") == 0
    assert rt.val("SELECT count(*) FROM pgmq.meta") == 0


def _refusals(rt, call: str, params, expected_message) -> list[str]:
    """Run ``call`` for every bad slug; return what differed from the expected PF003 refusal."""
    problems = []
    for slug, reasons in BAD_SLUGS.items():
        try:
            rt.conn.execute(call, params(slug))
        except Exception as exc:  # noqa: BLE001 - any outcome but the exact refusal is reported
            sqlstate = getattr(exc, "sqlstate", None)
            got = primary(exc) if sqlstate else repr(exc)
            want = expected_message(slug, ", ".join(reasons))
            if sqlstate != "PF003" or got != want:
                problems.append(f"{slug!r}: {sqlstate} {got!r}, expected PF003 {want!r}")
        else:
            problems.append(f"{slug!r}: accepted")
    return problems


def test_create_flow_names_every_broken_rule(rt):
    for slug, reasons in BAD_SLUGS.items():  # the Python mirror agrees on the fixture itself
        assert list(naming.slug_violations(slug)) == reasons, slug
    problems = _refusals(
        rt, "SELECT pgflow.create_flow(%s)", lambda slug: (slug,),
        lambda slug, reasons: f"invalid flow slug '{slug}': {reasons}",
    )
    assert problems == []
    _nothing_defined(rt)


def test_add_step_names_every_broken_rule(rt):
    rt.flow("host", [{"slug": "first"}])
    problems = _refusals(
        rt, "SELECT pgflow.add_step('host', %s, ARRAY['first'])", lambda slug: (slug,),
        lambda slug, reasons: f"invalid step slug '{slug}' in flow \"host\": {reasons}",
    )
    assert problems == []
    assert rt.val("SELECT array_agg(step_slug) FROM pgflow.steps") == ["first"]
    assert rt.val("SELECT count(*) FROM pgflow.deps") == 0


def test_null_slugs_are_refused(rt):
    with raises_sqlstate("PF003") as caught:
        rt.conn.execute("SELECT pgflow.create_flow(NULL)")
    assert primary(caught.error) == "invalid flow slug NULL: empty"
    rt.flow("host")
    with raises_sqlstate("PF003", "invalid step slug NULL in flow \"host\": empty"):
        rt.conn.execute("SELECT pgflow.add_step('host', NULL)")


def test_compliant_slugs_stay_valid(rt):
    """Single inner underscores, camelCase and digits after the first letter remain valid."""
    for slug in ("a", "snake_case_flow", "camelCaseFlow", "v2_orders", "A1b2C3", "x" * 47):
        rt.conn.execute("SELECT pgflow.create_flow(%s)", (slug,))
        rt.conn.execute("SELECT pgflow.add_step(%s, %s)", (slug, "step_" + slug[:100]))
    assert rt.val("SELECT count(*) FROM pgflow.flows") == 6


def test_flow_slug_whose_queue_name_is_too_long(rt):
    """A valid slug of 48..128 characters breaks no slug rule, but its default queue would exceed 47."""
    slug = "f" * 48
    assert naming.slug_violations(slug) == ()
    with raises_sqlstate("PF003") as caught:
        rt.conn.execute("SELECT pgflow.create_flow(%s)", (slug,))
    assert primary(caught.error) == f'flow slug "{slug}" is 48 characters long; its queue name may have at most 47'
    _nothing_defined(rt)


def test_startup_compile_refuses_a_bad_flow_slug(rt):
    with raises_sqlstate("PF003", r"invalid flow slug 'bad__flow': double_underscore"):
        rt.compile("bad__flow", _shape("a"))
    _nothing_defined(rt)


# -- case-only duplicates ------------------------------------------------------------------------


def test_case_only_duplicate_flows_are_refused(rt):
    rt.flow("MyFlow", [{"slug": "a"}])
    for alias in ("myflow", "MYFLOW", "myFlow"):
        with raises_sqlstate("PF003") as caught:
            rt.conn.execute("SELECT pgflow.create_flow(%s)", (alias,))
        assert primary(caught.error) == f'flow slug "{alias}" differs only by letter case from existing flow "MyFlow"'
        with raises_sqlstate("PF003", "differs only by letter case"):
            rt.compile(alias, _shape("a"))
    assert rt.val("SELECT array_agg(flow_slug) FROM pgflow.flows") == ["MyFlow"]
    assert rt.val("SELECT array_agg(queue_name::text) FROM pgmq.meta") == ["myflow"]
    # the same flow again is the idempotent upsert, not a duplicate
    assert rt.one("SELECT * FROM pgflow.create_flow('MyFlow')")["flow_slug"] == "MyFlow"


def test_concurrent_case_aliases_are_serialized_and_refused(rt, db):
    """Two definitions differing only by case, at the same time: the second waits for the first's
    normalized flow lock and then gets the case-only refusal (PF003), not a raw unique violation."""
    first = db.connect(autocommit=False)
    first.execute("SELECT pgflow.create_flow('RaceFlow')")
    second = db.connect()
    result = commit_when_blocked(rt.conn, first, second, lambda: second.execute("SELECT pgflow.create_flow('raceflow')"))
    assert first.info.backend_pid in result["blockers"]
    error = result.get("error")
    assert getattr(error, "sqlstate", None) == "PF003", result
    assert primary(error) == 'flow slug "raceflow" differs only by letter case from existing flow "RaceFlow"'
    assert rt.val("SELECT array_agg(flow_slug) FROM pgflow.flows") == ["RaceFlow"]


def test_case_only_duplicate_flows_are_refused_by_the_table_too(rt):
    rt.flow("MyFlow")
    with raises_sqlstate("23505", "idx_flows_normalized_slug"):
        rt.conn.execute("INSERT INTO pgflow.flows (flow_slug) VALUES ('MYFLOW')")


def test_case_only_duplicate_steps_are_refused(rt):
    rt.flow("steps", [{"slug": "Fetch"}])
    with raises_sqlstate("PF003") as caught:
        rt.conn.execute("SELECT pgflow.add_step('steps', 'fetch')")
    assert primary(caught.error) == 'step slug "fetch" differs only by letter case from step "Fetch" of flow "steps"'
    with raises_sqlstate("PF003", "differs only by letter case"):
        rt.conn.execute("SELECT pgflow.add_step('steps', 'FETCH', ARRAY['Fetch'])")
    assert rt.val("SELECT array_agg(step_slug) FROM pgflow.steps") == ["Fetch"]
    # the same step again is idempotent; the same slug in another flow is no conflict
    assert rt.one("SELECT * FROM pgflow.add_step('steps', 'Fetch')")["step_index"] == 0
    rt.flow("other", [{"slug": "fetch"}])
    with raises_sqlstate("23505", "idx_steps_normalized_slug"):
        rt.conn.execute(
            "INSERT INTO pgflow.steps (flow_slug, step_slug, step_index, queue_name) VALUES ('steps', 'FETCH', 5, 'steps')"
        )


def test_startup_compile_lists_case_only_duplicate_steps(rt):
    with raises_sqlstate("PF003") as caught:
        rt.compile("dupes", _shape("Fetch", "parse", "fetch"))
    assert caught.error.diag.message_detail == "step 'fetch' (index 2) differs only by letter case from step 'Fetch' (index 0)"
    _nothing_defined(rt)


# -- parity of the installed functions with pgflow_cli.naming --------------------------------------

_TRY = """
CREATE FUNCTION pg_temp.try_default(s text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  RETURN 'ok:' || pgflow.default_queue_name(s);
EXCEPTION WHEN SQLSTATE 'PF003' THEN
  RETURN 'PF003:' || SQLERRM;
END $$;
CREATE FUNCTION pg_temp.try_step(f text, s text, i integer) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  RETURN 'ok:' || pgflow.step_queue_name(f, s, i);
EXCEPTION WHEN SQLSTATE 'PF003' THEN
  RETURN 'PF003:' || SQLERRM;
END $$;
"""


@pytest.fixture(scope="module")
def parity_conn(harness):
    """One upgraded database for the generated names (read-only calls, no per-example clone)."""
    database = harness.clone(harness.template("latest", install_all), "stage1_parity")
    conn = database.connect()
    conn.execute(_TRY)
    yield conn
    harness.drop(database)


BATCH = 50
PARITY = settings(max_examples=6, deadline=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@PARITY
@given(batch=st.lists(st.one_of(names, st.none()), min_size=BATCH, max_size=BATCH))
def test_slug_violations_and_default_queue_name_agree_with_python(parity_conn, batch):
    rows = parity_conn.execute(
        "SELECT n.ord, pgflow.slug_violations(n.s), pgflow.is_valid_slug(n.s), pg_temp.try_default(n.s), "
        "coalesce(quote_literal(n.s), 'NULL') "
        "FROM unnest(%s::text[]) WITH ORDINALITY AS n (s, ord) ORDER BY n.ord",
        (batch,),
    ).fetchall()
    assert len(rows) == len(batch)
    for slug, (_, reasons, valid, queue, shown) in zip(batch, rows, strict=True):
        expected = naming.slug_violations(slug)
        assert tuple(reasons) == expected, repr(slug)
        assert valid is (not expected), repr(slug)
        derived = naming.default_queue_name(slug)
        if derived.name is not None:
            assert queue == "ok:" + derived.name, repr(slug)
        elif derived.reason == "invalid_flow_slug":
            assert queue == f"PF003:invalid flow slug {shown}: {', '.join(expected)}", repr(slug)
        else:
            assert derived.reason == "queue_name_too_long"
            assert queue.startswith("PF003:") and queue.endswith("its queue name may have at most 47"), repr(slug)


@PARITY
@given(
    routes=st.lists(
        st.tuples(
            st.one_of(valid_slug, valid_slug, names),
            st.one_of(valid_slug, valid_slug, names),
            st.one_of(st.integers(min_value=0, max_value=10_000), st.integers(min_value=-3, max_value=-1), st.none()),
        ),
        min_size=BATCH,
        max_size=BATCH,
    )
)
def test_step_queue_name_agrees_with_python(parity_conn, routes):
    flows, steps, indexes = (list(x) for x in zip(*routes, strict=True))
    rows = parity_conn.execute(
        "SELECT r.ord, pg_temp.try_step(r.f, r.s, r.i) "
        "FROM unnest(%s::text[], %s::text[], %s::integer[]) WITH ORDINALITY AS r (f, s, i, ord) ORDER BY r.ord",
        (flows, steps, indexes),
    ).fetchall()
    messages = {
        "invalid_flow_slug": "PF003:invalid flow slug ",
        "invalid_step_slug": "PF003:invalid step slug ",
        "invalid_step_index": "step_index must be zero or more",
        "queue_name_too_long": "cannot get a private queue",
    }
    for (flow, step, index), (_, got) in zip(routes, rows, strict=True):
        derived = naming.step_queue_name(flow, step, index)
        if derived.name is not None:
            assert got == "ok:" + derived.name, (flow, step, index)
            continue
        assert got.startswith("PF003:"), (flow, step, index, got)
        # SQL derives the flow's default queue first: a valid flow slug longer than 47 characters is
        # refused for that before the step is looked at. Python reports the step's own reason.
        if derived.reason != "invalid_flow_slug" and len(flow) > 47:
            assert got.endswith("its queue name may have at most 47"), (flow, step, index, got)
        elif derived.reason == "invalid_step_index":
            assert got.endswith(messages["invalid_step_index"]), (flow, step, index, got)
        elif derived.reason == "queue_name_too_long":
            assert messages["queue_name_too_long"] in got, (flow, step, index, got)
        else:
            assert got.startswith(messages[derived.reason]), (flow, step, index, got)


def test_step_queue_name_boundaries(rt):
    """Readable name up to 47 characters, then the zero-based index fallback, then refusal."""
    cases = [("f" * 40, "abcde", 3), ("f" * 40, "abcdef", 3), ("OrderFlow", "SendMail", 0), ("f" * 44, "longstep", 12)]
    got = [rt.val("SELECT pgflow.step_queue_name(%s, %s, %s)", c) for c in cases[:3]]
    assert got == ["f" * 40 + "__abcde", "f" * 40 + "__3", "orderflow__sendmail"]
    assert [naming.step_queue_name(*c).name for c in cases[:3]] == got
    with raises_sqlstate("PF003", "cannot get a private queue"):
        rt.val("SELECT pgflow.step_queue_name(%s, %s, %s)", cases[3])
    assert rt.val("SELECT pgflow.default_queue_name('OrderFlow')") == "orderflow"
    # ensure_flow_compiled accepts a shape document built by a protocol-2 worker for a camelCase flow
    assert rt.compile("OrderFlow", _shape("SendMail"))["routes"] == [{"stepSlug": "SendMail", "queueName": "orderflow"}]
    assert rt.val("SELECT queue_name FROM pgflow.steps WHERE flow_slug = 'OrderFlow'") == "orderflow"
